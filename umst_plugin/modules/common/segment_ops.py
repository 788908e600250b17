"""Per-segment reductions over flat rows and the half-precision rule they share.

Several blocks average tokens into groups (subwords into words, characters into subwords,
the same-word GCN): each flattens (sentence, group) into one row index and sums with
``index_add_``. Sums of fp16/bf16 rows accumulate in fp32 so long groups do not overflow; the
same rule sends fp16/bf16 attention scores through softmax in fp32, as fairseq does.
"""
from typing import Optional

import torch
from torch import Tensor

_HALF = (torch.float16, torch.bfloat16)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp16/bf16, else ``dtype`` itself."""
    return torch.float32 if dtype in _HALF else dtype


def upcast_half(t: Tensor) -> Tensor:
    """``t`` in fp32 if it is fp16/bf16 (softmax inputs, sums), else unchanged."""
    return t.float() if t.dtype in _HALF else t


def segment_sum(rows: Tensor, index: Tensor, n_rows: int, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Rows of ``rows`` (N x C) summed into ``n_rows`` rows by ``index`` (N), in ``dtype``
    (default: the accumulation dtype of ``rows``)."""
    dtype = accumulation_dtype(rows.dtype) if dtype is None else dtype
    return rows.new_zeros(n_rows, rows.size(-1), dtype=dtype).index_add_(0, index, rows.to(dtype))


def segment_mean(rows: Tensor, index: Tensor, n_rows: int) -> Tensor:
    """Per-row means of ``rows`` grouped by ``index`` (accumulation dtype; 0 for empty rows)."""
    sums = segment_sum(rows, index, n_rows)
    counts = torch.zeros(n_rows, device=rows.device, dtype=sums.dtype)
    counts.index_add_(0, index, torch.ones_like(index, dtype=sums.dtype))
    return sums / counts.clamp(min=1).unsqueeze(1)
