"""Dynamic convolution (Wu et al. 2019; Prime's Eqs. 6-7), one implementation on every device, lean in memory
and in kernel launches.

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
  :class:`DynamicConvolution` keeps the input (which the projection before it keeps anyway), the normalised kernels
  (the size of their logits; in half precision the logits, and the softmax is recomputed) and a 1-byte
  DropConnect mask (docs/performance.md);
* **a fixed number of kernel launches**, whatever the kernel size: the K taps are one multiply of the padded
  input's ``unfold`` view (T x B x H x R x K) with the kernels and one sum over K, forward; backward the kernel
  gradient is the same product with the output gradient summed over R, and the input gradient the transposed
  correlation, the same product again: the padded output gradient's ``unfold`` view with the padded kernels'
  anti-diagonals (an ``as_strided`` view), summed over K. No
  matrix multiply is used (``torch.utils.flop_counter`` would count a bmm), and the K x products are transient;
* **several kernel sizes in one convolution** (Eq. 7): ``sum_i g_i conv_{k_i}(x)`` is one convolution with the
  per-position kernel ``sum_i g_i w_i`` (each cell's kernel after its own DropConnect, zero-padded to the widest
  window with the centres aligned by the cells' ``padding_l``), so :func:`multi_dynamic_convolution` convolves once.

The loop over the taps that this replaced is kept as :func:`reference_dynamic_convolution` (the tests compare the
two, float64, forward and gradients). Incremental decoding keeps the last K - 1 inputs, as fairseq's module does.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor
from torch.autograd.function import once_differentiable

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward, distinct_output
from umst_plugin.modules.common.segment_ops import accumulation_dtype
from umst_plugin.modules.common.tracing import compiling


def combined_window(kernel_sizes: Sequence[int], paddings: Sequence[int]) -> Tuple[int, int, List[int]]:
    """(K, padding_l, offsets): the window that covers every cell's taps (cell i: ``paddings[i]`` steps left,
    ``kernel_sizes[i] - 1 - paddings[i]`` right) and where each cell's taps start in it."""
    left = max(paddings)
    right = max(k - 1 - p for k, p in zip(kernel_sizes, paddings))
    return left + right + 1, left, [left - p for p in paddings]


def dropconnect_keep(shape, p: float, device) -> Tensor:
    """The 1-byte DropConnect mask: True (kept) with probability 1 - p."""
    return torch.empty(shape, dtype=torch.bool, device=device).bernoulli_(1.0 - p)


def _keep_slices(keep: Optional[Tensor], sizes: Sequence[int]) -> List[Optional[Tensor]]:
    if keep is None:
        return [None] * len(sizes)
    out, start = [], 0
    for k in sizes:
        out.append(keep[..., start:start + k])
        start += k
    return out


class DynamicConvolution(torch.autograd.Function):
    """softmax(logits_i) -> DropConnect (``keep``, scale 1/(1-p)) -> mix by ``gates`` into one kernel -> the
    K-tap convolution, as one function. Inputs: x T x B x C; ``gates`` (n,) or None for one cell; ``keep``
    T x B x H x sum(K_i) bool or None; ``offsets``: where each cell's taps start in the K-tap window;
    ``logits``: n tensors T x B x H x K_i. Backward keeps x, the n softmax outputs (half-precision logits: the
    logits), ``keep`` and the n scaled gates; the mixed kernel is rebuilt, no K x copy of the input is kept. Follows autocast
    (``amp_functions``); half-precision inputs are convolved in fp32."""

    @staticmethod
    @amp_forward
    def forward(ctx, x, gates, keep, p, padding_l, offsets, kernel_size, *logits):
        out, probs, gs = DynamicConvolution.convolve(x, gates, keep, p, padding_l, offsets, kernel_size, logits)
        # backward needs the softmax outputs: kept as they are where the logits have the accumulation dtype (the
        # same bytes), recomputed from the logits where those are half precision (half the bytes)
        acc = accumulation_dtype(x.dtype)
        ctx.kept_probs = all(lg.dtype == acc for lg in logits)
        ctx.save_for_backward(x, keep, gs, *(probs if ctx.kept_probs else logits))
        ctx.p, ctx.padding_l, ctx.offsets, ctx.kernel_size = p, padding_l, offsets, kernel_size
        ctx.logit_dtypes = [lg.dtype for lg in logits]
        return distinct_output(out)  # (fp32: out is convolve's ``.to`` of a tensor already fp32)

    @staticmethod
    def convolve(x, gates, keep, p, padding_l, offsets, kernel_size, logits):
        """The forward's arithmetic without autograd: (output, the softmax outputs, the scaled gates). Called
        directly where no gradient is needed (see :func:`multi_dynamic_convolution`)."""
        T, B, C = x.shape
        H, K = logits[0].shape[2], kernel_size
        acc = accumulation_dtype(x.dtype)
        scale = 1.0 / (1.0 - p) if keep is not None else 1.0
        probs = [torch.softmax(lg.to(acc), dim=-1) for lg in logits]
        keeps = _keep_slices(keep, [pr.size(-1) for pr in probs])
        gs = None if gates is None else (gates.to(acc) * scale if keep is not None else gates.to(acc))
        weight = DynamicConvolution._mixed(probs, keeps, gs, scale, offsets, K)
        padded = F.pad(x, (0, 0, 0, 0, padding_l, K - 1 - padding_l)).view(T + K - 1, B, H, C // H)
        out = (_laid_out(padded.unfold(0, K, 1)) * weight.unsqueeze(3)).sum(-1)
        return out.view(T, B, C).to(x.dtype), probs, gs

    @staticmethod
    def _mixed(probs, keeps, gs, scale, offsets, K):
        """The T x B x H x K kernel sum_i g_i (keep_i * softmax_i / (1 - p)), cell i at its offset."""
        if len(probs) == 1:
            if keeps[0] is None:
                return probs[0]
            return (probs[0] * keeps[0]).mul_(scale)
        kept = [pr if kp is None else pr * kp for pr, kp in zip(probs, keeps)]
        # a cell whose taps span the whole window (the widest, centred or causal) starts the sum, else zeros
        first = next((i for i, (pr, o) in enumerate(zip(probs, offsets)) if o == 0 and pr.size(-1) == K), None)
        if first is None:
            weight = kept[0].new_zeros(*kept[0].shape[:-1], K)
        else:
            weight = kept[first] * gs[first]
        for i, (w, o) in enumerate(zip(kept, offsets)):
            if i != first:
                weight[..., o:o + w.size(-1)].addcmul_(w, gs[i])
        return weight

    @staticmethod
    def _transposed(g, weight, padding_l):
        """The input's gradient, the transposed correlation: ``grad_x[s] = sum_j g[s + P - j] w[s + P - j, j]``
        (T x B x H x R; g T x B x H x R, w T x B x H x K, P = ``padding_l``), computed as the forward computes its
        output: with m = K - 1 - j, ``sum_m gp[s + m] * wp[s + m, K - 1 - m]`` where gp and wp are g and w zero-padded
        in time by K - 1 - P before and P after; gp's windows are its ``unfold`` view (as the forward's input's) and
        wp's anti-diagonals an ``as_strided`` view of it (a fresh tensor: offset 0). One product of two views and
        one sum over the K taps: compiled, a single kernel reads g and the kernels once and writes the gradient
        (a GPU program of inductor's), where scattering ``w g`` (T x B x H x K x R, K x the input in fp32) into a
        zero-padded buffer and summing it along a skewed view wrote and read that buffer whole (on a simulated H200,
        4.5 of the 12.1 GB Prime's compiled layers moved in backward per update, 4,096 tokens of WMT14's lengths;
        docs/compile.md)."""
        T, B, H, R = g.shape
        K = weight.size(-1)
        before, after = K - 1 - padding_l, padding_l
        gp = F.pad(g, (0, 0, 0, 0, 0, 0, before, after)).view(T + K - 1, B * H * R)
        windows = _laid_out(gp.unfold(0, K, 1).view(T, B, H, R, K))
        wp = F.pad(weight, (0, 0, 0, 0, 0, 0, before, after))
        st = wp.stride()
        diagonals = wp.as_strided((T, B, H, K), (st[0], st[1], st[2], st[0] - st[3]), (K - 1) * st[3])
        return (windows * diagonals.unsqueeze(3)).sum(-1)

    @staticmethod
    def _backward_windows(x, padding_l, K, H):
        """The T x B x H x R x K windows of the zero-padded input, as the forward's ``padded.unfold(0, K, 1)``, but
        built by other ops (unfold over B*C, then split into heads). Under torch.compile the joint graph's
        common-subexpression pass merged the backward's windows, were they the forward's ops, with the forward's;
        the partitioner then saved that merged view for backward, materialised (K x the input) with strides fixed
        to the first batch's sizes (the layout of its two equal-stride dims, time and tap, is settled by comparing
        their sizes), and the compiled backward failed at the next batch shorter than the kernel with another
        batch size (``assert_size_stride``; issue 63). Built apart, the compiled backward keeps the padded input
        (T + K - 1 x B x C) and recomputes the view; eager: the same values, no other kernel (views only).

        (Padding a T x B*C view here instead, which the joint graph does not merge with the forward's pad, let the
        compiled forward read x through the padding's index arithmetic: on a simulated H200 one kernel and
        6 MB less per layer and update at 4,096 tokens. It also moved inductor's order of the layer's random draws,
        so that the compiled layer, drawing from torch's generator as ``tests/test_compile.py`` compares it, no
        longer drew eager's dropout masks: kept as it is.)"""
        T, B, C = x.shape
        padded = F.pad(x, (0, 0, 0, 0, padding_l, K - 1 - padding_l)).view(T + K - 1, B * C)
        return padded.unfold(0, K, 1).view(T, B, H, C // H, K)

    @staticmethod
    @once_differentiable
    @amp_backward
    def backward(ctx, grad):
        x, keep, gs, *probs = ctx.saved_tensors
        T, B, C = x.shape
        H, K, n = probs[0].size(2), ctx.kernel_size, len(probs)
        R = C // H
        acc = accumulation_dtype(x.dtype)
        if not ctx.kept_probs:
            probs = [torch.softmax(lg.to(acc), dim=-1) for lg in probs]
        scale = 1.0 / (1.0 - ctx.p) if keep is not None else 1.0
        sizes = [pr.size(-1) for pr in probs]
        keeps = _keep_slices(keep, sizes)
        g = grad.reshape(T, B, H, R).to(acc)
        if n == 1:
            stacked = None
            weight = DynamicConvolution._mixed(probs, keeps, None, scale, ctx.offsets, K)
        else:
            # every cell's kept kernel in its place of the window, one row per cell: T x B x H x n x K
            stacked = probs[0].new_zeros(T, B, H, n, K)
            for i, (pr, kp, o) in enumerate(zip(probs, keeps, ctx.offsets)):
                if kp is None:
                    stacked[:, :, :, i, o:o + pr.size(-1)].copy_(pr)
                else:  # in place on zeros (no out=: torch.compile does not take a strided out)
                    stacked[:, :, :, i, o:o + pr.size(-1)].addcmul_(pr, kp)
            weight = (stacked * gs.view(n, 1)).sum(3)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = DynamicConvolution._transposed(g, weight, ctx.padding_l).view(T, B, C).to(x.dtype)
        grad_gates = None
        grad_logits = [None] * n
        if any(ctx.needs_input_grad[7:]) or ctx.needs_input_grad[1]:
            windows = _laid_out(DynamicConvolution._backward_windows(x, ctx.padding_l, K, H))
            grad_weight = (windows * g.unsqueeze(-1)).sum(3)  # T x B x H x K
            if n == 1:
                d = grad_weight if keeps[0] is None else (grad_weight * keeps[0]).mul_(scale)
                grad_logits = [torch._softmax_backward_data(d, probs[0], -1, acc)]
            else:
                if ctx.needs_input_grad[1]:
                    grad_gates = (stacked * grad_weight.unsqueeze(3)).sum((0, 1, 2, 4))
                    if keep is not None:
                        grad_gates = grad_gates.mul_(scale)
                spread = grad_weight.unsqueeze(3) * gs.view(n, 1)  # T x B x H x n x K
                for i, (pr, kp, o) in enumerate(zip(probs, keeps, ctx.offsets)):
                    d = spread[:, :, :, i, o:o + pr.size(-1)]
                    if kp is not None:
                        d = d * kp
                    grad_logits[i] = torch._softmax_backward_data(d, pr, -1, acc)
            grad_logits = [None if gl is None else gl.to(dt) for gl, dt in zip(grad_logits, ctx.logit_dtypes)]
        return (grad_x, grad_gates, None, None, None, None, None, *grad_logits)


def _laid_out(windows: Tensor) -> Tensor:
    """The T x B x H x R x K window view for a product with it: itself in eager code; contiguous under torch.compile.

    The view's time and tap dimensions have equal strides, and torch settles the layout of an elementwise product
    with such a tensor by comparing their sizes, T against K (``compute_elementwise_output_logical_to_physical_perm``
    in ``torch._prims_common``). Traced with dynamic shapes, that comparison became a guard: one compiled program for
    sources shorter than the widest kernel and one for the others, in the forward and in the backward (a second
    compile of every Prime layer class, some thousand updates into a run). Contiguous, the product has one layout.
    Inductor reads the view's elements inside the product's kernel, so this adds no kernel and no buffer; eager
    code keeps the view (a copy there would be a K x copy of the input and one more kernel)."""
    return windows.contiguous() if compiling() else windows


def multi_dynamic_convolution(x: Tensor, logits: Sequence[Tensor], paddings: Sequence[int],
                              gates: Optional[Tensor] = None, dropout: float = 0.0, training: bool = False,
                              keep: Optional[Tensor] = None) -> Tensor:
    """sum_i gates_i DynConv_i(x) (Eq. 7; one cell: gates None) as one convolution. x: T x B x C; logits: one
    T x B x H x K_i tensor per cell (its predicted kernels before the softmax), cell i zero-padded by
    ``paddings[i]`` on the left and K_i - 1 - paddings[i] on the right; DropConnect ``dropout`` on each cell's
    normalised kernels in training (``keep``: the T x B x H x sum(K_i) mask to use instead of a fresh one)."""
    sizes = [lg.size(-1) for lg in logits]
    K, padding_l, offsets = combined_window(sizes, paddings)
    if keep is None and training and dropout > 0:
        keep = dropconnect_keep((*logits[0].shape[:-1], sum(sizes)), dropout, logits[0].device)
    if not (training and dropout > 0):
        keep = None
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (x, gates, *logits)):
        # no gradient needed (evaluation, decoding): the same arithmetic without the autograd function, which
        # dynamo cannot trace without autograd (--compile's evaluation programs: "Observed exception")
        return DynamicConvolution.convolve(x, gates, keep, dropout, padding_l, offsets, K, logits)[0]
    return DynamicConvolution.apply(x, gates, keep, dropout, padding_l, offsets, K, *logits)


def dynamic_convolution(x: Tensor, logits: Tensor, padding_l: int, dropout: float = 0.0,
                        training: bool = False, keep: Optional[Tensor] = None) -> Tensor:
    """x: T x B x C, logits: T x B x H x K (the predicted kernels before their softmax) -> T x B x C, zero
    padding ``padding_l`` left and K - 1 - padding_l right; DropConnect ``dropout`` on the normalised kernels in
    training."""
    return multi_dynamic_convolution(x, [logits], [padding_l], None, dropout, training, keep)


class _LoopDynamicConvolution(torch.autograd.Function):
    """The reference: the same function as a loop over the K taps (one multiply-add per tap forward, four ops per
    tap backward), as this module computed it before :class:`DynamicConvolution`."""

    @staticmethod
    def forward(ctx, x, logits, keep, p, padding_l):
        T, B, C = x.shape
        H, K = logits.shape[2], logits.shape[3]
        acc = accumulation_dtype(x.dtype)
        weight = _LoopDynamicConvolution._kernels(logits, keep, p, acc)
        padded = F.pad(x, (0, 0, 0, 0, padding_l, K - 1 - padding_l)).view(T + K - 1, B, H, C // H)
        out = torch.zeros(T, B, H, C // H, dtype=acc, device=x.device)
        for k in range(K):
            out.addcmul_(padded[k:k + T], weight[..., k:k + 1])
        ctx.save_for_backward(x, logits, keep)
        ctx.p, ctx.padding_l = p, padding_l
        return distinct_output(out.view(T, B, C).to(x.dtype))

    @staticmethod
    def _kernels(logits, keep, p, acc):
        weight = torch.softmax(logits.to(acc), dim=-1)
        return weight if keep is None else weight * keep * (1.0 / (1.0 - p))

    @staticmethod
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
        grad_padded = torch.zeros(T + K - 1, B, H, R, dtype=acc, device=x.device)
        grad_weight = torch.empty(T, B, H, K, dtype=acc, device=x.device)
        for k in range(K):
            grad_weight[..., k] = (g * padded[k:k + T]).sum(-1)
            grad_padded[k:k + T].addcmul_(g, weight[..., k:k + 1])
        grad_x = grad_padded[ctx.padding_l:ctx.padding_l + T].reshape(T, B, C).to(x.dtype)
        grad_probs = grad_weight if keep is None else grad_weight * keep * (1.0 / (1.0 - ctx.p))
        grad_logits = (probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))).to(logits.dtype)
        return grad_x, grad_logits, None, None, None


def reference_dynamic_convolution(x: Tensor, logits: Tensor, padding_l: int, keep: Optional[Tensor] = None,
                                  p: float = 0.0) -> Tensor:
    """The loop-over-taps reference of :func:`dynamic_convolution` (one cell, DropConnect mask ``keep``)."""
    return _LoopDynamicConvolution.apply(x, logits, keep, p, padding_l)


def step_dynamic_convolution(window: Tensor, weight: Tensor) -> Tensor:
    """One causal decoding step: ``window`` n x B x C (the last n inputs, this one last), ``weight`` B x H x K
    (the mixed kernel of this step, K >= n; its last n taps meet the n inputs, zeros before) -> 1 x B x C."""
    n, B, C = window.shape
    H = weight.size(1)
    taps = weight[:, :, weight.size(-1) - n:].permute(2, 0, 1).unsqueeze(-1).to(window.dtype)  # n x B x H x 1
    return (window.view(n, B, H, C // H) * taps).sum(0).view(1, B, C)


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
        K = self.kernel_size
        buffer = utils.get_incremental_state(self, incremental_state, "input_buffer")
        window = x if buffer is None else torch.cat([buffer, x], dim=0)  # n x B x C, n <= K
        if K > 1:
            utils.set_incremental_state(self, incremental_state, "input_buffer", window[-(K - 1):])
        return step_dynamic_convolution(window, weight[0])

    def reorder_incremental_state(self, incremental_state, new_order):
        buffer = utils.get_incremental_state(self, incremental_state, "input_buffer")
        if buffer is not None:
            utils.set_incremental_state(self, incremental_state, "input_buffer", buffer.index_select(1, new_order))

    def extra_repr(self):
        return (f"{self.input_size}, kernel_size={self.kernel_size}, padding_l={self.padding_l}, "
                f"num_heads={self.num_heads}, weight_softmax={self.weight_softmax}, "
                f"weight_dropout={self.weight_dropout}")
