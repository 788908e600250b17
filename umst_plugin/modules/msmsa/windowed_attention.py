"""Multi-scale multi-head self-attention (MSMSA, Guo et al., AAAI 2020), plain PyTorch.

Every head attends only to a window of keys centred on its query (Eq. 6-7). The
window of a head is its *scale* ``w``: an odd number of tokens, so the query at
sentence position ``j`` sees positions ``j - h .. j + h`` with half-width
``h = (w - 1) / 2``. Scale 1 is the token alone (the paper's remark that the FFN
is "a self-attention with scale 1" fixes this reading; Eq. 7 written literally,
``[x_{j-w} .. x_{j+w}]``, would make every window odd already and the paper's
"we force the scale size to be an odd number" meaningless).

Scales are either fixed (``1``, ``3``, ...) or relative to the sentence's *own*
length ``n`` (``N/16``, ``N/8``, ...; ``n`` counts the sentence's non-padding
tokens, its final ``</s>`` included). A relative scale ``N/k`` is made odd by
giving the window ``floor(n / (2k))`` tokens on each side, i.e. width
``2 * floor(n / (2k)) + 1``: the odd width whose reach on each side is the
largest that does not exceed ``n / (2k)``. ``global`` is a head without a window.

Causal (decoder) heads see the left half of the same window, ``j - h .. j``;
for relative scales ``n`` is then the prefix length ``j + 1`` (the only length
known while decoding), so incremental decoding equals full decoding.

Cost. A batch padded to at most ``dense_max_len`` tokens (default 256, ``--msmsa-dense-max-len``) runs every
head of a layer in *one* call of torch's fused ``scaled_dot_product_attention``, each head restricted to its
window by one additive ``B x H x T x T`` bias. The biases of all layers of an encoder (decoder) stack depend only
on the padding mask, the length and the scales: the first layer builds them all at once (``window_bias.py``,
about ten kernels for the whole stack, no host sync) and the others take their heads as views. A layer then
launches what fairseq's attention launches; the bias costs ``B x H x T x T`` elements per layer, kept for
backward by the fused kernel.

Longer batches (and incremental decoding) go one call per group of heads sharing a scale, as
:func:`windowed_attention`: a group whose window is small against the sequence is computed *banded*: queries
are cut into blocks of ``b = max(h, min_block)`` positions and each block attends only to the ``b + 2h`` keys
around it, read as overlapping windows of one padded key buffer (an ``unfold`` view, no per-window copies), so
time and memory are O(N x (b + 2h)) = O(N x 3h) instead of O(N^2). In training the window bias and the
group's attention output are rebuilt in backward (checkpointed) rather than kept. Fixed scale-1 heads skip
attention (softmax over one key is 1: the output is the value). A group whose window reaches across the
sequence (b + 2h >= N) and incremental decoding use the dense path: scores against all (resp. the last h + 1)
keys restricted by a window bias. Both ways give the same values at every real position (tested).

Masking. A query sees a key iff it lies in its window and is not padding. Pads
are contiguous at one end of a row (fairseq pads left or right), so position
differences inside a row are differences of sentence positions and padding on
either side gives the same windows. Keys outside the window get -inf; padding
(and out-of-sequence) keys get a large finite negative, so a padding query
whose window holds only padding still has a finite softmax (its own position is
always in its window) while real queries give padding exactly zero weight: no
NaN in fp16/bf16 on padded rows.
"""
import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from umst_plugin.modules.common.attention import additive_mask, attention
from umst_plugin.modules.common.tracing import compiling
from umst_plugin.modules.msmsa.window_bias import WindowMasks, half_width_constants, window_bias

DEFAULT_SCALES = "1,3,N/16,N/8,N/4"
# longest (padded) sequence computed in one fused call with a dense window bias; longer ones go banded
DEFAULT_DENSE_MAX_LEN = 256


@dataclass(frozen=True)
class Scale:
    """One attention scale: ``fixed`` (odd width in tokens), ``relative`` (width ``n / value``) or ``global``."""

    kind: str
    value: int = 0

    def __post_init__(self):
        if self.kind == "fixed" and (self.value < 1 or self.value % 2 == 0):
            raise ValueError(f"fixed attention scales must be odd and >= 1 (the paper forces odd sizes), got {self.value}")
        if self.kind == "relative" and self.value < 1:
            raise ValueError(f"relative scale N/k needs an integer k >= 1, got k={self.value}")
        if self.kind not in ("fixed", "relative", "global"):
            raise ValueError(f"unknown scale kind {self.kind!r}")

    def __str__(self):
        if self.kind == "fixed":
            return str(self.value)
        if self.kind == "relative":
            return "N" if self.value == 1 else f"N/{self.value}"
        return "global"

    def max_half_width(self, max_length: int) -> int:
        """Largest half-width this scale can take in a row of at most ``max_length`` tokens (no device sync)."""
        if self.kind == "fixed":
            return (self.value - 1) // 2
        if self.kind == "relative":
            return max_length // (2 * self.value)
        return max_length

    def half_width(self, lengths: Tensor) -> Tensor:
        """Half-width for sentences (or prefixes) of the given lengths (LongTensor, any shape)."""
        if self.kind == "fixed":
            return torch.full_like(lengths, (self.value - 1) // 2)
        if self.kind == "relative":
            return torch.div(lengths, 2 * self.value, rounding_mode="floor")
        return torch.full_like(lengths, torch.iinfo(torch.int32).max)


def parse_scale(token: str) -> Scale:
    token = token.strip()
    if re.fullmatch(r"\d+", token):
        return Scale("fixed", int(token))
    match = re.fullmatch(r"[Nn](?:\s*/\s*(\d+))?", token)
    if match:
        return Scale("relative", int(match.group(1) or 1))
    if token.lower() in ("global", "inf"):
        return Scale("global")
    raise ValueError(f"cannot parse attention scale {token!r}: use an odd integer (3), N/<int> (N/16), N, or global")


def parse_scales(spec: str) -> List[Scale]:
    scales = [parse_scale(t) for t in spec.split(",") if t.strip()]
    if not scales:
        raise ValueError("empty scale list")
    if len(set(scales)) != len(scales):
        raise ValueError(f"duplicate scales in {spec!r}")
    return scales


def cumulative_ceil_round(shares: Sequence[float], total: int) -> List[int]:
    """Turn fractional shares (summing to ``total``) into whole counts summing to ``total``.

    Head ``k`` gets ``ceil(C_k) - ceil(C_{k-1})`` with ``C_k`` the running sum of the
    shares, smallest scale first: every prefix of small scales is rounded up, so
    the rounding favours local heads. This is the rule that reproduces the
    paper's worked example (plain, floor and largest-remainder rounding do not).
    """
    counts, prev, running = [], 0, 0.0
    for share in shares:
        running += share
        bound = min(total, math.ceil(running - 1e-6))  # tolerance: 2.0000000001 must stay 2
        counts.append(bound - prev)
        prev = bound
    counts[-1] += total - prev
    return counts


def alpha_head_allocation(num_heads: int, num_scales: int, num_layers: int, alpha: float) -> List[List[int]]:
    """Heads per scale for every layer (Eq. 11-12), scales ordered from smallest to largest.

    ``z^l_k = (|Omega| - k) * alpha / l`` for ``l < L`` (one step of ``alpha / l``
    per scale, the smallest scale highest) and ``z^L = 0`` (uniform top layer);
    ``n^l = softmax(z^l) * N'`` rounded with :func:`cumulative_ceil_round`. The
    paper writes the step as ``alpha / T`` without defining ``T``; ``T = l`` is
    the reading that reproduces its example (alpha 0.5, 10 heads, 3 layers:
    {5,2,2,1,0}, {4,2,2,1,1}, {2,2,2,2,2}).
    """
    allocation = []
    for layer in range(1, num_layers + 1):
        step = 0.0 if layer == num_layers else alpha / layer
        logits = [(num_scales - 1 - k) * step for k in range(num_scales)]
        top = max(logits)
        exps = [math.exp(z - top) for z in logits]
        shares = [e / sum(exps) * num_heads for e in exps]
        allocation.append(cumulative_ceil_round(shares, num_heads))
    return allocation


def parse_head_allocation(spec: str, num_scales: int, num_heads: int, num_layers: int) -> List[List[int]]:
    """``"5,2,2,1,0;4,2,2,1,1;2,2,2,2,2"``: heads per scale, one group per layer (one group = every layer)."""
    layers = [[int(c) for c in group.split(",")] for group in spec.split(";") if group.strip()]
    if len(layers) == 1:
        layers = layers * num_layers
    if len(layers) != num_layers:
        raise ValueError(f"head allocation {spec!r} has {len(layers)} layers, the stack has {num_layers}")
    for counts in layers:
        if len(counts) != num_scales or sum(counts) != num_heads or min(counts) < 0:
            raise ValueError(
                f"head allocation {counts} must give a non-negative count for each of the {num_scales} scales "
                f"summing to {num_heads} heads")
    return layers


def heads_from_counts(scales: Sequence[Scale], counts: Sequence[int]) -> List[Scale]:
    return [scale for scale, count in zip(scales, counts) for _ in range(count)]


def _token_positions(key_padding_mask: Optional[Tensor], batch: int, length: int, device) -> Tuple[Tensor, Tensor]:
    """(position of each key inside its sentence (B x T), sentence length (B x 1))."""
    if key_padding_mask is None:
        positions = torch.arange(length, device=device).unsqueeze(0).expand(batch, length)
        return positions, torch.full((batch, 1), length, device=device, dtype=torch.long)
    real = (~key_padding_mask).long()
    return real.cumsum(1) - 1, real.sum(1, keepdim=True)


def windowed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: Scale,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    training: bool = False,
    need_weights: bool = False,
    min_block: int = 16,
    block_factor: float = 1.0,
    recompute: bool = True,
    self_shortcut: bool = True,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention of heads that share one scale.

    q: B x G x Tq x D (already scaled), k/v: B x G x Tk x D, the queries being
    the last Tq keys (Tq < Tk only in incremental decoding). key_padding_mask:
    B x Tk, True at padding. Returns the output as Tq x B x G x D (fairseq's
    time-first order, ready to be concatenated over head groups) and, if asked,
    the attention weights B x G x Tq x Tk.
    """
    batch, groups, tgt_len, _ = q.shape
    src_len = k.size(2)
    query_offset = src_len - tgt_len
    if query_offset < 0:
        raise ValueError(f"windowed self-attention needs at least as many keys ({src_len}) as queries ({tgt_len})")
    hmax = scale.max_half_width(src_len)
    if hmax == 0 and scale.kind == "fixed" and self_shortcut:
        # scale 1: every window is the query alone, softmax over one key is 1 and the output is its value.
        # (Only for fixed scales: a relative head that is 1 wide on a short batch still goes through q and k,
        # so their projections get a (zero) gradient every step, as DDP without unused-parameter search needs.)
        return _self_only(v[:, :, query_offset:], dropout_p, training, need_weights, query_offset)
    if scale.kind == "fixed":
        half = hmax  # a Python int keeps the band mask free of batch dimensions
    elif scale.kind == "global":
        half = src_len
    else:
        positions, lengths = _token_positions(key_padding_mask, batch, src_len, q.device)
        # causal: window of the prefix ending at the query (B x Tq); else of the whole sentence (B x 1)
        half = scale.half_width(positions[:, query_offset:] + 1 if causal else lengths)
    key_valid = None if key_padding_mask is None else ~key_padding_mask
    reach_right = 0 if causal else hmax
    block = max(min_block, int(block_factor * hmax))
    if tgt_len == src_len and block + hmax + reach_right < src_len:
        return _blocked(q, k, v, half, hmax, reach_right, block, causal, key_valid, dropout_p, training, need_weights,
                        recompute)
    # Dense path; in incremental decoding only the keys a window can reach are sliced out.
    start = max(0, query_offset - hmax) if causal else 0
    if start > 0:
        k, v = k[:, :, start:], v[:, :, start:]
        key_valid = None if key_valid is None else key_valid[:, start:]
    out, weights = _dense(q, k, v, half, causal, key_valid, query_offset - start, dropout_p, training, need_weights)
    if weights is not None and start > 0:
        weights = F.pad(weights, (start, 0))
    return out.permute(2, 0, 1, 3), weights


def _self_only(v, dropout_p, training, need_weights, query_offset):
    """Scale 1: output = value (attention dropout, if any, drops the single weight of a query)."""
    batch, groups, length, _ = v.shape
    weight = v.new_ones(batch, groups, length, 1)
    if training and dropout_p > 0:
        weight = F.dropout(weight, p=dropout_p, training=True)
        v = v * weight
    weights = None
    if need_weights:
        weights = torch.diag_embed(weight[..., 0])
        weights = F.pad(weights, (query_offset, 0))
    return v.permute(2, 0, 1, 3), weights


def _window_bias(offset: Tensor, half, causal: bool, key_valid: Optional[Tensor], dtype) -> Tensor:
    """Additive attention mask from key-minus-query offsets: -inf outside the window; a large finite
    negative at padding/out-of-range keys, so that a padding query whose window holds only padding still
    has a finite softmax (the query itself is always in its window) while real queries give padding exactly
    zero weight. ``half`` is an int or a tensor broadcasting to offset."""
    band = (offset >= -half) & (offset <= (0 if causal else half))
    bias = additive_mask(~band, dtype)
    if key_valid is not None:
        pad_value = -1e4 if dtype == torch.float16 else -1e9
        bias = bias + torch.zeros(key_valid.shape, dtype=dtype, device=offset.device).masked_fill_(~key_valid, pad_value)
    return bias


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float, training: bool,
            need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """softmax(q k^T + bias) v. Without weights to return this is torch's fused
    scaled_dot_product_attention (no score matrix is stored for backward); ``q`` is already scaled."""
    if not need_weights:
        out = attention(q, k, v, bias, dropout_p if training else 0.0, scale=1.0)
        return out, None
    scores = q @ k.transpose(-1, -2) + bias
    # fp16/bf16 scores are normalised in fp32 (as fairseq does)
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).type_as(scores)
    probs = F.dropout(probs, p=dropout_p, training=training)
    return probs @ v, probs


def _dense(q, k, v, half, causal, key_valid, query_offset, dropout_p, training, need_weights):
    tgt_len, src_len = q.size(2), k.size(2)
    device = q.device
    offset = torch.arange(src_len, device=device)[None, :] - (query_offset + torch.arange(tgt_len, device=device))[:, None]
    if isinstance(half, Tensor):  # B x 1 (per sentence) or B x Tq (per query)
        half = half[:, None, :, None]
    kv = None if key_valid is None else key_valid[:, None, None, :]
    bias = _window_bias(offset, half, causal, kv, q.dtype)
    if bias.dim() == 2:
        bias = bias[None, None]
    return _attend(q, k, v, bias, dropout_p, training, need_weights)


def _blocked(q, k, v, half, reach_left, reach_right, block, causal, key_valid, dropout_p, training, need_weights,
             recompute=True):
    """Blocked band attention: query block i attends to the ``b + L + R`` keys around it.

    Each batch row is laid out in a buffer of ``S = nb * b`` positions (nb = query blocks plus enough
    spare blocks to hold the ``L + R`` positions of key padding), rows back to back. Query block i of row
    n is then buffer block ``n * nb + i``, and its key window is the ``span = b + L + R`` buffer positions
    starting there: ``unfold`` over the flat buffer gives every window at once as an overlapping
    strided *view* (no copy of the keys per window), laid out (B*nb) x G x span x D, which torch's fused
    attention reads directly. The spare blocks' queries (windows reaching into the next row) are
    computed and discarded: (L + R) / T extra work. The window bias (B*nb) x 1 x b x span broadcasts
    over the heads.
    """
    batch, groups, length, dim = q.shape
    reach = reach_left + reach_right
    span = block + reach
    n_blocks = -(-length // block) + -(-reach // block)
    row = n_blocks * block  # S >= L + T + R
    device = q.device

    def buffer(x, lead, tail):  # B x G x T x D -> flat (B*S + tail) x G x D, row n holds x[n] at lead..lead+T
        flat = x.new_zeros(batch * row + tail, groups, dim)
        flat[:batch * row].view(batch, row, groups, dim)[:, lead:lead + length] = x.permute(0, 2, 1, 3)
        return flat

    q_blocks = buffer(q, 0, 0).view(batch * n_blocks, block, groups, dim).transpose(1, 2)
    k_windows = buffer(k, reach_left, reach).unfold(0, span, block).permute(0, 1, 3, 2)
    v_windows = buffer(v, reach_left, reach).unfold(0, span, block).permute(0, 1, 3, 2)

    valid = torch.ones(batch, length, dtype=torch.bool, device=device) if key_valid is None else key_valid
    valid = F.pad(valid, (reach_left, row - reach_left - length), value=False).reshape(-1)
    valid = F.pad(valid, (0, reach), value=False).unfold(0, span, block)[:, None, None, :]  # B*nb x 1 x 1 x span
    # column c of a window is buffer position i*b + c, i.e. key i*b + c - L; row r is query i*b + r
    offset = torch.arange(span, device=device)[None, :] - reach_left - torch.arange(block, device=device)[:, None]
    if isinstance(half, Tensor):
        if half.size(1) == 1:  # per sentence
            half = half.repeat_interleave(n_blocks, dim=0)[:, :, None, None]
        else:  # per query (causal relative scales)
            half = F.pad(half, (0, row - length)).view(batch * n_blocks, 1, block, 1)

    def attend(q_blocks, k_windows, v_windows, valid, half):
        bias = _window_bias(offset, half, causal, valid, q.dtype)
        return _attend(q_blocks, k_windows, v_windows, bias, dropout_p, training, need_weights)

    if need_weights or not (recompute and torch.is_grad_enabled()
                            and (q.requires_grad or k.requires_grad or v.requires_grad)):
        out, probs = attend(q_blocks, k_windows, v_windows, valid, half)
    else:
        # Backward rebuilds the window bias and this group's attention output (as fused attention
        # rebuilds its scores) instead of keeping them: only the q/k/v buffers stay alive between
        # forward and backward.
        out, probs = checkpoint(attend, q_blocks, k_windows, v_windows, valid, half, use_reentrant=False)
    out = out.reshape(batch, n_blocks, groups, block, dim).permute(1, 3, 0, 2, 4).reshape(row, batch, groups, dim)
    weights = None
    if need_weights:  # scatter the bands back to a dense matrix (inspection only)
        rows = probs.reshape(batch, n_blocks, groups, block, span).transpose(1, 2).reshape(batch, groups, row, span)
        columns = (torch.arange(row, device=device) // block * block)[:, None] + torch.arange(span, device=device)
        dense = rows.new_zeros(batch, groups, row, row + reach)
        dense.scatter_(-1, columns.expand(batch, groups, -1, -1), rows)
        weights = dense[:, :, :length, reach_left:reach_left + length]
    return out[:length], weights


class MultiScaleSelfAttention(nn.Module):
    """MSMSA (Eq. 9): heads with their own scales, then the shared output projection.

    Same parameters as fairseq's ``MultiheadAttention`` (q/k/v/out projections of
    ``embed_dim x embed_dim`` with biases, same names and initialisation), so a
    model using it has exactly the parameter count of the plain transformer.
    Tensors are Time x Batch x Channel like fairseq. ``head_scales`` gives one
    :class:`Scale` per head; heads with equal scales are computed together.
    """

    def __init__(self, embed_dim: int, num_heads: int, head_scales: Sequence[Scale], dropout: float = 0.0,
                 bias: bool = True, causal: bool = False, min_block: int = 16, block_factor: float = 1.0,
                 recompute: bool = True, dense_max_len: int = DEFAULT_DENSE_MAX_LEN):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if len(head_scales) != num_heads:
            raise ValueError(f"{len(head_scales)} head scales given for {num_heads} heads")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.head_scales = list(head_scales)
        self.causal = causal
        self.dropout = dropout
        self.min_block = min_block
        self.block_factor = block_factor
        self.recompute = recompute
        self.dense_max_len = dense_max_len
        # window biases of all heads (shared with the other layers of a stack: share_window_masks)
        self.window_masks = WindowMasks()
        self.window_slot = self.window_masks.register(self.head_scales, causal)
        # the heads' half-width rule as a tensor (not in the state dict): under torch.compile the layers of a
        # stack differ only in this input and share one compiled graph
        self.register_buffer("window_constants", torch.tensor(half_width_constants(self.head_scales),
                                                               dtype=torch.long), persistent=False)
        self.groups: List[Tuple[Scale, int, int]] = []  # (scale, first head, end head) of runs of equal scales
        for index, scale in enumerate(self.head_scales):
            if self.groups and self.groups[-1][0] == scale:
                self.groups[-1] = (scale, self.groups[-1][1], index + 1)
            else:
                self.groups.append((scale, index, index + 1))
        # a layer of scale-1 heads only still routes through q and k (weights 1), so no parameter is unused
        self.all_self_only = all(scale == Scale("fixed", 1) for scale in self.head_scales)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        # as fairseq.modules.MultiheadAttention with qkv_same_dim
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.constant_(self.out_proj.bias, 0.0)

    def extra_repr(self):
        scales = ", ".join(f"{scale}x{end - start}" for scale, start, end in self.groups)
        return f"embed_dim={self.embed_dim}, heads=[{scales}], causal={self.causal}, dense_max_len={self.dense_max_len}"

    def _heads(self, x: Tensor) -> Tensor:  # T x B x C -> B x H x T x D
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None,
                cache: Optional[Dict[str, Optional[Tensor]]] = None,
                need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """x: T x B x C; key_padding_mask: B x T (True = pad). ``cache`` (causal only) is a dict
        updated in place with the keys/values of all steps so far, for incremental decoding.
        Returns T x B x C and, if need_weights, per-head weights B x H x T x S."""
        tgt_len, batch, _ = x.shape
        q = self._heads(self.q_proj(x))  # scaled by the fused call (all heads) or before the groups
        k = self._heads(self.k_proj(x))
        v = self._heads(self.v_proj(x))
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.to(torch.bool)
        if cache is not None:
            if not self.causal:
                raise ValueError("a key/value cache only makes sense for causal (decoder) attention")
            prev_mask = cache.get("prev_key_padding_mask")
            if cache.get("prev_key") is not None:
                prev_len = cache["prev_key"].size(2)
                k = torch.cat([cache["prev_key"], k], dim=2)
                v = torch.cat([cache["prev_value"], v], dim=2)
                if prev_mask is not None or key_padding_mask is not None:
                    old = prev_mask if prev_mask is not None else x.new_zeros(batch, prev_len, dtype=torch.bool)
                    new = key_padding_mask if key_padding_mask is not None else x.new_zeros(batch, tgt_len, dtype=torch.bool)
                    key_padding_mask = torch.cat([old, new], dim=1)
            cache["prev_key"], cache["prev_value"] = k, v
            cache["prev_key_padding_mask"] = key_padding_mask
        if cache is None and tgt_len <= self.dense_max_len:
            out, weights = self._all_heads(q, k, v, key_padding_mask, need_weights)
            return self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, batch, self.embed_dim)), weights
        return self._grouped(q, k, v, key_padding_mask, need_weights)

    def _all_heads(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                   need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """Every head in one fused attention call, each restricted to its window by one B x H x T x T bias
        (built once per stack forward, see window_bias.py). Returns B x H x T x D and the weights if asked."""
        if compiling():  # this layer's heads only, fused by the compiler; nothing kept
            bias = window_bias(None, key_padding_mask, q.size(2), self.causal, q.dtype, q.device,
                               self.window_constants)
        else:
            bias = self.window_masks.get(self.window_slot, key_padding_mask, q.size(2), q.dtype, q.device,
                                         self.window_constants)
        if need_weights:
            return _attend(q * self.scaling, k, v, bias, self.dropout, self.training, need_weights)
        return attention(q, k, v, bias, self.dropout if self.training else 0.0, scale=self.scaling), None

    def _grouped(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                 need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """One ``windowed_attention`` call per group of equal scales (banded where the window is small
        against the sequence): long sequences and incremental decoding, and the reference of ``_all_heads``."""
        batch, _, tgt_len, _ = q.shape
        q = q * self.scaling
        outputs, weights = [], []
        # split (not slicing) so that backward concatenates the groups' gradients once
        sizes = [end - start for _, start, end in self.groups]
        for (scale, _, _), q_group, k_group, v_group in zip(
                self.groups, q.split(sizes, dim=1), k.split(sizes, dim=1), v.split(sizes, dim=1)):
            out, w = windowed_attention(
                q_group, k_group, v_group, scale, key_padding_mask, self.causal,
                self.dropout, self.training, need_weights, self.min_block, self.block_factor, self.recompute,
                self_shortcut=not self.all_self_only)
            outputs.append(out)
            weights.append(w)
        # T x B x G x D per group -> T x B x C (one copy)
        out = (torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]).reshape(tgt_len, batch, self.embed_dim)
        return self.out_proj(out), (torch.cat(weights, dim=1) if need_weights else None)


def share_window_masks(modules: Sequence[MultiScaleSelfAttention]) -> WindowMasks:
    """Let the multi-scale attention modules of one stack (all causal or all bidirectional) share one
    WindowMasks: inside its ``scope()`` the first module builds every module's window bias at once."""
    masks = WindowMasks()
    for module in modules:
        module.window_masks = masks
        module.window_slot = masks.register(module.head_scales, module.causal)
    return masks
