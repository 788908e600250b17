"""Scaled dot-product attention for every family of the plugin: fused where torch fuses, exact everywhere.

:func:`attention` is ``F.scaled_dot_product_attention`` (no probabilities kept for backward; flash or
memory-efficient kernels on GPUs) with one exception: reduced precision (bf16/fp16) *with dropout* on a CPU. The
CPU flash kernel has no dropout, so torch falls back to its math path, which upcasts q, k and v to float32: the
forward and backward matmuls run in fp32 inside the autocast region. There :func:`explicit_attention` runs the
same function in the input dtype (q scaled first, fp32 softmax, dropout on the probabilities), as fairseq's own
attention does. :func:`explicit_attention` is also the reference path (and the one that returns probabilities,
for alignment and ``umst-inspect``); ``tests/test_attention.py`` checks both give the same values and gradients.

On a CPU, attention *with dropout in training* has no fused kernel at all: torch's math path (or the explicit
path above) keeps the B x H x L x S probabilities and the dropout mask for backward. There the core is
recomputed in backward instead (``torch.utils.checkpoint``, the same dropout mask from the saved RNG state), so
backward keeps only q, k, v and the mask, as the fused kernels do on a GPU: more memory on a CPU than a GPU
would never be charged to an architecture (``recompute=False`` keeps the probabilities).

Masks: boolean (True = may attend) or additive float, broadcastable to B x H x L x S.
"""
import contextlib
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

_HALF = (torch.float16, torch.bfloat16)


def additive_mask(blocked: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where allowed, -inf where ``blocked`` (True), in ``dtype`` and ``blocked``'s shape: what
    ``F.scaled_dot_product_attention`` makes of a boolean mask on every call (three ops there), made once so a
    stack of layers can share it."""
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(blocked, float("-inf"))


class _Paths:
    """Which path attention takes on a CPU: the CPU's own (the default), or a GPU's while a tool traces the
    program a GPU would run (:func:`gpu_paths_on_cpu`)."""
    gpu_paths_on_cpu = False


_PATHS = _Paths()


@contextlib.contextmanager
def gpu_paths_on_cpu():
    """Within: attention on a CPU takes the path a GPU would (no explicit half-precision core, no recompute in
    backward). The switch of a tool that counts a GPU's program on a CPU (``umst_dev/simulated_gpu.py``, which
    also makes ``F.scaled_dot_product_attention`` with dropout one op each way); never set in training."""
    before = _PATHS.gpu_paths_on_cpu
    _PATHS.gpu_paths_on_cpu = True
    try:
        yield
    finally:
        _PATHS.gpu_paths_on_cpu = before


def runs_cpu_kernels(t: Tensor) -> bool:
    """Whether attention on ``t`` takes the CPU's path: the explicit core in half precision with dropout, the core
    recomputed in backward. False on a CPU within :func:`gpu_paths_on_cpu`, so that a trace takes the path a GPU
    would."""
    return t.device.type == "cpu" and not _PATHS.gpu_paths_on_cpu


def _needs_explicit(q: Tensor, dropout_p: float) -> bool:
    return dropout_p > 0 and runs_cpu_kernels(q) and q.dtype in _HALF


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                       scale: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """(softmax(q k^T * scale + mask) v, the probabilities), B x H x L x d. q is scaled before the product
    (fp16 range); the softmax runs in fp32 for fp16/bf16 scores; dropout acts on the probabilities."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = torch.matmul(q * scale, k.transpose(-1, -2))
    if scores.dtype in _HALF:
        scores = scores.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    probs = torch.softmax(scores, dim=-1)
    dropped = F.dropout(probs, p=dropout_p, training=dropout_p > 0)
    return torch.matmul(dropped.to(v.dtype), v), probs


def _core(q, k, v, mask, dropout_p, scale):
    if _needs_explicit(q, dropout_p):
        return explicit_attention(q, k, v, mask, dropout_p, scale)[0]
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # an additive mask in another dtype would make torch promote to its dtype
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, dropout_p: float = 0.0,
              scale: Optional[float] = None, recompute: bool = True) -> Tensor:
    """softmax(q k^T * scale + mask) v (B x H x L x d): fused, in the input dtype, and on a CPU with dropout
    recomputed in backward rather than kept (module docstring)."""
    if recompute and dropout_p > 0 and runs_cpu_kernels(q) and torch.is_grad_enabled() and q.requires_grad:
        return checkpoint(_core, q, k, v, mask, dropout_p, scale, use_reentrant=False)
    return _core(q, k, v, mask, dropout_p, scale)
