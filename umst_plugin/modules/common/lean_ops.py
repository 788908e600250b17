"""What the families' lean paths share: pieces of their hand-written backward passes (the lean GCNs, attention
and fusion blocks: dropout as one op with its 1-byte mask, its backward, LayerNorm's backward in the weight's
dtype), and the switch to their reference path (:func:`use_reference_path`).

A module class that has a plain reference form of its computation sets ``reference_switch = True`` and reads
``self.reference`` (False by default): UMST's blocks and rectified attention (separate Q/K/V projections,
index-based pooling, gather and segment means, ``F.dropout``), MSC's layers, encoder and decoder (fairseq's
attention modules one by one, masks and cross-attention keys/values per layer, fairseq's incremental state).
Both forms are the same math with the same dropout masks (tested in float64); the reference launches more
kernels."""
import torch
from torch import Tensor, nn


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout`` as one op (``torch.native_dropout``: the same mask from the same RNG state on a tensor of
    the same layout, a 1-byte mask kept for backward)."""
    if training and p > 0:
        return torch.native_dropout(x, p, True)[0]
    return x


def dropout_and_mask(t: Tensor, p: float, training: bool):
    """:func:`dropout` and its mask (None where nothing is dropped), for a hand-written backward."""
    if training and p > 0:
        return torch.native_dropout(t, p, True)
    return t, None


def dropout_backward(grad: Tensor, mask, p: float) -> Tensor:
    """The gradient through :func:`dropout_and_mask` (``mask`` None: nothing was dropped)."""
    return grad if mask is None else torch.ops.aten.native_dropout_backward(grad, mask, 1.0 / (1.0 - p))


def layer_norm_backward(grad, x, mean, rstd, weight, bias, need):
    """``native_layer_norm_backward`` with the gradient and the input in the dtype of the LayerNorm's weight
    (float32 under autocast, where a matmul of the backward pass can hand a bf16/fp16 gradient to a float32
    block input; bf16 in a pure-bf16 model). The kernels expect them to match the weight (seen on CUDA:
    "expected scalar type Float but found BFloat16")."""
    dtype = weight.dtype if weight is not None else x.dtype
    return torch.ops.aten.native_layer_norm_backward(grad.to(dtype), x.to(dtype), [x.size(-1)], mean, rstd,
                                                     weight, bias, need)


def use_reference_path(module: nn.Module, on: bool = True) -> nn.Module:
    """Run every module under ``module`` that has a reference form (``reference_switch``) in it, or back in the
    default form (``on=False``); returns ``module``."""
    for m in module.modules():
        if getattr(type(m), "reference_switch", False):
            m.reference = on
    return module
