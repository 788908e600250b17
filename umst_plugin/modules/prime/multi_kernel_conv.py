"""Prime's convolution branch: several kernel-size cells mixed by a learned softmax gate.

Unified Transformer paper (Zhao et al.), section 2.1:

    V_C       = X W_1^C                                                (Eq. 5, done by the caller)
    D_{i,c}   = sum_j softmax_j(sum_c W_{j,c} V_{i,c}) V_{i+j-ceil((k+1)/2), c}   (Eq. 6)
    Conv(X)   = sum_i softmax(alpha)_i DepthConv_{k_i}(V_C)             (Eq. 7; W_2^C applied by the caller)

Eq. 6 is Wu et al.'s dynamic convolution: per-position kernels predicted from the
input, softmax-normalised over the window, one kernel per head shared by the
d/H channels of that head: each cell is a ``modules.prime.dynamic_conv.DynamicConv1d`` (the
parameters of fairseq's ``DynamicConv1dTBC``, under the same names), and the cells are computed together:
each cell predicts its kernels with its own ``weight_linear`` (the cells' weights applied as one product of
their concatenation), and since the convolution is linear in its
kernel, ``sum_i g_i conv_{k_i}(x)`` is ONE convolution with the per-position kernel ``sum_i g_i w_i`` (each
cell's kernel after its own DropConnect, zero-padded to the widest window with the centres aligned as the
cells' ``padding_l`` place them): ``dynamic_conv.multi_dynamic_convolution``, a fixed number of kernel
launches whatever the kernel sizes, keeping only the input, the normalised kernels and a 1-byte DropConnect
mask for backward. Incremental decoding keeps one buffer of the last K - 1 inputs for all cells (or reads
them from the caller's value cache, Shared Projection) and, at inference, predicts every cell's kernel with
one matrix multiply (``_JointPredictor``).
fairseq's module does not know about padding, so :class:`MultiKernelConv`
zeroes padded positions of its input itself: a sentence then sees zeros
beyond its ends whatever its batch-mates or its padding side, exactly as if it
were convolved alone with zero "same" (or causal) padding.

The output projection W_2^C is shared by the cells (Eq. 5 uses one W_2^C), so
mixing before the projection, as done here, equals mixing the projected cells.

``conv_type="standard"`` replaces DepthConv_k with an ordinary (not separable)
1-d convolution, the table 6 ablation "Substitute DepthConv with Convolution".
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor

from umst_plugin.modules.common.amp_functions import autocast_cast
from umst_plugin.modules.common.tracing import compiling
from umst_plugin.modules.prime.dynamic_conv import (DynamicConv1d, combined_window, multi_dynamic_convolution,
                                                    step_dynamic_convolution)

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


@with_incremental_state
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
        paddings = []
        for k in kernel_sizes:
            padding_l = k - 1 if causal else same_padding_left(k)
            paddings.append(padding_l)
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
        self.paddings: List[int] = paddings
        # the window that covers every cell: K taps, padding_l to the left; cell i starts at offsets[i]
        self.window, self.window_padding_l, self.offsets = combined_window(kernel_sizes, paddings)
        # alpha_i of Eq. 7, initialised equal (1/n, as the authors' code); a single cell needs no gate
        n = len(kernel_sizes)
        self.gate_logits = nn.Parameter(torch.full((n,), 1.0 / n)) if n > 1 else None
        self._joint = None  # inference cache of the joint kernel predictor (_joint_predictor)

    def gate_weights(self) -> Optional[Tensor]:
        """softmax(alpha): the share of each kernel size (figure 8 of the paper)."""
        return None if self.gate_logits is None else torch.softmax(self.gate_logits.float(), dim=0)

    def forward(
        self,
        x: Tensor,
        padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        history: Optional[Tensor] = None,
    ) -> Tensor:
        """``history`` (incremental decoding only): the last inputs up to and including this step, n x B x C, kept by
        the caller (Shared Projection: the attention's value cache); without it the module keeps its own buffer."""
        if incremental_state is not None and not self.causal:
            raise ValueError("incremental decoding needs a causal convolution")
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)
        if self.conv_type != "dynamic":
            return self._standard(x if padding_mask is not None else x.contiguous(), incremental_state)
        if incremental_state is not None:
            return self._step(x, incremental_state, history)
        logits = self._cell_logits(x)
        gates = None if self.gate_logits is None else torch.softmax(self.gate_logits, dim=0)
        p = self.cells[0].weight_dropout
        return multi_dynamic_convolution(x, logits, self.paddings, gates, p, self.training)

    def _cell_logits(self, x: Tensor) -> List[Tensor]:
        """Every cell's kernel logits (T x B x H x K_i) from one product: the cells' predictor weights concatenated
        (output rows), each cast whole first under autocast (the parameter cast cache casts it once per update),
        so training runs one multiply forward and two backward whatever the number of cells, where a product per
        cell ran n and 2n. The slices are the cells' ``weight_linear(x)`` (``tests/test_prime_lean.py``)."""
        T, B, _ = x.shape
        cells = self.cells
        if len(cells) == 1:
            cell = cells[0]
            return [cell.weight_linear(x).view(T, B, cell.num_heads, cell.kernel_size)]
        linears = [cell.weight_linear for cell in cells]
        weight = torch.cat([autocast_cast(lin.weight) for lin in linears])
        bias = None
        if linears[0].bias is not None:
            bias = torch.cat([autocast_cast(lin.bias) for lin in linears])
        flat = F.linear(x, weight, bias)
        parts = flat.split([lin.out_features for lin in linears], dim=-1)
        return [part.view(T, B, cell.num_heads, cell.kernel_size) for part, cell in zip(parts, cells)]

    def _standard(self, x: Tensor, incremental_state) -> Tensor:
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

    # ------------------------------------------------------------------ incremental decoding (dynamic)
    def _step(self, x: Tensor, incremental_state, history: Optional[Tensor]) -> Tensor:
        """One causal step: the mixed kernel of this step (B x H x K) applied to the last K inputs."""
        K = self.window
        if history is None:
            buffer = self.get_incremental_state(incremental_state, "input_buffer")
            window = x if buffer is None else torch.cat([buffer, x], dim=0)
            if K > 1:
                self.set_incremental_state(incremental_state, "input_buffer", window[-(K - 1):])
        else:
            window = history[-K:]
        return step_dynamic_convolution(window, self._step_kernel(x[0]))

    def _step_kernel(self, x: Tensor) -> Tensor:
        """B x C -> the B x H x K kernel sum_i g_i softmax(x W_i) (cells zero-padded to the causal window)."""
        B = x.size(0)
        H, n, K = self.cells[0].num_heads, len(self.cells), self.window
        if torch.is_grad_enabled() or (self.training and self.cells[0].weight_dropout > 0) or compiling():
            gates = None if self.gate_logits is None else torch.softmax(self.gate_logits, dim=0)
            weight = None
            for i, (cell, o) in enumerate(zip(self.cells, self.offsets)):
                w = F.softmax(cell.weight_linear(x).view(B, H, cell.kernel_size), dim=-1)
                w = F.dropout(w, p=cell.weight_dropout, training=self.training)
                if gates is not None:
                    w = w * gates[i]
                w = F.pad(w, (o, K - o - w.size(-1)))
                weight = w if weight is None else weight + w
            return weight
        # inference: every cell's logits in one multiply, laid out H x n x K with -inf outside each cell's taps, so
        # that one softmax normalises each cell over its own taps; the gates mix the cells
        W, b, gates = self._joint_predictor()
        probs = torch.softmax(F.linear(x, W, b).view(B, H, n, K), dim=-1)
        return probs[:, :, 0] if gates is None else torch.matmul(gates, probs)

    def _joint_predictor(self) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """(weight H*n*K x C, bias (-inf outside each cell's taps) or None, softmax(alpha) or None), built from the
        cells' parameters and cached while they are unchanged (in-place updates bump their versions)."""
        params = [cell.weight_linear.weight for cell in self.cells]
        if self.gate_logits is not None:
            params.append(self.gate_logits)
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in params)
        if self._joint is not None and self._joint[0] == key:
            return self._joint[1]
        H, n, K = self.cells[0].num_heads, len(self.cells), self.window
        first = self.cells[0].weight_linear.weight
        if n == 1:
            lin = self.cells[0].weight_linear
            value = (lin.weight.detach(), None if lin.bias is None else lin.bias.detach(), None)
        else:
            weight = first.new_zeros(H, n, K, first.size(1))
            bias = first.new_full((H, n, K), float("-inf"))
            for i, (cell, o) in enumerate(zip(self.cells, self.offsets)):
                k = cell.kernel_size
                weight[:, i, o:o + k] = cell.weight_linear.weight.detach().view(H, k, -1)
                bias[:, i, o:o + k] = 0.0 if cell.weight_linear.bias is None else \
                    cell.weight_linear.bias.detach().view(H, k)
            value = (weight.view(H * n * K, -1), bias.view(-1), torch.softmax(self.gate_logits.detach(), dim=0))
        self._joint = (key, value)
        return value

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        buffer = self.get_incremental_state(incremental_state, "input_buffer")
        if buffer is not None:
            self.set_incremental_state(incremental_state, "input_buffer", buffer.index_select(1, new_order))
