"""Pieces shared by several families: fused attention, autocast-aware autograd functions, segment reductions, the
same-group GCN (UMST's word GCN, TranSFormer's subword and character GCNs) and what the lean paths share
(``lean_ops``: dropout and LayerNorm pieces of hand-written backward passes, the switch to the reference path)."""
