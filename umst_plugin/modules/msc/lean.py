"""The launch-lean building blocks of MSC's layers (``layer.py``) and decoder (``models/msc/decoder.py``).

The same math as the reference path (fairseq's ``MultiheadAttention`` per attention, ``FeatureFusion``,
``FairseqDropout``), in fewer kernels:

* **One attention call for two attentions over keys of the same length.** An encoder layer's self-attention
  ``ATTN_h(LN(H), LN(H), LN(H))`` and context attention ``ATTN_c(LN(H), C, C)`` (Eq. 12), and a decoder layer's
  attention over block ``B^n`` and over the context ``C^n`` (Eq. 13), share their queries' input and the key
  padding mask: they run as one attention of 2H heads (heads 1..H the first attention's, H+1..2H the second's).
  The queries of both (and the encoder's self-attention keys and values) come from one matrix product with the
  projection weights concatenated; both output projections are one ``baddbmm``; the gate of Eqs. 12-13
  ``g = sigmoid(W1 a_h + W2 a_c + b)`` is one ``addbmm`` over the pair (the gate's ``Linear(2C, C)`` weight read
  as its two C x C halves, no concatenation of ``[a_h; a_c]``) and ``g a_h + (1 - g) a_c`` one ``lerp``. With
  ``--msc-fusion add`` the two output projections and the sum are one ``addbmm``.
* **Masks built once per forward** as additive float masks in the compute dtype (0 at keys that may be attended,
  the dtype's lowest value elsewhere: a fully masked query row stays finite), shared by every layer, their last
  dimension padded to a multiple of 16 in memory (the memory-efficient CUDA kernel copies a mask whose strides
  are not).
* **Dropout** as ``torch.native_dropout``: one kernel where ``F.dropout`` launches three on a CPU (the same mask
  from the same random state; on a GPU ``F.dropout`` runs the same kernel).

:func:`attend` and :func:`attention_probs` are the only attention kernels the lean paths call (tests replace
them to inject dropout masks).
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from umst_plugin.modules.common.amp_functions import autocast_cast, compute_dtype  # noqa: F401  (lean.compute_dtype)
from umst_plugin.modules.common import lean_ops
from umst_plugin.modules.common.attention import attention

_HALF = (torch.float16, torch.bfloat16)
ALIGN = 16  # elements: masks and cache rows are laid out with strides that are multiples of this


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def cast(p: Tensor, device_type: str) -> Tensor:
    """``p`` as autocast would cast it whole for a matrix product (``common.amp_functions.autocast_cast``), so a
    concatenation or a view of parameters costs no per-use cast under autocast."""
    return autocast_cast(p, device_type)


def packed(linears: Sequence[torch.nn.Linear], device_type: str) -> Tuple[Tensor, Tensor]:
    """The weights and biases of ``linears`` concatenated: one product computes all of their outputs."""
    weight = torch.cat([cast(m.weight, device_type) for m in linears])
    bias = torch.cat([cast(m.bias, device_type) for m in linears])
    return weight, bias


def paired(first: torch.nn.Linear, second: torch.nn.Linear, device_type: str) -> Tuple[Tensor, Tensor]:
    """Two C x C maps as a batch for ``baddbmm``: (2 x C_in x C_out weights, 2 x 1 x C_out biases)."""
    weight = torch.stack([cast(first.weight, device_type), cast(second.weight, device_type)]).transpose(1, 2)
    bias = torch.stack([cast(first.bias, device_type), cast(second.bias, device_type)]).unsqueeze(1)
    return weight, bias


def gate_halves(gate_proj: torch.nn.Linear, device_type: str) -> Tensor:
    """The gate's ``Linear(2C, C)`` weight ``[W1 W2]`` as 2 x C x C ``[W1^T, W2^T]`` (a view, no copy)."""
    w = cast(gate_proj.weight, device_type)
    c = w.size(0)
    return w.view(c, 2, c).permute(1, 2, 0)


def dropout(x: Tensor, module) -> Tensor:
    """``module`` (a FairseqDropout) applied to ``x`` with one kernel."""
    return lean_ops.dropout(x, module.p, module.training or module.apply_during_inference)


def lowest(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min


def key_mask(padding_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """B x S padding mask (True at padding) -> B x 1 x 1 x S additive mask (0 / lowest) in ``dtype``."""
    bsz, src_len = padding_mask.shape
    mask = torch.zeros(bsz, 1, 1, aligned(src_len), dtype=dtype, device=padding_mask.device)[..., :src_len]
    return mask.masked_fill_(padding_mask.view(bsz, 1, 1, src_len), lowest(dtype))


def causal_key_mask(padding_mask: Optional[Tensor], future: Optional[Tensor], bsz: int, tgt_len: int,
                    dtype: torch.dtype, device) -> Tensor:
    """B x 1 x T x T additive mask of a decoder's self-attention: ``future`` (T x T, fairseq's causal mask, -inf
    above the diagonal, or None) plus the lowest value at padded keys."""
    mask = torch.zeros(bsz, 1, tgt_len, aligned(tgt_len), dtype=dtype, device=device)[..., :tgt_len]
    if future is not None:
        mask.copy_(future.expand(bsz, 1, tgt_len, tgt_len))
    if padding_mask is not None:
        mask.masked_fill_(padding_mask.view(bsz, 1, 1, tgt_len), lowest(dtype))
    return mask


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float, scale: float) -> Tensor:
    """softmax(q k^T * scale + mask) v, B x heads x L x d (fused; ``common.attention``)."""
    return attention(q, k, v, mask, dropout_p, scale=scale)


def attention_probs(q: Tensor, k: Tensor, mask: Optional[Tensor], scale: float) -> Tensor:
    """softmax(q k^T * scale + mask) in float32 for half inputs (the probabilities fairseq's attention returns
    with ``need_weights``: before dropout)."""
    scores = torch.matmul(q * scale, k.transpose(-1, -2))
    if scores.dtype in _HALF:
        scores = scores.float()
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores, dim=-1)


def pair_out_and_fuse(o2: Tensor, out_first: torch.nn.Linear, out_second: torch.nn.Linear, fusion,
                      weights: Optional[Tuple[Tensor, Tensor]] = None, shape: Optional[Sequence[int]] = None
                      ) -> Tensor:
    """``Fuse(out_first(o2[0]), out_second(o2[1]))`` (2 x N x C -> N x C) with ``fusion`` a FeatureFusion: the
    gate of Eqs. 12-13 or the sum. ``weights``: :func:`pair_weights`, precomputed. ``shape``: the gate's shape
    in ``fusion.record`` (default N x C)."""
    device_type = o2.device.type
    if weights is None:
        weights = pair_weights(out_first, out_second, fusion, device_type)
    weight, bias = weights
    if fusion.gate_proj is None:  # a_h + a_c: both projections and the sum in one product
        return torch.addbmm(bias, o2, weight)
    a = torch.baddbmm(bias, o2, weight)  # 2 x N x C: a_h, a_c
    gate = torch.sigmoid(torch.addbmm(cast(fusion.gate_proj.bias, device_type), a,
                                      gate_halves(fusion.gate_proj, device_type)))
    if fusion.record is not None:
        fusion.record.append(gate.detach() if shape is None else gate.detach().view(shape))
    a_h, a_c = a.unbind(0)
    return torch.lerp(a_c, a_h, gate)  # a_c + g (a_h - a_c) = g a_h + (1 - g) a_c


def pair_weights(out_first: torch.nn.Linear, out_second: torch.nn.Linear, fusion, device_type: str):
    weight, bias = paired(out_first, out_second, device_type)
    if fusion.gate_proj is None:
        bias = bias[0, 0] + bias[1, 0]
    return weight, bias


def heads(x: Tensor, n_heads: int) -> Tensor:
    """T x B x (n_heads * d) -> B x n_heads x T x d (a view)."""
    tgt_len, bsz, dim = x.shape
    return x.view(tgt_len, bsz, n_heads, dim // n_heads).permute(1, 2, 0, 3)


def merge_heads(o: Tensor, groups: int = 1) -> Tensor:
    """B x (groups * H) x T x d -> groups x (T * B) x (H * d) (one copy; ``groups`` = 1: T x B x C)."""
    bsz, n_heads, tgt_len, head_dim = o.shape
    h = n_heads // groups
    if groups == 1:
        return o.permute(2, 0, 1, 3).reshape(tgt_len, bsz, n_heads * head_dim)
    return o.view(bsz, groups, h, tgt_len, head_dim).permute(1, 3, 0, 2, 4).reshape(
        groups, tgt_len * bsz, h * head_dim)


def cross_kv_streams(inputs: Tensor, attns: List, device_type: str) -> Tensor:
    """Keys and values of every decoder cross-attention at once: ``inputs`` K*N x S x B x C (stream j read by
    ``attns[j]``) -> K*N x (S * B) x 2C (``[k_proj(x); v_proj(x)]`` per stream), one ``baddbmm``."""
    n_streams, src_len, bsz, dim = inputs.shape
    weight = torch.cat([cast(w, device_type) for a in attns for w in (a.k_proj.weight, a.v_proj.weight)])
    bias = torch.cat([cast(b, device_type) for a in attns for b in (a.k_proj.bias, a.v_proj.bias)])
    return torch.baddbmm(bias.view(n_streams, 1, 2 * dim), inputs.reshape(n_streams, src_len * bsz, dim),
                         weight.view(n_streams, 2 * dim, dim).transpose(1, 2))
