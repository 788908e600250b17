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

Cost. Heads are grouped by scale. A group whose window is small against the
sequence is computed *blocked*: queries are cut into blocks of ``b`` positions
and each block attends to the ``b + 2h`` keys around it (unfolded from the
padded key tensor), so time and memory are O(N x (b + 2h)) instead of O(N^2);
``b = max(h, min_block)`` keeps the redundant part of each block below ~3x the
window. A group whose window reaches across the sequence uses the dense
path (N x N scores restricted by a band mask).

Masking. A query sees a key iff it lies in its window and is not padding. Pads
are contiguous at one end of a row (fairseq pads left or right), so position
differences inside a row are differences of sentence positions and padding on
either side gives the same windows. Every query may always see *itself*: real
queries see themselves anyway, and padding queries whose window holds only
padding get a one-element softmax instead of NaN (their outputs are discarded).
"""
import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DEFAULT_SCALES = "1,3,N/16,N/8,N/4"


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
) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention of heads that share one scale.

    q: B x G x Tq x D (already scaled), k/v: B x G x Tk x D, the queries being
    the last Tq keys (Tq < Tk only in incremental decoding). key_padding_mask:
    B x Tk, True at padding. Returns the output B x G x Tq x D and, if asked,
    the attention weights B x G x Tq x Tk.
    """
    batch, _, tgt_len, _ = q.shape
    src_len = k.size(2)
    query_offset = src_len - tgt_len
    if query_offset < 0:
        raise ValueError(f"windowed self-attention needs at least as many keys ({src_len}) as queries ({tgt_len})")
    positions, lengths = _token_positions(key_padding_mask, batch, src_len, q.device)
    hmax = scale.max_half_width(src_len)
    if causal:  # window of the prefix ending at the query
        half = scale.half_width(positions[:, query_offset:] + 1)  # B x Tq
    else:
        half = scale.half_width(lengths)  # B x 1
    if scale.kind == "fixed":
        half = hmax  # constant: a Python int keeps the band mask free of batch dimensions
    elif scale.kind == "global":
        half = src_len
    key_valid = None if key_padding_mask is None else ~key_padding_mask
    reach_right = 0 if causal else hmax
    block = max(hmax, min_block)
    if tgt_len == src_len and block + hmax + reach_right < src_len:
        return _blocked(q, k, v, half, hmax, reach_right, block, causal, key_valid, dropout_p, training, need_weights)
    # Dense path; in incremental decoding only the keys a window can reach are sliced out.
    start = max(0, query_offset - hmax) if causal else 0
    if start > 0:
        k, v = k[:, :, start:], v[:, :, start:]
        key_valid = None if key_valid is None else key_valid[:, start:]
    out, weights = _dense(q, k, v, half, causal, key_valid, query_offset - start, dropout_p, training, need_weights)
    if weights is not None and start > 0:
        weights = F.pad(weights, (start, 0))
    return out, weights


def _allowed(offset: Tensor, half, causal: bool, key_valid: Optional[Tensor]) -> Tensor:
    """Window (and padding) mask from key-minus-query offsets; ``half`` is an int or broadcasts to offset."""
    allowed = (offset >= -half) & (offset <= (0 if causal else half))
    if key_valid is not None:
        allowed = allowed & (key_valid | (offset == 0))
    return allowed


def _softmax_dropout(scores: Tensor, allowed: Tensor, dropout_p: float, training: bool) -> Tensor:
    scores = scores.masked_fill(~allowed, float("-inf"))
    # fp16/bf16 scores are normalised in fp32 (as fairseq does)
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).type_as(scores)
    return F.dropout(probs, p=dropout_p, training=training)


def _dense(q, k, v, half, causal, key_valid, query_offset, dropout_p, training, need_weights):
    tgt_len, src_len = q.size(2), k.size(2)
    device = q.device
    offset = torch.arange(src_len, device=device)[None, :] - (query_offset + torch.arange(tgt_len, device=device))[:, None]
    if isinstance(half, Tensor):  # B x 1 (per sentence) or B x Tq (per query)
        half = half[:, None, :, None]
    kv = None if key_valid is None else key_valid[:, None, None, :]
    allowed = _allowed(offset, half, causal, kv)
    probs = _softmax_dropout(q @ k.transpose(-1, -2), allowed, dropout_p, training)
    return probs @ v, (probs if need_weights else None)


def _blocked(q, k, v, half, reach_left, reach_right, block, causal, key_valid, dropout_p, training, need_weights):
    """Query block i (positions i*b .. i*b+b-1) attends to keys i*b - L .. i*b + b - 1 + R."""
    batch, groups, length, dim = q.shape
    n_blocks = -(-length // block)
    padded = n_blocks * block
    span = block + reach_left + reach_right
    # Chunks of padded keys overlap; unfold is a strided view, copied once by the matmul.
    pad_keys = (0, 0, reach_left, padded - length + reach_right)
    k_chunks = F.pad(k, pad_keys).unfold(2, span, block)  # B x G x nb x D x span
    v_chunks = F.pad(v, pad_keys).unfold(2, span, block).transpose(-1, -2)  # B x G x nb x span x D
    q_blocks = F.pad(q, (0, 0, 0, padded - length)).view(batch, groups, n_blocks, block, dim)

    device = q.device
    # column c of block i is key i*b - L + c; row r is query i*b + r; offset = c - L - r
    offset = torch.arange(span, device=device)[None, :] - reach_left - torch.arange(block, device=device)[:, None]
    valid = torch.ones(batch, length, dtype=torch.bool, device=device) if key_valid is None else key_valid
    valid = F.pad(valid, (reach_left, padded - length + reach_right), value=False).unfold(1, span, block)
    valid = valid[:, None, :, None, :]  # B x 1 x nb x 1 x span; also drops keys outside the sequence
    if isinstance(half, Tensor):
        if half.size(1) == 1:
            half = half[:, None, :, None, None]
        else:  # per query (causal relative scales)
            half = F.pad(half, (0, padded - length)).view(batch, 1, n_blocks, block, 1)
    allowed = _allowed(offset, half, causal, valid)
    probs = _softmax_dropout(q_blocks @ k_chunks, allowed, dropout_p, training)
    out = (probs @ v_chunks).view(batch, groups, padded, dim)[:, :, :length]
    weights = None
    if need_weights:  # scatter the bands back to a dense matrix (inspection only)
        rows = probs.reshape(batch, groups, padded, span)
        columns = (torch.arange(padded, device=device) // block * block)[:, None] + torch.arange(span, device=device)
        dense = rows.new_zeros(batch, groups, padded, padded + reach_left + reach_right)
        dense.scatter_(-1, columns.expand(batch, groups, -1, -1), rows)
        weights = dense[:, :, :length, reach_left:reach_left + length]
    return out, weights


class MultiScaleSelfAttention(nn.Module):
    """MSMSA (Eq. 9): heads with their own scales, then the shared output projection.

    Same parameters as fairseq's ``MultiheadAttention`` (q/k/v/out projections of
    ``embed_dim x embed_dim`` with biases, same names and initialisation), so a
    model using it has exactly the parameter count of the plain transformer.
    Tensors are Time x Batch x Channel like fairseq. ``head_scales`` gives one
    :class:`Scale` per head; heads with equal scales are computed together.
    """

    def __init__(self, embed_dim: int, num_heads: int, head_scales: Sequence[Scale], dropout: float = 0.0,
                 bias: bool = True, causal: bool = False, min_block: int = 16):
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
        self.groups: List[Tuple[Scale, int, int]] = []  # (scale, first head, end head) of runs of equal scales
        for index, scale in enumerate(self.head_scales):
            if self.groups and self.groups[-1][0] == scale:
                self.groups[-1] = (scale, self.groups[-1][1], index + 1)
            else:
                self.groups.append((scale, index, index + 1))
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
        return f"embed_dim={self.embed_dim}, heads=[{scales}], causal={self.causal}"

    def _heads(self, x: Tensor) -> Tensor:  # T x B x C -> B x H x T x D
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None,
                cache: Optional[Dict[str, Optional[Tensor]]] = None,
                need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """x: T x B x C; key_padding_mask: B x T (True = pad). ``cache`` (causal only) is a dict
        updated in place with the keys/values of all steps so far, for incremental decoding.
        Returns T x B x C and, if need_weights, per-head weights B x H x T x S."""
        tgt_len, batch, _ = x.shape
        q = self._heads(self.q_proj(x) * self.scaling)
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
        outputs, weights = [], []
        for scale, start, end in self.groups:
            out, w = windowed_attention(
                q[:, start:end], k[:, start:end], v[:, start:end], scale, key_padding_mask, self.causal,
                self.dropout, self.training, need_weights, self.min_block)
            outputs.append(out)
            weights.append(w)
        out = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, batch, self.embed_dim)
        return self.out_proj(out), (torch.cat(weights, dim=1) if need_weights else None)
