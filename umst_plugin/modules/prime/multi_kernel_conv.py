"""Prime's convolution branch: several kernel-size cells mixed by a learned softmax gate.

Unified Transformer paper (Zhao et al.), section 2.1:

    V_C       = X W_1^C                                                (Eq. 5, done by the caller)
    D_{i,c}   = sum_j softmax_j(sum_c W_{j,c} V_{i,c}) V_{i+j-ceil((k+1)/2), c}   (Eq. 6)
    Conv(X)   = sum_i softmax(alpha)_i DepthConv_{k_i}(V_C)             (Eq. 7; W_2^C applied by the caller)

Eq. 6 is Wu et al.'s dynamic convolution: per-position kernels predicted from the
input, softmax-normalised over the window, one kernel per head shared by the
d/H channels of that head: ``modules.dynamic_conv.DynamicConv1d``, the computation and
parameters of fairseq's ``DynamicConv1dTBC`` in one implementation on every device (fairseq's
``DynamicConv`` factory switched to its CUDA extension, with other parameters, where that is built)
that keeps only its input and kernels for backward, with the causal incremental buffer.
fairseq's module does not know about padding, so :class:`MultiKernelConv`
zeroes padded positions of its input itself: a sentence then sees zeros
beyond its ends whatever its batch-mates or its padding side, exactly as if it
were convolved alone with zero "same" (or causal) padding.

The output projection W_2^C is shared by the cells (Eq. 5 uses one W_2^C), so
mixing before the projection, as done here, equals mixing the projected cells.

``conv_type="standard"`` replaces DepthConv_k with an ordinary (not separable)
1-d convolution, the table 6 ablation "Substitute DepthConv with Convolution".
"""
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor

from umst_plugin.modules.prime.dynamic_conv import DynamicConv1d

CONV_TYPES = ("dynamic", "standard")


def same_padding_left(kernel_size: int) -> int:
    """Left context of Eq. 6's window: tap j (1-based) reads position i + j - ceil((k+1)/2), so
    ceil((k+1)/2) - 1 = k // 2 steps to the left (an even kernel sees one more step left than right)."""
    return kernel_size // 2


@with_incremental_state
class StandardConv1dTBC(nn.Module):
    """Ordinary 1-d convolution over time (all channels mixed), T x B x C in and out.

    ``padding_l`` zeros go left and ``kernel_size - 1 - padding_l`` right; a
    causal convolution uses ``padding_l = kernel_size - 1`` and then supports
    incremental decoding with a buffer of the last ``kernel_size - 1`` inputs.
    """

    def __init__(self, channels: int, kernel_size: int, padding_l: int):
        super().__init__()
        if not 0 <= padding_l < kernel_size:
            raise ValueError(f"padding_l must be in [0, {kernel_size}), got {padding_l}")
        self.kernel_size = kernel_size
        self.padding_l = padding_l
        self.conv = nn.Conv1d(channels, channels, kernel_size)

    def forward(self, x: Tensor, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None):
        K = self.kernel_size
        if incremental_state is not None:
            if self.padding_l != K - 1:
                raise ValueError("incremental decoding needs a causal convolution (padding_l = kernel_size - 1)")
            if x.size(0) != 1:
                raise ValueError("incremental decoding feeds one time step at a time")
            state = self.get_incremental_state(incremental_state, "conv_state")
            window = x if state is None else torch.cat([state["input_buffer"], x], dim=0)
            if K > 1:
                self.set_incremental_state(incremental_state, "conv_state", {"input_buffer": window[-(K - 1):]})
            # steps before the start of the sentence are zeros, as in the full-sequence causal padding
            window = F.pad(window, (0, 0, 0, 0, K - window.size(0), 0))
            return self.conv(window.permute(1, 2, 0)).permute(2, 0, 1)
        x = F.pad(x.permute(1, 2, 0), (self.padding_l, K - 1 - self.padding_l))
        return self.conv(x).permute(2, 0, 1)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "conv_state")
        if state is not None:
            state = {"input_buffer": state["input_buffer"].index_select(1, new_order)}
            self.set_incremental_state(incremental_state, "conv_state", state)


class MultiKernelConv(nn.Module):
    """Eq. 7: softmax(alpha)-weighted sum of convolution cells of different kernel sizes.

    Args:
        channels: feature size d of the (already projected) input V_C.
        kernel_sizes: one cell per entry; a single entry gives a plain single-kernel
            convolution with no gate parameter.
        num_heads: dynamic-convolution heads (one predicted kernel per head).
        causal: decoder-side convolution (only looks left; supports incremental decoding).
        conv_type: "dynamic" (Eq. 6, default) or "standard" (table 6 ablation).
        weight_dropout: DropConnect on the predicted dynamic kernels.

    Input/Output: T x B x C; ``padding_mask`` is B x T, True at padding.
    """

    def __init__(
        self,
        channels: int,
        kernel_sizes: Sequence[int],
        num_heads: int,
        causal: bool,
        conv_type: str = "dynamic",
        weight_dropout: float = 0.0,
    ):
        super().__init__()
        kernel_sizes = [int(k) for k in kernel_sizes]
        if not kernel_sizes:
            raise ValueError("MultiKernelConv needs at least one kernel size")
        if any(k < 1 for k in kernel_sizes):
            raise ValueError(f"kernel sizes must be >= 1, got {kernel_sizes}")
        if conv_type not in CONV_TYPES:
            raise ValueError(f"conv_type must be one of {CONV_TYPES}, got {conv_type!r}")
        if conv_type == "dynamic" and 1 in kernel_sizes:
            raise ValueError("a dynamic convolution of kernel size 1 is the identity (softmax over one tap) and its "
                             "kernel predictor could never learn; use kernel sizes >= 2 (or --prime-conv-type standard)")
        if conv_type == "dynamic" and channels % num_heads != 0:
            raise ValueError(f"channels ({channels}) must be divisible by the convolution heads ({num_heads})")
        self.kernel_sizes: List[int] = kernel_sizes
        self.causal = causal
        self.conv_type = conv_type
        cells = []
        for k in kernel_sizes:
            padding_l = k - 1 if causal else same_padding_left(k)
            if conv_type == "dynamic":
                cells.append(
                    DynamicConv1d(
                        channels,
                        kernel_size=k,
                        padding_l=padding_l,
                        num_heads=num_heads,
                        weight_dropout=weight_dropout,
                        weight_softmax=True,
                        bias=False,
                    )
                )
            else:
                cells.append(StandardConv1dTBC(channels, k, padding_l))
        self.cells = nn.ModuleList(cells)
        # alpha_i of Eq. 7, initialised equal (1/n, as the authors' code); a single cell needs no gate
        n = len(kernel_sizes)
        self.gate_logits = nn.Parameter(torch.full((n,), 1.0 / n)) if n > 1 else None

    def gate_weights(self) -> Optional[Tensor]:
        """softmax(alpha): the share of each kernel size (figure 8 of the paper)."""
        return None if self.gate_logits is None else torch.softmax(self.gate_logits.float(), dim=0)

    def forward(
        self,
        x: Tensor,
        padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    ) -> Tensor:
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)
        else:
            x = x.contiguous()  # fairseq's DynamicConv views its input (ours may be a slice of a fused projection)
        if incremental_state is not None and not self.causal:
            raise ValueError("incremental decoding needs a causal convolution")
        if self.gate_logits is None:
            return self.cells[0](x, incremental_state=incremental_state)
        gates = torch.softmax(self.gate_logits, dim=0)
        if gates.dtype != x.dtype:
            gates = gates.to(x.dtype)
        out = None
        for i, cell in enumerate(self.cells):
            y = cell(x, incremental_state=incremental_state) * gates[i]
            out = y if out is None else out + y
        return out
