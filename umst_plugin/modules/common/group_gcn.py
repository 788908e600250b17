"""Same-group graph convolution (UMST Eq. 2), shared by UMST and TranSFormer.

A "same-group" graph links every pair of positions that carry the same group id
(the subwords of one word for UMST's A_w and TranSFormer's A_s, the characters
of one word for TranSFormer's A_f). With self loops, Ã = A + I is exactly the
block-diagonal clique matrix ``Ã[i, j] = 1 iff g_i == g_j != 0``; every row of
group g has degree n_g, so

    D^-1/2 Ã D^-1/2 x  at position i  =  (1 / n_g) * sum_{j in g} x_j,

i.e. the mean of the group. We therefore apply the normalised adjacency as a
segment mean (scatter-add + divide + gather) in O(B * L * d) time and memory,
never materialising a B x L x L matrix. The dense matrix is still available
(``normalized_group_adjacency``) for tests and for callers that need it.

Group ids are compact per-token LongTensors, B x L: 0 marks padding, any
positive id names a group *within its own sentence* (ids need not be
contiguous or sorted; equal ids in different sentences never interact).
Padding rows and columns of the adjacency are zero, so padded positions
receive exactly zero from ``group_mean`` and contribute nothing to others.

API (stable; UMST reuses it)
----------------------------
``normalized_group_adjacency(group_ids) -> FloatTensor B x L x L``
    D^-1/2 (A + I) D^-1/2 for the same-group graph, dense (reference / tests).
``group_mean(x, group_ids, time_first=False, num_groups=None) -> Tensor like x``
    D^-1/2 (A + I) D^-1/2 @ x without the dense matrix. ``x`` is B x L x C
    (batch-first) or, with ``time_first=True``, L x B x C (fairseq's layout).
    ``num_groups``: optional int greater than every id (e.g. L + 1 for word ids);
    passing it avoids a device->host sync to read ``group_ids.max()``.
``GroupGCN(embed_dim, dropout=0.0, activation_dropout=0.0, linear=None)``
    Pre-norm residual block of UMST Eq. 2 with the extra left multiplication:

        y = x + Dropout( Â · Dropout_act( ReLU( Â · LN(x) W + b ) ) ),
        Â = D^-1/2 (A + I) D^-1/2.

    ``linear`` optionally injects a shared ``nn.Linear`` (weight sharing ablations).
    ``forward(x, group_ids, time_first=False, num_groups=None)``; padded positions of the output
    equal the input (the GCN adds zero there). Dropouts follow ``self.training``
    (the authors' code leaves them on at inference; we do not).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from umst_plugin.modules.common.segment_ops import segment_mean


def _check_group_ids(group_ids, length, batch):
    if group_ids.dim() != 2 or group_ids.size(0) != batch or group_ids.size(1) != length:
        raise ValueError(
            f"group_ids must be B x L = {batch} x {length} (0 = padding); got shape {tuple(group_ids.shape)}"
        )
    if group_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def normalized_group_adjacency(group_ids, dtype=torch.float32):
    """Dense D^-1/2 (A + I) D^-1/2 of the same-group graph, B x L x L.

    Built with broadcast comparisons on ``group_ids``' device. Padding
    (id 0) rows and columns are zero.
    """
    valid = group_ids > 0
    adj = (group_ids.unsqueeze(2) == group_ids.unsqueeze(1)) & valid.unsqueeze(2) & valid.unsqueeze(1)
    adj = adj.to(dtype)
    deg = adj.sum(-1)  # self loop included, so >= 1 on every real position
    inv_sqrt = torch.where(deg > 0, deg.clamp(min=1).rsqrt(), torch.zeros_like(deg))
    return inv_sqrt.unsqueeze(2) * adj * inv_sqrt.unsqueeze(1)


def group_mean(x, group_ids, time_first=False, num_groups=None):
    """Apply D^-1/2 (A + I) D^-1/2 (same-group graph) to ``x`` as a segment mean.

    x: B x L x C (or L x B x C with ``time_first``); group_ids: B x L, 0 = padding.
    Returns a tensor shaped like ``x``; padded positions are exactly 0.
    Sums accumulate in fp32 so fp16/bf16 inputs do not overflow on long groups.
    """
    if time_first:
        x = x.transpose(0, 1)
    batch, length, channels = x.shape
    _check_group_ids(group_ids, length, batch)
    group_ids = group_ids.long()
    if num_groups is None:
        num_slots = int(group_ids.max().item()) + 1 if group_ids.numel() > 0 else 1
    else:
        num_slots = int(num_groups)
    # Flatten (sentence, group) into one slot index so sentences never share slots.
    slot = group_ids + torch.arange(batch, device=x.device).unsqueeze(1) * num_slots  # B x L
    slot = slot.reshape(-1)
    means = segment_mean(x.reshape(-1, channels), slot, batch * num_slots)
    out = means.index_select(0, slot).view(batch, length, channels)
    out = out.masked_fill((group_ids == 0).unsqueeze(-1), 0.0).to(x.dtype)
    if time_first:
        out = out.transpose(0, 1)
    return out


class GroupGCN(nn.Module):
    """Pre-norm residual same-group GCN block (UMST Eq. 2 plus the left Â).

    y = x + Dropout(Â · Dropout_act(ReLU(Â · LN(x) W + b))). See module docstring.
    """

    def __init__(self, embed_dim, dropout=0.0, activation_dropout=0.0, linear=None):
        super().__init__()
        self.layer_norm = nn.LayerNorm(embed_dim)
        # ``linear``: pass an existing nn.Linear(embed_dim, embed_dim) to share W across blocks or
        # with another GCN (UMST table 6 rows 2-3); None creates this block's own.
        self.linear = nn.Linear(embed_dim, embed_dim) if linear is None else linear
        self.dropout = dropout
        self.activation_dropout = activation_dropout

    def forward(self, x, group_ids, time_first=False, num_groups=None):
        if num_groups is None and group_ids.numel() > 0:
            num_groups = int(group_ids.max().item()) + 1  # once for both products
        h = group_mean(self.layer_norm(x), group_ids, time_first=time_first, num_groups=num_groups)
        h = F.relu(self.linear(h))
        h = F.dropout(h, p=self.activation_dropout, training=self.training)
        h = group_mean(h, group_ids, time_first=time_first, num_groups=num_groups)
        return x + F.dropout(h, p=self.dropout, training=self.training)
