"""The scale graphs of UMST (paper section 2.1), built once per batch.

Inputs are the compact side data of the ``multiscale_translation`` task:

* ``word_ids``  B x T (laid out like ``src_tokens``, left- or right-padded): 0 at
  padding, else the 1-based index of the word the subword belongs to; the final
  ``</s>`` is a word of its own.
* ``word_heads`` B x W: position w holds the 1-based head of word w+1, 0 = root,
  right-padded with -1.

From them we build, on their device and with vectorised tensor ops only (no
Python loop over the batch):

* the subword -> word map G_{b->w} as a per-token index (``token_word``); it is
  never materialised as an L x L' matrix, and never per head;
* the word-level (intra-group) graph A_w as group ids for
  :mod:`umst_plugin.modules.common.group_gcn`, which applies D^-1/2 (A_w+I) D^-1/2 as a
  segment mean (a dense B x T x T matrix only for the "random A_w" ablation);
* the phrase-level (inter-group) graph: normalised D^-1/2 (A_p+I) D^-1/2 with
  A_p the *symmetric* dependency adjacency, as a dense B x W x W matrix.

Why dense B x W x W for A_p and not a scatter over edges: the paper defines A_p
as a binary matrix, so duplicated or self edges (possible in noisy parses and in
the random-A_p ablation) must collapse to one entry, which a dense ``index_put``
of ones does by construction whereas a per-edge scatter-add would double-count
them. The matrix is built once per batch and reused by every layer; its memory
B.W^2 and the bmm cost B.W^2.d are below one self-attention map (B.H.T^2) and
its T^2.d product, since W <= T. A dense bmm is also deterministic on GPU,
which scatter-add with atomics is not.
"""
import os
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from umst_plugin.data.side_inputs import check_side_input_shapes, check_side_inputs
from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward, distinct_output
from umst_plugin.modules.common.attention import additive_mask
from umst_plugin.modules.common.group_gcn import normalized_group_adjacency  # noqa: F401  (re-exported for tests)
from umst_plugin.modules.common.segment_ops import accumulation_dtype, segment_sum

UPSAMPLE_MODES = ("gather", "nearest", "linear")
WORD_BOUNDARY_NOISE = ("none", "random", "shuffle")
PHRASE_NOISE = ("none", "random")


class UMSTGraphs(NamedTuple):
    """Everything the encoder layers need about one batch's scales."""

    token_word: Tensor  # B x T long: 0-based word of each token; W (an extra slot) at padding
    token_pad: Tensor  # B x T bool: True at padding
    word_pad: Tensor  # B x W bool: True at padding words
    pieces: Tensor  # B x W float: number of subwords of each word, 0 at padding words
    class_ids: Tensor  # B x T long: 1 = piece of a multi-piece word, 0 = whole word or padding
    word_groups: Tensor  # B x T long: group ids of the word GCN's A_w (1-based, 0 = padding)
    word_adj: Optional[Tensor]  # B x T x T normalised random A_w, only with word_boundary_noise=random
    phrase_adj: Optional[Tensor]  # B x W x W normalised D^-1/2 (A_p + I) D^-1/2, None without inter-group
    up_index: Tensor  # B x T x K long: word slots each token reads from when up-sampling ATTN2 (W = none)
    up_weight: Tensor  # B x T x K float: their weights (gather: one slot, weight 1; linear: two slots)
    up_mass: Tensor  # B x W float: column sums of the up-sampling matrix R (= pieces for gather)
    # Dense per-batch operators (``dense_operators``), in the model's compute dtype, shared by every layer: the
    # fast paths apply each segment mean, gather and up-sampling as one bmm (forward and backward).
    token_attn_mask: Optional[Tensor] = None  # B x 1 x 1 x T additive attention mask: 0 at real tokens, -inf at padding
    word_attn_mask: Optional[Tensor] = None  # B x 1 x 1 x W: 0 at real words, -inf at padding words
    down: Optional[Tensor] = None  # B x W x T: subwords -> words pooling (mean or sum/sqrt(n), ``down_mode``)
    down_mode: Optional[str] = None
    up: Optional[Tensor] = None  # B x T x W: the up-sampling map R (G for gather); padding rows 0
    proj: Optional[Tensor] = None  # B x W x T: R^T (``literal``) or R^T with columns divided by R's mass (``row``)
    proj_norm: Optional[str] = None
    group_onehot: Optional[Tensor] = None  # B x T x W: token -> its word GCN group (0/1); padding rows 0
    group_mean: Optional[Tensor] = None  # B x W x T: mean over each group's tokens
    group_adj: Optional[Tensor] = None  # B x T x T: D^-1/2 (A_w + I) D^-1/2 = group_onehot @ group_mean
    phrase: Optional[Tensor] = None  # phrase_adj in the compute dtype
    # T x T long: Shaw et al.'s relative-position buckets clip(j - i, k) + k, with relative positions (the encoder
    # sets them once per batch; computed in each layer they were one kernel per layer and pass)
    relative_buckets: Optional[Tensor] = None


def debug_checks() -> bool:
    """``UMST_DEBUG_CHECKS=1``: the model re-validates its side inputs on every forward (one host-device sync
    per batch). Off by default: the task's collater validates every batch on the host for free."""
    return os.environ.get("UMST_DEBUG_CHECKS") == "1"


def symmetric_normalize(adj: Tensor) -> Tensor:
    """D^-1/2 A D^-1/2 for a symmetric B x N x N matrix; zero-degree (padding) rows stay 0, never NaN."""
    deg = adj.sum(-1)
    inv_sqrt = torch.where(deg > 0, deg.clamp(min=1e-6).rsqrt(), torch.zeros_like(deg))
    return inv_sqrt.unsqueeze(2) * adj * inv_sqrt.unsqueeze(1)


def dependency_adjacency(word_heads: Tensor) -> Tensor:
    """Binary symmetric A_p + I over words, B x W x W (bool), from per-word heads.

    A_p[i, j] = 1 iff word i's head is j or word j's head is i (root edges dropped);
    self loops on every real word; padding words have empty rows and columns. Built by comparing each
    word's head with the slot numbers (a dense boolean matrix, so duplicate and self edges collapse to the
    binary entries of the paper's definition)."""
    n_slots = word_heads.size(1)
    valid = word_heads.ge(0)
    # [b, i, j] = head(i) == j; roots (head 0 -> -1) and padding (-1 -> -2) match no slot
    child_head = (word_heads - 1).unsqueeze(2) == torch.arange(n_slots, device=word_heads.device)
    adj = child_head | child_head.transpose(1, 2) | torch.diag_embed(valid)
    return adj & (valid.unsqueeze(2) & valid.unsqueeze(1))


def normalize_binary(adj: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """D^-1/2 A D^-1/2 of a binary symmetric B x N x N matrix (bool) in ``dtype``; zero-degree (padding)
    rows and columns are 0 (their degree is clamped to 1 and they hold no entry), never NaN. The same
    values as ``symmetric_normalize(adj.to(dtype))``."""
    inv_sqrt = adj.sum(-1, dtype=dtype).clamp(min=1).rsqrt()
    return inv_sqrt.unsqueeze(2) * adj * inv_sqrt.unsqueeze(1)


def random_symmetric_adjacency(valid: Tensor, p: float = 0.5) -> Tensor:
    """Section 6's "Random" graph: a symmetric matrix whose entries are 1 with probability p, plus
    self loops, restricted to the real nodes of each sentence. B x N x N bool, drawn from torch's RNG."""
    bsz, n = valid.shape
    draws = torch.rand(bsz, n, n, device=valid.device) < p
    upper = torch.triu(draws, diagonal=1)
    adj = upper | upper.transpose(1, 2) | torch.diag_embed(valid)
    return adj & valid.unsqueeze(2) & valid.unsqueeze(1)


def shuffled_word_groups(word_ids: Tensor, pieces: Tensor, token_pad: Tensor) -> Tensor:
    """Section 6's "Shuffle A_w": permute each sentence's word lengths and re-cut its tokens into
    contiguous groups of the permuted lengths (figure 5c). The final </s> word stays last and alone.
    Returns 1-based group ids laid out like ``word_ids`` (0 at padding)."""
    bsz, n_slots = pieces.shape
    n_words = word_ids.max(dim=1).values  # includes the </s> word
    slot = torch.arange(n_slots, device=word_ids.device).unsqueeze(0)
    # Sort keys: real words random in [0, 1), then the </s> word (2), then padding words (3).
    keys = torch.rand(bsz, n_slots, device=word_ids.device)
    keys = torch.where(slot == (n_words - 1).unsqueeze(1), torch.full_like(keys, 2.0), keys)
    keys = torch.where(slot >= n_words.unsqueeze(1), torch.full_like(keys, 3.0), keys)
    order = keys.argsort(dim=1)
    new_lengths = pieces.gather(1, order).long()
    ends = new_lengths.cumsum(dim=1)  # B x W, non-decreasing
    rank = (~token_pad).long().cumsum(dim=1) - 1  # position of each token inside its sentence
    group = torch.searchsorted(ends.contiguous(), rank.clamp(min=0).contiguous(), right=True) + 1
    return group.masked_fill(token_pad, 0)


def upsampling_map(token_word: Tensor, token_pad: Tensor, word_pad: Tensor, mode: str, pieces=None, real=None):
    """The L x L' map R that turns ATTN2 into ATTN2' = R ATTN2 R^T, as per-token (slot, weight) pairs.

    * ``gather`` (the paper's G_{b->w}, Eq. 4): token i reads its own word; one pair, weight 1.
    * ``nearest`` / ``linear`` (table 6 rows 5-6): image-style interpolation of each sentence's
      W_b x W_b map to T_b x T_b, ignoring word boundaries (PyTorch ``align_corners=False``
      conventions, per sentence so padding does not change the result).
    Returns ``(index B x T x K, weight B x T x K, mass B x W)``; padding tokens point at the extra
    slot W with weight 0; ``mass`` are R's column sums. With ``gather``, ``pieces`` (B x W) and ``real``
    (B x T float, 1 at real tokens) are R's column sums and weights when given.
    """
    bsz, n_slots = word_pad.shape
    if mode == "gather":
        index = token_word.unsqueeze(-1)
        weight = ((~token_pad).to(torch.float32) if real is None else real).unsqueeze(-1)
        if pieces is not None:
            return index, weight, pieces
    elif mode in ("nearest", "linear"):
        n_tok = (~token_pad).sum(dim=1, keepdim=True)  # B x 1
        n_wrd = (~word_pad).sum(dim=1, keepdim=True)
        rank = ((~token_pad).long().cumsum(dim=1) - 1).clamp(min=0)  # B x T
        if mode == "nearest":
            index = torch.minimum((rank * n_wrd) // n_tok.clamp(min=1), n_wrd - 1).unsqueeze(-1)
            weight = (~token_pad).to(torch.float32).unsqueeze(-1)
        else:
            src = ((rank.to(torch.float32) + 0.5) * n_wrd / n_tok.clamp(min=1) - 0.5).clamp(min=0)
            lo = src.floor().long().clamp(max=n_wrd - 1)
            hi = torch.minimum(lo + 1, n_wrd - 1)
            frac = src - lo.to(torch.float32)
            frac = torch.where(hi == lo, torch.zeros_like(frac), frac)
            index = torch.stack([lo, hi], dim=-1)
            weight = torch.stack([1.0 - frac, frac], dim=-1) * (~token_pad).to(torch.float32).unsqueeze(-1)
        index = index.masked_fill(token_pad.unsqueeze(-1), n_slots)
    else:
        raise ValueError(f"unknown up-sampling mode {mode!r}; choose from {UPSAMPLE_MODES}")
    mass = torch.zeros(bsz, n_slots + 1, device=token_word.device, dtype=torch.float32)
    mass.scatter_add_(1, index.reshape(bsz, -1), weight.reshape(bsz, -1))
    return index, weight, mass[:, :n_slots]


def build_graphs(
    src_tokens: Tensor,
    word_ids: Tensor,
    word_heads: Tensor,
    padding_idx: int,
    upsample: str = "gather",
    word_boundary_noise: str = "none",
    phrase_noise: str = "none",
    need_phrase: bool = True,
    check: bool = True,
    check_values: Optional[bool] = None,
    dtype: Optional[torch.dtype] = None,
    downsample: str = "mean",
    upsample_norm: str = "row",
    dense: bool = True,
) -> UMSTGraphs:
    """Build every graph of one batch (see the module docstring). ``check``: shapes (free); ``check_values``:
    also the values (a host sync on a GPU; default: only under ``UMST_DEBUG_CHECKS=1``, since the task's
    collater validates every batch on the host). ``dense``: also the dense operators (``dense_operators``) in
    ``dtype`` (the model's compute dtype: the autocast dtype under autocast; default float32), for the
    pooling ``downsample`` and the up-sampling normalisation ``upsample_norm`` the layers use."""
    if check:
        check_side_input_shapes(src_tokens, word_ids, word_heads)
        if check_values or (check_values is None and debug_checks()):
            check_side_inputs(src_tokens, word_ids, word_heads, padding_idx)
    if word_boundary_noise not in WORD_BOUNDARY_NOISE:
        raise ValueError(f"unknown word-boundary noise {word_boundary_noise!r}; choose from {WORD_BOUNDARY_NOISE}")
    if phrase_noise not in PHRASE_NOISE:
        raise ValueError(f"unknown phrase-adjacency noise {phrase_noise!r}; choose from {PHRASE_NOISE}")
    # graphs are built in fp32 (or fp64), also inside an autocast region (no product cast to bf16 there)
    with torch.autocast(word_ids.device.type, enabled=False):
        return _build_graphs(word_ids, word_heads, upsample, word_boundary_noise, phrase_noise, need_phrase, dtype,
                             downsample, upsample_norm, dense)


def _build_graphs(word_ids, word_heads, upsample, word_boundary_noise, phrase_noise, need_phrase, dtype, downsample,
                  upsample_norm, dense) -> UMSTGraphs:
    work = torch.float64 if dtype == torch.float64 else torch.float32
    word_ids = word_ids.long()
    word_heads = word_heads.long()
    bsz, n_slots = word_heads.shape
    token_pad = word_ids.eq(0)
    word_pad = word_heads.lt(0)
    token_word = (word_ids - 1).remainder(n_slots + 1)  # padding (0 - 1) -> the extra slot W
    onehot = _one_hot(token_word, n_slots, work)  # G, B x T x W (padding tokens: zero rows)
    pieces = onehot.sum(1)  # B x W
    real = onehot.sum(2)  # B x T: 1 at real tokens
    class_ids = (torch.bmm(onehot, pieces.unsqueeze(-1)).squeeze(-1) > 1).long()  # pieces of the token's word > 1

    word_groups, word_adj = word_ids, None
    if word_boundary_noise == "shuffle":
        word_groups = shuffled_word_groups(word_ids, pieces, token_pad)
    elif word_boundary_noise == "random":
        word_adj = normalize_binary(random_symmetric_adjacency(~token_pad), work)

    phrase_adj = None
    if need_phrase:
        if phrase_noise == "random":
            adj = random_symmetric_adjacency(~word_pad)
        else:
            adj = dependency_adjacency(word_heads)
        phrase_adj = normalize_binary(adj, work)

    up_index, up_weight, up_mass = upsampling_map(token_word, token_pad, word_pad, upsample, pieces, real)
    graphs = UMSTGraphs(
        token_word=token_word,
        token_pad=token_pad,
        word_pad=word_pad,
        pieces=pieces,
        class_ids=class_ids,
        word_groups=word_groups,
        word_adj=word_adj,
        phrase_adj=phrase_adj,
        up_index=up_index,
        up_weight=up_weight,
        up_mass=up_mass,
    )
    if dense:
        graphs = graphs._replace(**dense_operators(graphs, torch.float32 if dtype is None else dtype, downsample,
                                                   upsample_norm, group_noise=word_boundary_noise,
                                                   upsample=upsample, onehot=onehot))
    return graphs


def _one_hot(index: Tensor, n_slots: int, dtype: torch.dtype) -> Tensor:
    """B x T (x K) slots in [0, n_slots] -> B x T (x K) x n_slots one-hot (slot n_slots: an all-zero row)."""
    return (index.unsqueeze(-1) == torch.arange(n_slots, device=index.device)).to(dtype)


def dense_operators(graphs: UMSTGraphs, dtype: torch.dtype, downsample: str = "mean", upsample_norm: str = "row",
                    group_noise: str = "none", upsample: str = "gather", onehot: Optional[Tensor] = None) -> dict:
    """The dense B x W x T / B x T x W / B x T x T operators of one batch, in ``dtype`` (the fields of
    :class:`UMSTGraphs` from ``token_attn_mask`` on). Built once per batch in float32 (float64 for a float64 model),
    rounded once to ``dtype``.

    Per-word means, gathers to subwords and the up-sampling are then one ``bmm`` each, forward and backward
    (a segment mean by ``index_add_`` is three kernels forward and two backward, a gather with a zero slot three,
    and ``index_add_`` is not deterministic on a GPU). Cost: O(B.T.W.d) multiply-adds per product and B.T^2
    values for A_w, below one attention map (B.H.T^2) and its product. Under bf16 the entries 1/n are rounded
    to bf16 (1/3 -> 0.3340, +0.2%); 0/1 entries are exact in every dtype."""
    if downsample not in ("mean", "scaled-sum"):
        raise ValueError(f"unknown down-sampling {downsample!r}; choose mean or scaled-sum")
    if upsample_norm not in ("row", "literal"):
        raise ValueError(f"unknown up-sampling normalisation {upsample_norm!r}; choose row or literal")
    work = torch.float64 if dtype == torch.float64 else torch.float32
    bsz, n_slots = graphs.word_pad.shape
    if onehot is None or onehot.dtype != work:
        onehot = _one_hot(graphs.token_word, n_slots, work)  # B x T x W = G (padding tokens: zero rows)
    inv = graphs.pieces.to(work).clamp(min=1).reciprocal().unsqueeze(1)  # B x 1 x W (padding words: G's column is 0)
    mean = onehot * inv  # B x T x W; its transpose is the per-word mean
    down = mean if downsample == "mean" else onehot * inv.sqrt()
    if upsample == "gather":  # R = G
        up, proj = onehot, (mean if upsample_norm == "row" else onehot)
    else:
        up = (_one_hot(graphs.up_index, n_slots, work) * graphs.up_weight.to(work).unsqueeze(-1)).sum(2)
        proj = up / graphs.up_mass.to(work).clamp(min=1e-6).unsqueeze(1) if upsample_norm == "row" else up
    # additive key masks, built once (a boolean mask is turned into one by every attention call)
    out = dict(
        token_attn_mask=additive_mask(graphs.token_pad, dtype).view(bsz, 1, 1, -1),
        word_attn_mask=additive_mask(graphs.word_pad, dtype).view(bsz, 1, 1, -1),
        down_mode=downsample,
        proj_norm=upsample_norm,
        phrase=None if graphs.phrase_adj is None else graphs.phrase_adj.to(dtype),
    )
    if group_noise == "random":  # the word GCN uses the dense random A_w (word_adj) instead
        group_onehot = group_mean = None
    elif group_noise == "shuffle":
        group = torch.where(graphs.token_pad, torch.full_like(graphs.word_groups, n_slots), graphs.word_groups - 1)
        group_onehot = _one_hot(group, n_slots, work)
        group_mean = group_onehot / group_onehot.sum(1, keepdim=True).clamp(min=1)
    else:
        group_onehot, group_mean = onehot, mean
    group_adj = None if group_onehot is None else torch.bmm(group_onehot, group_mean.transpose(1, 2))
    cast = {}  # each distinct tensor rounded once

    def to(t):
        if t is None:
            return None
        if id(t) not in cast:
            cast[id(t)] = t.to(dtype)
        return cast[id(t)]

    out.update(down=to(down).transpose(1, 2), up=to(up), proj=to(proj).transpose(1, 2),
               group_onehot=to(group_onehot), group_mean=None if group_mean is None else to(group_mean).transpose(1, 2),
               group_adj=to(group_adj))
    return out


class _SegmentSum(torch.autograd.Function):
    """``zeros(n_rows, C).index_add_(0, index, source)`` whose backward saves only ``index``.

    ``Tensor.index_add_``'s autograd keeps ``source`` alive (it needs only its shape), a whole
    B x T x d activation per call; its gradient is just ``grad[index]``."""

    @staticmethod
    @amp_forward
    def forward(ctx, source: Tensor, index: Tensor, n_rows: int, dtype: torch.dtype) -> Tensor:
        ctx.save_for_backward(index)
        ctx.source_dtype = source.dtype
        return distinct_output(segment_sum(source, index, n_rows, dtype))  # (an index_add_ on zeros)

    @staticmethod
    @amp_backward
    def backward(ctx, grad: Tensor):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index).to(ctx.source_dtype), None, None, None


def segment_sum_keeping_index(source: Tensor, index: Tensor, n_rows: int, dtype: Optional[torch.dtype] = None) -> Tensor:
    """``segment_ops.segment_sum`` whose autograd keeps only ``index`` for backward (see _SegmentSum); ``dtype``:
    as there (default: the accumulation dtype of ``source``)."""
    return _SegmentSum.apply(source, index, n_rows, dtype)


def _flat_slots(index: Tensor, n_slots: int) -> Tensor:
    """(b, slot) -> b * (n_slots + 1) + slot, so sentences never share a slot."""
    offsets = torch.arange(index.size(0), device=index.device).view(-1, *([1] * (index.dim() - 1)))
    return index + offsets * (n_slots + 1)


def downsample_words(x: Tensor, graphs: UMSTGraphs, mode: str = "mean") -> Tensor:
    """Subwords -> words (section 3.3): B x T x C -> B x W x C by average pooling (the paper), or
    ``scaled-sum`` = sum / sqrt(n) (the authors' code). Accumulates in fp32; padding words are 0."""
    if mode not in ("mean", "scaled-sum"):
        raise ValueError(f"unknown down-sampling {mode!r}; choose mean or scaled-sum")
    bsz, length, channels = x.shape
    n_slots = graphs.word_pad.size(1)
    index = _flat_slots(graphs.token_word, n_slots).reshape(-1)
    sums = segment_sum_keeping_index(x.reshape(-1, channels), index, bsz * (n_slots + 1))
    acc = sums.dtype
    sums = sums.view(bsz, n_slots + 1, channels)[:, :n_slots]
    n = graphs.pieces.clamp(min=1).to(acc).unsqueeze(-1)
    out = sums / n if mode == "mean" else sums / n.sqrt()
    return out.to(x.dtype)


def project_to_words(v: Tensor, graphs: UMSTGraphs, normalize: bool) -> Tensor:
    """R^T v (B x T x C -> B x W x C), divided by R's column mass when ``normalize``.

    With the gather map this is the sum (literal G^T v) or the mean of each word's pieces."""
    bsz, length, channels = v.shape
    n_slots = graphs.word_pad.size(1)
    acc = accumulation_dtype(v.dtype)
    flat = _flat_slots(graphs.up_index, n_slots)  # B x T x K
    if flat.size(-1) == 1:  # gather / nearest: weight 1 on real tokens, and padding lands in slot W
        out = segment_sum_keeping_index(v.reshape(-1, channels), flat.reshape(-1), bsz * (n_slots + 1), acc)
    else:
        out = None
        v_acc = v.to(acc)
        for k in range(flat.size(-1)):  # K <= 2 interpolation taps, not a loop over the batch
            w = graphs.up_weight[..., k].to(acc).unsqueeze(-1)
            tap = segment_sum_keeping_index((v_acc * w).reshape(-1, channels), flat[..., k].reshape(-1), bsz * (n_slots + 1), acc)
            out = tap if out is None else out + tap
    out = out.view(bsz, n_slots + 1, channels)[:, :n_slots]
    if normalize:
        out = out / graphs.up_mass.clamp(min=1e-6).to(acc).unsqueeze(-1)
    return out.to(v.dtype)


def upsample_tokens(y: Tensor, graphs: UMSTGraphs) -> Tensor:
    """R y (B x W x C -> B x T x C): a gather on the per-token word slots, never a matmul with G."""
    bsz, n_slots, channels = y.shape
    y_flat = torch.cat([y, y.new_zeros(bsz, 1, channels)], dim=1).reshape(-1, channels)
    flat = _flat_slots(graphs.up_index, n_slots)
    if flat.size(-1) == 1:  # gather / nearest: one slot per token; padding reads the zero slot
        return y_flat.index_select(0, flat[..., 0].reshape(-1)).view(bsz, -1, channels)
    out = None
    for k in range(flat.size(-1)):
        tap = y_flat.index_select(0, flat[..., k].reshape(-1)).view(bsz, -1, channels)
        tap = tap * graphs.up_weight[..., k].to(y.dtype).unsqueeze(-1)
        out = tap if out is None else out + tap
    return out


def upsample_attention_map(a2: Tensor, graphs: UMSTGraphs, normalize: bool) -> Tensor:
    """ATTN2' = R ATTN2 R^T (or R ATTN2 diag(1/mass) R^T when ``normalize``), B x H x W x W -> B x H x T x T,
    by gathers on the per-token word slots (R is never built). Only for the materialised RSAN path
    (``--rsan-attention-dropout fused``); rows and columns of padding tokens are 0."""
    bsz, heads, n_slots, _ = a2.shape
    length, taps = graphs.up_index.shape[1:]
    padded = F.pad(a2, (0, 1, 0, 1))  # slot W: the zero word that padding tokens read
    weight = graphs.up_weight.to(a2.dtype)  # B x T x K
    col_weight = weight
    if normalize:
        mass = F.pad(graphs.up_mass, (0, 1), value=1.0).clamp(min=1e-6).to(a2.dtype)  # B x (W+1)
        col_weight = weight / mass.gather(1, graphs.up_index.reshape(bsz, -1)).view_as(weight)
    out = None
    for row_tap in range(taps):  # K <= 2 interpolation taps, not a loop over the batch
        index = graphs.up_index[..., row_tap].view(bsz, 1, length, 1).expand(bsz, heads, length, n_slots + 1)
        rows = padded.gather(2, index) * weight[..., row_tap].view(bsz, 1, length, 1)  # B x H x T x (W+1)
        for col_tap in range(taps):
            index = graphs.up_index[..., col_tap].view(bsz, 1, 1, length).expand(bsz, heads, length, length)
            term = rows.gather(3, index) * col_weight[..., col_tap].view(bsz, 1, 1, length)
            out = term if out is None else out + term
    return out
