"""Pieces shared by several families: fused attention, autocast-aware autograd functions, segment reductions."""
