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

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward
from umst_plugin.modules.common.attention import attention
from umst_plugin.modules.common.lean_ops import layer_norm_backward
from umst_plugin.modules.common.segment_ops import accumulation_dtype, upcast_half
from umst_plugin.modules.common.tracing import compiling
from umst_plugin.modules.transformer_sf import lean


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

    def forward_lean(self, x, layer_norm, side):
        """``forward(layer_norm(x), ...)`` with the encoder's plan (``lean.py``): the boundary band computed once
        per forward (``side["fast_band"]``), the three input maps as one product, the additive key mask; with
        relative positions the layer norm, the input maps and the core are one autograd function
        (:class:`BoundaryRelativeAttention`) that keeps x, not the normalised x nor q, k, v."""
        length, batch, _ = x.shape
        heads, head_dim = self.num_heads, self.head_dim
        dropout = self.dropout if self.training else 0.0
        if self.rel_keys is None:
            weight, bias = lean.fused_weights(self.q_proj, self.k_proj, self.v_proj)
            qkv = lean.layer_norm_linear(layer_norm, x, weight, bias).view(length, batch, 3, heads, head_dim)
            q, k, v = qkv.permute(2, 1, 3, 0, 4).unbind(0)
            out = attention(q, k, v, side["fast_mask"], dropout, scale=self.scaling)
        else:
            cols, valid = side["fast_band"]
            # weights cast whole before the function (lean.amp_cast); the biases stay float32 (fp32 gradients)
            weight = torch.cat([lean.amp_cast(p.weight) for p in (self.q_proj, self.k_proj, self.v_proj)])
            bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            out = BoundaryRelativeAttention.apply(x.reshape(-1, x.size(-1)), layer_norm.weight, layer_norm.bias,
                                                  layer_norm.eps, weight, bias, lean.amp_cast(self.rel_keys),
                                                  lean.amp_cast(self.rel_values), cols, valid,
                                                  side["fast_padding_mask"], heads, self.scaling, dropout)
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


def _scaled(a, b, scale):
    """``scale * (a @ b)`` (2-d or batched 3-d). Eager: one product with the scale in its epilogue (``baddbmm`` /
    ``addmm`` with beta 0 on an unread scalar). Compiled: ``a`` scaled, then the product; inductor fuses the scaling
    into the kernel that makes ``a``, where the epilogue form would cost a GPU two kernels of its own (the scalar's
    fill and its expansion to the output's shape). Scaled before the product, as fairseq scales q, so a half
    product has the epilogue form's range (an unscaled q k^T overflows fp16 where the scaled one does not). The
    same function: only the rounding of half inputs differs."""
    if compiling():
        return torch.matmul(a * scale, b)
    if a.dim() == 3:
        return torch.baddbmm(a.new_empty(()), a, b, beta=0.0, alpha=scale)
    return torch.addmm(a.new_empty(()), a, b, beta=0.0, alpha=scale)


def _scaled_right(a, b, scale):
    """``scale * (a @ b)`` like :func:`_scaled`, but compiled it scales ``b``: for the logits' gradient (B*H x L x L)
    times q or k (B*H x L x d) the scaled operand is then the small one, and the L x L gradient is read by both
    products as it is (scaling it made two more L x L copies, one per product)."""
    if compiling():
        return torch.matmul(a, b * scale)
    return _scaled(a, b, scale)


def add_band(full, band, band_cols=None, gather=None):
    """``full`` (B x H x L x L) plus the band terms ``band`` (B x H x L x (2k+1)) on its 2k+1 diagonals:
    ``full[..., i, cols[i, d]] += band[..., i, d]``, where ``band_cols`` (B x H x L x (2k+1)) names the columns,
    i + d - k clamped into [0, L - 1] (:func:`boundary_band`; ``band`` is zero where the pair is invalid, so a
    clamped column gets nothing).

    Eager (``gather`` False): ``scatter_add_`` into ``full`` in place. Compiled (the default under torch.compile):
    ``full + where(|j - i| <= k, band[i, j - i + k], 0)``, an element-wise sum whose band entry is read by index,
    which inductor fuses into the kernel that reads ``full`` next (the softmax, the dropout's backward), where a
    scatter first wrote the sum as an L x L float32 tensor of its own and the next kernel read it back (on a
    simulated H200, with :func:`_scaled_right` in backward, TranSFormer's compiled layers moved 13.2 GB per update
    of 4,096 tokens of WMT14's lengths instead of 13.9). Both add each
    band entry once, to the same element: the same values. (A sum of 2k + 1 broadcast terms instead of the indexed
    read moved more: 0.5 GB and 30 kernels more per update.)"""
    if gather is None:
        gather = compiling()
    width = band.size(-1)
    if not gather:
        return full.scatter_add_(-1, band_cols, band)
    k = (width - 1) // 2
    length = full.size(-1)
    position = torch.arange(length, device=full.device)
    offset = position.view(1, -1) - position.view(-1, 1)  # j - i, L x L
    index = (offset + k).clamp(0, width - 1).expand(*band.shape[:-1], length)
    return full + torch.where(offset.abs() <= k, band.gather(-1, index), band.new_zeros(()))


class BoundaryRelativeAttention(torch.autograd.Function):
    """The layer norm, the input maps and ``_relative_core`` as one autograd function: for time-first rows
    ``x`` (L*B x C) and q, k, v = split(LN(x) W^T + b) (unscaled, B x H x L x d),

        w = Drop(softmax(s q k^T + band(s q a^K^T) + mask)),   out = w v + band^T(w) a^V   (B x H x L x d)

    where band() scatters the B x H x L x (2k+1) relative terms into the logits' diagonals (``valid`` ones only)
    and band^T() gathers them back. Keeps x, the layer norm's statistics and the 1-byte dropout mask: backward
    recomputes the layer norm, the input maps and the softmax (three products and a few elementwise ops; no
    B x H x L x L float tensor is kept, as with the reference's checkpoint, nor the normalised x or q, k, v) and
    runs only the products the gradients need. Matrix products follow autocast (``amp_functions``); the
    softmax and the relative terms run in fp32 for fp16/bf16 inputs, as in the reference."""

    @staticmethod
    def _inputs(x, ln_weight, ln_bias, eps, weight, bias, heads, length):
        channels = x.size(-1)
        normed, mean, rstd = torch.native_layer_norm(x, (channels,), ln_weight, ln_bias, eps)
        batch = x.size(0) // length
        qkv = F.linear(normed, weight, bias).view(length, batch, 3, heads, channels // heads)
        return normed, mean, rstd, qkv.permute(2, 1, 3, 0, 4).contiguous()  # 3 x B x H x L x d

    @staticmethod
    def _probs(q3, k3, q_flat, rel_keys, band_cols, valid, key_padding_mask, scale, heads):
        batch, length = key_padding_mask.shape  # (not band_cols.shape, whose last size is 2k + 1: see forward)
        logits = upcast_half(_scaled(q3, k3.transpose(1, 2), scale))
        rel = upcast_half(_scaled(q_flat, rel_keys.t(), scale))
        rel = rel.view(batch, heads, length, -1).mul_(valid.unsqueeze(1))
        logits = add_band(logits.view(batch, heads, length, length), rel, band_cols)
        logits.masked_fill_(key_padding_mask.view(batch, 1, 1, length), float("-inf"))
        return torch.softmax(logits, dim=-1)

    @staticmethod
    @amp_forward
    def forward(ctx, x, ln_weight, ln_bias, eps, weight, bias, rel_keys, rel_values, cols, valid,
                key_padding_mask, heads, scale, dropout):
        batch, length = key_padding_mask.shape
        _, mean, rstd, qkv = BoundaryRelativeAttention._inputs(x, ln_weight, ln_bias, eps, weight, bias, heads,
                                                                length)
        head_dim = qkv.size(-1)
        q3, k3, v3 = qkv.view(3, batch * heads, length, head_dim).unbind(0)
        band_cols = cols.unsqueeze(1).expand(-1, heads, -1, -1)
        probs = BoundaryRelativeAttention._probs(q3, k3, q3.reshape(-1, head_dim), rel_keys, band_cols, valid,
                                                 key_padding_mask, scale, heads)
        mask = None
        if dropout > 0:
            probs, mask = torch.native_dropout(probs, dropout, True)
        out = torch.bmm(probs.view(batch * heads, length, length).to(v3.dtype), v3)
        band = torch.gather(probs, -1, band_cols).mul_(valid.unsqueeze(1))
        # 2k + 1 read from the tables (a parameter's static size), not from ``band``: under torch.compile with
        # dynamic shapes band's last size is a symbol of the input ``cols`` that the products then fix to 2k + 1,
        # and torch 2.11's dynamo fails on a size computed in an autograd function's forward that is a symbol
        # when traced and a constant when replayed (an AssertionError in overwrite_tensor_vt_proxy; the layer
        # then ran eager on the H200's torch 2.11). torch 2.13 compiles either.
        out = torch.addmm(out.view(-1, head_dim), band.view(-1, rel_values.size(0)).to(v3.dtype), rel_values)
        ctx.save_for_backward(x, ln_weight, ln_bias, weight, bias, mean, rstd, rel_keys, rel_values, cols, valid,
                              key_padding_mask, mask)
        ctx.eps, ctx.heads, ctx.scale, ctx.dropout = eps, heads, scale, dropout
        return out.view(batch, heads, length, head_dim)

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        (x, ln_weight, ln_bias, weight, bias, mean, rstd, rel_keys, rel_values, cols, valid, key_padding_mask,
         mask) = ctx.saved_tensors
        scale, heads, need = ctx.scale, ctx.heads, ctx.needs_input_grad
        batch, length = key_padding_mask.shape
        normed, _, _, qkv = BoundaryRelativeAttention._inputs(x, ln_weight, ln_bias, ctx.eps, weight, bias, heads,
                                                               length)  # recomputed
        head_dim = qkv.size(-1)
        bh = batch * heads
        q3, k3, v3 = qkv.view(3, bh, length, head_dim).unbind(0)
        q_flat = q3.reshape(-1, head_dim)
        band_cols = cols.unsqueeze(1).expand(-1, heads, -1, -1)
        valid_h = valid.unsqueeze(1)
        probs = BoundaryRelativeAttention._probs(q3, k3, q_flat, rel_keys, band_cols, valid, key_padding_mask,
                                                 scale, heads)  # recomputed
        keep_scale = 1.0 / (1.0 - ctx.dropout) if mask is not None else 1.0
        dropped = probs if mask is None else torch.ops.aten.native_dropout_backward(probs, mask, keep_scale)
        grad3 = grad.contiguous().view(bh, length, head_dim)
        grad_flat = grad3.view(-1, head_dim)
        # out = w v + band^T(w) a^V
        grad_v = torch.bmm(dropped.view(bh, length, length).transpose(1, 2).to(grad.dtype), grad3)
        grad_rel_values = None
        if need[7]:
            band = torch.gather(dropped, -1, band_cols).mul_(valid_h)
            grad_rel_values = torch.mm(band.view(-1, rel_values.size(0)).t().to(grad.dtype), grad_flat)
        grad_w = upcast_half(torch.bmm(grad3, v3.transpose(1, 2))).view(batch, heads, length, length)
        grad_band = upcast_half(torch.mm(grad_flat, rel_values.t())).view(batch, heads, length, -1).mul_(valid_h)
        grad_w = add_band(grad_w, grad_band, band_cols)
        if mask is not None:
            grad_w = torch.ops.aten.native_dropout_backward(grad_w, mask, keep_scale)
        grad_logits = torch._softmax_backward_data(grad_w, probs, -1, probs.dtype)
        # logits = s q k^T + band(s q a^K^T)
        grad_rel = torch.gather(grad_logits, -1, band_cols).mul_(valid_h).view(-1, rel_keys.size(0))
        grad_logits3 = grad_logits.view(bh, length, length).to(q3.dtype)
        grad_q = _scaled_right(grad_logits3, k3, scale).view(-1, head_dim).addmm_(
            grad_rel.to(q3.dtype), rel_keys.to(q3.dtype), alpha=scale)
        grad_k = _scaled_right(grad_logits3.transpose(1, 2), q3, scale)
        grad_rel_keys = _scaled(grad_rel.t().to(q_flat.dtype), q_flat, scale) if need[6] else None
        # the input maps and the layer norm
        grad_qkv = torch.stack([grad_q.view(bh, length, head_dim), grad_k, grad_v.to(grad_k.dtype)])
        grad_qkv = grad_qkv.view(3, batch, heads, length, head_dim).permute(3, 1, 0, 2, 4).reshape(
            length * batch, -1)
        grad_weight = grad_qkv.t().mm(normed) if need[4] else None
        grad_bias = grad_qkv.sum(0, dtype=accumulation_dtype(grad_qkv.dtype)) if need[5] else None
        grad_x, grad_ln_weight, grad_ln_bias = layer_norm_backward(
            grad_qkv.mm(weight), x, mean, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        return (grad_x, grad_ln_weight, grad_ln_bias, None, grad_weight, grad_bias, grad_rel_keys, grad_rel_values,
                None, None, None, None, None, None)
