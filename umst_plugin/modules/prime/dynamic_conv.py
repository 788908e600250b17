"""Dynamic convolution (Wu et al. 2019; Prime's Eq. 6), one implementation on every device, lean in memory.

``out[t, c] = sum_k w[t, h(c), k] x[t + k - P, c]``, the kernel ``w[t, h, :] = softmax(x_t W)`` predicted per
position and head (DropConnect on it in training), x zero-padded (P = ``padding_l`` on the left).

It computes what fairseq's ``DynamicConv1dTBC`` computes in training (``_forward_expanded``: softmax, then
DropConnect, then the band matrix), with the same parameters under the same names (``weight_linear``,
``conv_bias``), so checkpoints load either way; but

* **one implementation on every device.** fairseq's ``DynamicConv`` factory returns its CUDA extension layer on a
  GPU where that extension is built, with other parameters, so a Prime checkpoint trained there did not load on
  a CPU (and back);
* **memory in proportion to the input.** fairseq's training path keeps, per layer and cell, the softmax output
  (T x B x H x K) and a B x H x T x T band matrix for backward (its unfolded path a K x copy of the input);
  :class:`DynamicConvolution` keeps the input (which the projection before it keeps anyway), the kernel logits
  and a 1-byte DropConnect mask, and recomputes the K-tap softmax in backward (docs/performance.md).

Incremental decoding keeps the last K - 1 inputs, as fairseq's module does.
"""
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward
from umst_plugin.modules.common.segment_ops import accumulation_dtype


def _shifted(padded: Tensor, k: int, length: int) -> Tensor:
    return padded[k:k + length]


class DynamicConvolution(torch.autograd.Function):
    """softmax(logits) -> DropConnect (``keep`` mask, scale 1/(1-p)) -> the K-tap convolution, as one function
    whose backward keeps the input ``x``, the kernel ``logits`` and the 1-byte ``keep`` mask (x is kept by the
    projection that made the logits anyway): the kernels are recomputed (a softmax over K), never stored, and no
    unfolded K x copy of the input nor T x T band matrix exists. Shapes: x T x B x C, logits and keep
    T x B x H x K; the output T x B x C. Follows autocast (``amp_functions``); half-precision taps accumulate in fp32."""

    @staticmethod
    @amp_forward
    def forward(ctx, x, logits, keep, p, padding_l):
        T, B, C = x.shape
        H, K = logits.shape[2], logits.shape[3]
        acc = accumulation_dtype(x.dtype)
        weight = DynamicConvolution._kernels(logits, keep, p, acc)
        padded = F.pad(x, (0, 0, 0, 0, padding_l, K - 1 - padding_l)).view(T + K - 1, B, H, C // H)
        out = torch.zeros(T, B, H, C // H, dtype=acc, device=x.device)
        for k in range(K):
            out.addcmul_(_shifted(padded, k, T), weight[..., k:k + 1])
        ctx.save_for_backward(x, logits, keep)
        ctx.p, ctx.padding_l = p, padding_l
        return out.view(T, B, C).to(x.dtype)

    @staticmethod
    def _kernels(logits, keep, p, acc):
        weight = torch.softmax(logits.to(acc), dim=-1)
        return weight if keep is None else weight * keep * (1.0 / (1.0 - p))

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        x, logits, keep = ctx.saved_tensors
        T, B, C = x.shape
        H, K = logits.shape[2], logits.shape[3]
        R = C // H
        acc = accumulation_dtype(x.dtype)
        probs = torch.softmax(logits.to(acc), dim=-1)
        weight = probs if keep is None else probs * keep * (1.0 / (1.0 - ctx.p))
        g = grad.reshape(T, B, H, R).to(acc)
        padded = F.pad(x, (0, 0, 0, 0, ctx.padding_l, K - 1 - ctx.padding_l)).view(T + K - 1, B, H, R)
        grad_padded = torch.zeros(T + K - 1, B, H, R, dtype=acc, device=x.device) if ctx.needs_input_grad[0] else None
        grad_weight = torch.empty(T, B, H, K, dtype=acc, device=x.device)
        for k in range(K):
            grad_weight[..., k] = (g * _shifted(padded, k, T)).sum(-1)
            if grad_padded is not None:
                grad_padded[k:k + T].addcmul_(g, weight[..., k:k + 1])
        grad_x = grad_padded[ctx.padding_l:ctx.padding_l + T].reshape(T, B, C).to(x.dtype) \
            if grad_padded is not None else None
        grad_logits = None
        if ctx.needs_input_grad[1]:
            grad_probs = grad_weight if keep is None else grad_weight * keep * (1.0 / (1.0 - ctx.p))
            grad_logits = (probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))).to(logits.dtype)
        return grad_x, grad_logits, None, None, None


def dynamic_convolution(x: Tensor, logits: Tensor, padding_l: int, dropout: float = 0.0,
                        training: bool = False) -> Tensor:
    """x: T x B x C, logits: T x B x H x K (the predicted kernels before their softmax) -> T x B x C, zero
    padding ``padding_l`` left and K - 1 - padding_l right; DropConnect ``dropout`` on the normalised kernels in
    training."""
    keep = None
    if training and dropout > 0:
        keep = torch.rand(logits.shape, device=logits.device) >= dropout
    return DynamicConvolution.apply(x, logits, keep, dropout, padding_l)


@with_incremental_state
class DynamicConv1d(nn.Module):
    """Dynamic convolution over time, T x B x C in and out (fairseq's ``DynamicConv1dTBC`` interface and
    parameters, with ``weight_softmax``; ``renorm_padding`` and ``in_proj`` are not supported)."""

    def __init__(self, input_size, kernel_size=1, padding_l=None, num_heads=1, weight_dropout=0.0,
                 weight_softmax=True, bias=False, conv_bias=False):
        super().__init__()
        if not weight_softmax:
            raise ValueError("DynamicConv1d normalises its kernels with a softmax (weight_softmax=True), as Prime does")
        if input_size % num_heads:
            raise ValueError(f"input size {input_size} is not divisible by {num_heads} convolution heads")
        self.input_size, self.kernel_size, self.num_heads = input_size, kernel_size, num_heads
        self.padding_l = kernel_size // 2 if padding_l is None else padding_l
        self.weight_dropout = weight_dropout
        self.weight_softmax = weight_softmax
        # fairseq's construction order (Linear with xavier, then reset_parameters), so that the same seed gives
        # the same initial weights as DynamicConv1dTBC, here and in every parameter built after it
        self.weight_linear = nn.Linear(input_size, num_heads * kernel_size, bias=bias)
        nn.init.xavier_uniform_(self.weight_linear.weight)
        if bias:
            nn.init.constant_(self.weight_linear.bias, 0.0)
        self.conv_bias = nn.Parameter(torch.zeros(input_size)) if conv_bias else None
        self.reset_parameters()

    def reset_parameters(self):
        self.weight_linear.reset_parameters()
        if self.conv_bias is not None:
            nn.init.constant_(self.conv_bias, 0.0)

    def forward(self, x: Tensor, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                query: Optional[Tensor] = None) -> Tensor:
        query = x if query is None else query
        T, B, _ = query.shape
        logits = self.weight_linear(query).view(T, B, self.num_heads, self.kernel_size)
        if incremental_state is None:
            out = dynamic_convolution(x, logits, self.padding_l, self.weight_dropout, self.training)
        else:
            weight = F.dropout(F.softmax(logits, dim=-1), p=self.weight_dropout, training=self.training)
            out = self._step(x, weight, incremental_state)
        if self.conv_bias is not None:
            out = out + self.conv_bias.view(1, 1, -1)
        return out

    def _step(self, x: Tensor, weight: Tensor, incremental_state) -> Tensor:
        """One decoding step (T = 1, causal): the last K - 1 inputs from the buffer, then this one."""
        T, B, C = x.shape
        H, K = self.num_heads, self.kernel_size
        buffer = utils.get_incremental_state(self, incremental_state, "input_buffer")
        window = x if buffer is None else torch.cat([buffer, x], dim=0)  # n x B x C, n <= K
        if K > 1:
            utils.set_incremental_state(self, incremental_state, "input_buffer", window[-(K - 1):])
        n = window.size(0)
        taps = weight[:, :, :, K - n:].reshape(B, H, n)  # the last n taps meet the n inputs (zeros before)
        out = torch.einsum("nbhr,bhn->bhr", window.view(n, B, H, C // H), taps.to(window.dtype))
        return out.reshape(1, B, C)

    def reorder_incremental_state(self, incremental_state, new_order):
        buffer = utils.get_incremental_state(self, incremental_state, "input_buffer")
        if buffer is not None:
            utils.set_incremental_state(self, incremental_state, "input_buffer", buffer.index_select(1, new_order))

    def extra_repr(self):
        return (f"{self.input_size}, kernel_size={self.kernel_size}, padding_l={self.padding_l}, "
                f"num_heads={self.num_heads}, weight_softmax={self.weight_softmax}, "
                f"weight_dropout={self.weight_dropout}")
