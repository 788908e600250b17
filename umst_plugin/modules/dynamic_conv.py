"""Dynamic convolution (Wu et al. 2019; Prime's Eq. 6), one implementation on every device, lean in memory.

``out[t, c] = sum_k w[t, h(c), k] x[t + k - P, c]``, the kernel ``w[t, h, :] = softmax(x_t W)`` predicted per
position and head (DropConnect on it in training), x zero-padded (P = ``padding_l`` on the left).

It computes what fairseq's ``DynamicConv1dTBC`` computes in training (``_forward_expanded``: softmax, then
DropConnect, then the band matrix), with the same parameters under the same names (``weight_linear``,
``conv_bias``), so checkpoints load either way; but

* **one implementation on every device.** fairseq's ``DynamicConv`` factory returns its CUDA extension layer on a
  GPU where that extension is built, with other parameters, so a Prime checkpoint trained there did not load on
  a CPU (and back);
* **memory in proportion to the input.** fairseq's training path builds a B x H x T x T band matrix per layer and
  cell and keeps it for backward (the unfolded path keeps a K x copy of the input); here the output is a sum of
  K shifted products, whose backward keeps only the padded input and the kernels (T x B x H x K), as the
  benchmark's saved-bytes column shows (docs/performance.md).

Incremental decoding keeps the last K - 1 inputs, as fairseq's module does.
"""
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor


def dynamic_convolution(x: Tensor, weight: Tensor, padding_l: int) -> Tensor:
    """x: T x B x C, weight: T x B x H x K (normalised kernels) -> T x B x C, zero padding ``padding_l`` left and
    K - 1 - padding_l right. A sum of K shifted products: autograd keeps the padded input and the kernels only."""
    T, B, C = x.shape
    H, K = weight.shape[2], weight.shape[3]
    R = C // H
    padded = F.pad(x, (0, 0, 0, 0, padding_l, K - 1 - padding_l)).view(T + K - 1, B, H, R)
    out = None
    for k in range(K):
        term = padded[k:k + T] * weight[..., k:k + 1]
        out = term if out is None else out + term
    return out.reshape(T, B, C)


@with_incremental_state
class DynamicConv1d(nn.Module):
    """Dynamic convolution over time, T x B x C in and out (fairseq's ``DynamicConv1dTBC`` interface and
    parameters, with ``weight_softmax``; ``renorm_padding`` and ``in_proj`` are not supported)."""

    def __init__(self, input_size, kernel_size=1, padding_l=None, num_heads=1, weight_dropout=0.0,
                 weight_softmax=True, bias=False, conv_bias=False):
        super().__init__()
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

    def _kernels(self, query: Tensor) -> Tensor:
        T, B, _ = query.shape
        weight = self.weight_linear(query).view(T, B, self.num_heads, self.kernel_size)
        if self.weight_softmax:
            weight = F.softmax(weight, dim=-1)
        return F.dropout(weight, p=self.weight_dropout, training=self.training)

    def forward(self, x: Tensor, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                query: Optional[Tensor] = None) -> Tensor:
        weight = self._kernels(x if query is None else query)
        if incremental_state is None:
            out = dynamic_convolution(x, weight, self.padding_l)
        else:
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
