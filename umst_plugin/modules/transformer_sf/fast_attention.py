"""Fast-branch self-attention with boundary-wise relative positions (TranSFormer 3.2, fig. 4b).

Shaw et al. (2018) add learned relative-position vectors to the keys and values:

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d_h),   o_i = sum_j softmax(e)_ij (v_j + a^V_ij).

Vanilla RPR uses a^{K,V}_{clip(j - i, -k, k)} for every pair. The paper's
boundary-wise variant restricts the window to the characters *of the same word*
and masks positions beyond k (k = 3): a_ij exists only when i and j share an A_f
group and |j - i| <= k; for every other pair the relative term is absent (zero),
the pair itself stays visible to content attention. The relative tables have
2k + 1 rows of size d_h, shared across heads.

Efficiency: only a band of 2k + 1 diagonals can carry a relative term, so the
key term is computed as ``q @ a^K^T`` (B x H x L x (2k+1)) and scattered into
the logits' band, and the value term gathers the band of the attention weights
(B x H x L x (2k+1)) and multiplies by a^V; no L x L x d_h tensor is built.
The value term needs the attention weights themselves, so with relative positions
the map is explicit; in training its core (logits, softmax, dropout, the two
products) is recomputed in backward (``torch.utils.checkpoint``, the same dropout
mask) instead of keeping the B x H x L x L logits and weights of the character
sequence, which is 5-6 times longer than the subwords (``recompute=False`` keeps
them). Without relative positions the attention is fused
(``modules.attention.attention``). Tensors are time-first (L x B x C) like fairseq's.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from umst_plugin.modules.common.attention import attention
from umst_plugin.modules.common.segment_ops import upcast_half


def boundary_band(groups, max_distance, use_boundary=True):
    """Band indices and validity for relative offsets d = -k..k.

    groups: B x L A_f group ids (0 = padding). Returns (cols, valid):
    cols  B x L x (2k+1) long, the key column i + d clamped into [0, L-1];
    valid B x L x (2k+1) bool, True when the pair (i, i + d) gets a relative
    term: in range, both real, and (with ``use_boundary``) in the same group.
    """
    batch, length = groups.shape
    offsets = torch.arange(-max_distance, max_distance + 1, device=groups.device)
    cols = torch.arange(length, device=groups.device).view(-1, 1) + offsets.view(1, -1)  # L x (2k+1)
    in_range = (cols >= 0) & (cols < length)
    cols = cols.clamp(0, max(length - 1, 0)).unsqueeze(0).expand(batch, -1, -1)
    key_groups = torch.gather(groups, 1, cols.reshape(batch, -1)).view(batch, length, -1)
    query_groups = groups.unsqueeze(-1)
    valid = in_range.unsqueeze(0) & (query_groups > 0) & (key_groups > 0)
    if use_boundary:
        valid = valid & (key_groups == query_groups)
    return cols, valid


class BoundaryRelativeSelfAttention(nn.Module):
    """Multi-head self-attention with optional boundary-wise relative positions.

    forward(x [L x B x C], key_padding_mask [B x L] bool, groups [B x L]) -> L x B x C.
    ``max_distance=0`` disables the relative term (plain self-attention).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, max_distance=3, recompute=True):
        super().__init__()
        self.recompute = recompute
        if embed_dim % num_heads != 0:
            raise ValueError(f"fast embed dim {embed_dim} is not divisible by its {num_heads} heads")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.dropout = dropout
        self.max_distance = max_distance
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        if max_distance > 0:
            self.rel_keys = nn.Parameter(torch.empty(2 * max_distance + 1, self.head_dim))
            self.rel_values = nn.Parameter(torch.empty(2 * max_distance + 1, self.head_dim))
        else:
            self.register_parameter("rel_keys", None)
            self.register_parameter("rel_values", None)
        self.reset_parameters()

    def reset_parameters(self):
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))  # fairseq's MHA init
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.constant_(self.out_proj.bias, 0.0)
        if self.rel_keys is not None:
            nn.init.normal_(self.rel_keys, std=self.head_dim ** -0.5)
            nn.init.normal_(self.rel_values, std=self.head_dim ** -0.5)

    def forward(self, x, key_padding_mask, groups, use_boundary=True):
        length, batch, _ = x.shape
        heads, head_dim = self.num_heads, self.head_dim

        def split(t):  # L x B x C -> B x H x L x d
            return t.view(length, batch, heads, head_dim).permute(1, 2, 0, 3)

        q = split(self.q_proj(x)) * self.scaling
        k = split(self.k_proj(x))
        v = split(self.v_proj(x))
        dropout = self.dropout if self.training else 0.0
        if self.rel_keys is None:
            out = attention(q, k, v, (~key_padding_mask).view(batch, 1, 1, length), dropout, scale=1.0)
        else:
            cols, valid = boundary_band(groups, self.max_distance, use_boundary)
            if self.recompute and self.training and torch.is_grad_enabled():
                out = checkpoint(self._relative_core, q, k, v, key_padding_mask, cols, valid, dropout,
                                 use_reentrant=False)
            else:
                out = self._relative_core(q, k, v, key_padding_mask, cols, valid, dropout)
        out = out.permute(2, 0, 1, 3).reshape(length, batch, self.embed_dim)
        return self.out_proj(out)

    def _relative_core(self, q, k, v, key_padding_mask, cols, valid, dropout):
        """softmax(q (k + a^K)^T) (v + a^V) over the boundary band (module docstring); q is scaled."""
        batch, heads, length, _ = q.shape
        logits = upcast_half(torch.matmul(q, k.transpose(-1, -2)))  # B x H x L x L, fp32 softmax like fairseq
        # In-place updates of the fresh logits avoid two extra L x L copies (autograd-safe:
        # matmul's backward does not need its output).
        rel = upcast_half(torch.matmul(q, self.rel_keys.t())) * valid.unsqueeze(1)  # B x H x L x (2k+1)
        band_cols = cols.unsqueeze(1).expand(-1, heads, -1, -1)
        logits.scatter_add_(-1, band_cols, rel)
        logits.masked_fill_(key_padding_mask.view(batch, 1, 1, length), float("-inf"))
        weights = F.dropout(F.softmax(logits, dim=-1), p=dropout, training=dropout > 0)
        out = torch.matmul(weights.to(v.dtype), v)
        band_weights = torch.gather(weights, -1, band_cols) * valid.unsqueeze(1)
        return out + torch.matmul(band_weights.to(v.dtype), self.rel_values)
