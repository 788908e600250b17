"""umst_plugin/modules/prime/dynamic_conv.py equals fairseq's DynamicConv1dTBC (the training path Prime used), in
float64, forward and gradients, and keeps only the input and the kernels for backward."""
import pytest
import torch
from fairseq.modules.dynamic_convolution import DynamicConv1dTBC

from umst_plugin.modules.prime.dynamic_conv import (DynamicConv1d, dynamic_convolution, multi_dynamic_convolution,
                                                    reference_dynamic_convolution)


def pair(channels, kernel, heads, padding_l, seed=0):
    torch.manual_seed(seed)
    ours = DynamicConv1d(channels, kernel, padding_l, heads, weight_softmax=True).double()
    torch.manual_seed(seed)
    theirs = DynamicConv1dTBC(channels, kernel, padding_l, heads, weight_softmax=True).double()
    return ours, theirs


@pytest.mark.parametrize("kernel,causal,length", [(3, False, 9), (15, False, 9), (15, True, 9), (4, False, 20),
                                                 (7, True, 3), (2, True, 1)])
def test_equals_fairseq_forward_and_gradients(kernel, causal, length):
    ours, theirs = pair(16, kernel, 4, kernel - 1 if causal else kernel // 2)
    assert torch.equal(ours.weight_linear.weight, theirs.weight_linear.weight)  # same init from the same seed
    x = torch.randn(length, 3, 16, dtype=torch.float64)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [ours(xs[0]), theirs(xs[1], unfold=False)]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(outs[0])
    for o in outs:
        o.backward(grad)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.weight_linear.weight.grad, theirs.weight_linear.weight.grad, rtol=1e-12,
                               atol=1e-12)


def test_state_dicts_are_interchangeable():
    ours, theirs = pair(16, 5, 4, 2)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    other = DynamicConv1d(16, 5, 2, 4).double()
    other.load_state_dict(theirs.state_dict())
    x = torch.randn(6, 2, 16, dtype=torch.float64)
    torch.testing.assert_close(other(x), theirs(x, unfold=False))


def test_biases_equal_fairseqs():
    """The kernel predictor's bias and the convolution's output bias (``bias``, ``conv_bias``), both set to values
    that are not zero, as fairseq adds them."""
    torch.manual_seed(0)
    ours = DynamicConv1d(16, 5, 2, 4, bias=True, conv_bias=True).double()
    theirs = DynamicConv1dTBC(16, 5, 2, 4, weight_softmax=True, bias=True, conv_bias=True).double()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn_like(p))
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(6, 2, 16, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x, unfold=False), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [4, 1])
def test_incremental_decoding_equals_the_causal_convolution(kernel):
    ours, _ = pair(16, kernel, 2, kernel - 1)
    ours.eval()
    x = torch.randn(7, 2, 16, dtype=torch.float64)
    full = ours(x)
    state, steps = {}, []
    for t in range(7):
        steps.append(ours(x[t:t + 1], incremental_state=state))
        if t == 3:  # a beam reorder that keeps the order
            ours.reorder_incremental_state(state, torch.arange(2))
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-12, atol=1e-12)


def test_backward_keeps_the_input_and_kernels_not_a_band_matrix():
    """Saved for backward, per call: about the padded input and the T x B x H x K kernels (fairseq's
    training path keeps a B*H x T x T band matrix)."""
    channels, kernel, heads, length, batch = 64, 15, 4, 100, 8
    ours, theirs = pair(channels, kernel, heads, kernel // 2)
    x = torch.randn(length, batch, channels, dtype=torch.float64, requires_grad=True)

    def saved_bytes(fn):
        seen = {}

        def pack(t):
            s = t.untyped_storage()
            seen.setdefault(s.data_ptr(), s.nbytes())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(seen.values())

    params = sum(p.numel() for p in ours.parameters()) * 8
    mine = saved_bytes(lambda: ours(x)) - params
    fairseqs = saved_bytes(lambda: theirs(x, unfold=False)) - params
    inputs = (length + kernel - 1) * batch * channels * 8 + 2 * length * batch * heads * kernel * 8
    assert mine <= 1.05 * inputs + x.numel() * 8, (mine, inputs)
    assert fairseqs > 2 * mine


def test_the_lean_function_has_the_gradients_of_its_formula_with_dropconnect():
    """gradcheck (float64) of softmax -> DropConnect mask -> K-tap convolution, causal and centred."""
    torch.manual_seed(3)
    for padding_l in (1, 3):
        x = torch.randn(6, 2, 8, dtype=torch.float64, requires_grad=True)
        logits = torch.randn(6, 2, 2, 4, dtype=torch.float64, requires_grad=True)
        keep = torch.rand(6, 2, 2, 4) >= 0.25
        assert torch.autograd.gradcheck(
            lambda a, b: dynamic_convolution(a, b, padding_l, 0.25, training=True, keep=keep), (x, logits))


def test_mixed_cells_have_the_gradients_of_their_formula():
    """gradcheck (float64) of the mixed convolution (Eq. 7 as one kernel): x, every cell's logits and the gates."""
    torch.manual_seed(4)
    x = torch.randn(7, 2, 8, dtype=torch.float64, requires_grad=True)
    logits = [torch.randn(7, 2, 2, k, dtype=torch.float64, requires_grad=True) for k in (2, 5)]
    alpha = torch.randn(2, dtype=torch.float64, requires_grad=True)
    keep = torch.rand(7, 2, 2, 7) >= 0.3
    for paddings in ((1, 2), (1, 4), (0, 1)):
        assert torch.autograd.gradcheck(
            lambda a, g, l0, l1: multi_dynamic_convolution(a, [l0, l1], paddings, torch.softmax(g, 0), 0.3, True,
                                                           keep=keep),
            (x, alpha, *logits))


@pytest.mark.parametrize("grad_mode", ["no_grad", "inputs_without_grad"])
def test_without_gradients_the_same_arithmetic_runs_outside_the_autograd_function(grad_mode):
    """Where no gradient is needed (evaluation, decoding) multi_dynamic_convolution runs the function's forward
    arithmetic directly (dynamo cannot trace the autograd function there: --compile's evaluation programs): the
    same output as through the function, float64, padded sentences, two cells with gates."""
    torch.manual_seed(6)
    x = torch.randn(9, 3, 8, dtype=torch.float64)
    x[:2, 1] = 0.0
    logits = [torch.randn(9, 3, 2, k, dtype=torch.float64) for k in (3, 15)]
    gates = torch.softmax(torch.randn(2, dtype=torch.float64), 0)
    through_function = multi_dynamic_convolution(x.clone().requires_grad_(), logits, (1, 7), gates)
    if grad_mode == "no_grad":
        with torch.no_grad():
            direct = multi_dynamic_convolution(x, logits, (1, 7), gates)
    else:
        direct = multi_dynamic_convolution(x, logits, (1, 7), gates)
    assert through_function.grad_fn is not None and direct.grad_fn is None
    torch.testing.assert_close(direct, through_function.detach(), rtol=1e-12, atol=1e-12)


# the cells of the cases below: (kernel sizes, their padding_l); the last has no cell spanning the whole window
CELLS = [((3,), (1,)), ((15,), (14,)), ((4,), (2,)), ((3, 15), (1, 7)), ((3, 15), (2, 14)), ((2, 5, 6), (1, 2, 3)),
         ((3, 3), (0, 2)), ((2, 4), (0, 3))]


@pytest.mark.parametrize("kernels,paddings", CELLS)
@pytest.mark.parametrize("dropconnect", [0.0, 0.3])
def test_batched_convolution_equals_the_tap_loop(kernels, paddings, dropconnect):
    """multi_dynamic_convolution (one mixed kernel, unfold, no loop) equals sum_i g_i of the reference loop over
    the taps of each cell, each cell with its own DropConnect mask (the same masks), float64: the output and the
    gradients of x, every cell's logits and the gate logits."""
    torch.manual_seed(5)
    T, B, H, C = 9, 3, 2, 8
    x = torch.randn(T, B, C, dtype=torch.float64)
    x[:2, 1] = 0.0  # a left-padded and a right-padded sentence: zeroed inputs, as MultiKernelConv passes them
    x[-3:, 2] = 0.0
    logits = [torch.randn(T, B, H, k, dtype=torch.float64) for k in kernels]
    alpha = torch.randn(len(kernels), dtype=torch.float64)
    keep = torch.rand(T, B, H, sum(kernels)) >= dropconnect if dropconnect else None
    slices = [None] * len(kernels) if keep is None else list(keep.split(list(kernels), dim=-1))
    grad = torch.randn(T, B, C, dtype=torch.float64)

    def run(batched):
        xs = x.clone().requires_grad_()
        ls = [lg.clone().requires_grad_() for lg in logits]
        a = alpha.clone().requires_grad_()
        gates = torch.softmax(a, 0) if len(kernels) > 1 else None
        if batched:
            out = multi_dynamic_convolution(xs, ls, paddings, gates, dropconnect, True, keep=keep)
        else:
            out = sum((1.0 if gates is None else gates[i]) * reference_dynamic_convolution(xs, lg, p, kp, dropconnect)
                      for i, (lg, p, kp) in enumerate(zip(ls, paddings, slices)))
        out.backward(grad)
        return [out.detach(), xs.grad] + [lg.grad for lg in ls] + ([a.grad] if gates is not None else [])

    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_launches_do_not_grow_with_the_kernel_size():
    """The taps are batched: forward + backward of a mixed convolution launch as many kernels for k = 3, 15 as
    for k = 3, 31 (the loop it replaced launched 1 + 4 per tap)."""
    from umst_dev.op_counts import KernelLaunches

    def launches(kernels):
        torch.manual_seed(0)
        x = torch.randn(12, 2, 8, requires_grad=True)
        logits = [torch.randn(12, 2, 2, k, requires_grad=True) for k in kernels]
        alpha = torch.zeros(len(kernels), requires_grad=True)
        with KernelLaunches() as k:
            out = multi_dynamic_convolution(x, logits, [k // 2 for k in kernels], torch.softmax(alpha, 0), 0.1, True)
            out.sum().backward()
        return k.total

    assert launches((3, 15)) == launches((3, 31)) == launches((5, 7))
    assert launches((3, 15)) <= 40


@pytest.mark.parametrize("kernels", [(3,), (3, 15)])
def test_half_precision_inputs_accumulate_in_fp32(kernels):
    """bf16 inputs (what the projections give it under autocast): the convolution runs in fp32 and returns bf16;
    the result is the fp32 one to bf16 rounding, gradients too (in the inputs' dtype)."""
    torch.manual_seed(6)
    x = torch.randn(10, 2, 8)
    logits = [torch.randn(10, 2, 2, k) for k in kernels]
    gates = torch.softmax(torch.randn(len(kernels)), 0) if len(kernels) > 1 else None
    paddings = [k // 2 for k in kernels]

    def run(dtype):
        xs = x.to(dtype).requires_grad_()
        ls = [lg.to(dtype).requires_grad_() for lg in logits]
        out = multi_dynamic_convolution(xs, ls, paddings, gates)
        out.float().pow(2).sum().backward()
        return out, xs.grad, ls[0].grad

    half, full = run(torch.bfloat16), run(torch.float32)
    assert half[0].dtype == torch.bfloat16 and half[1].dtype == torch.bfloat16
    for a, b in zip(half, full):
        torch.testing.assert_close(a.float(), b, rtol=0.05, atol=0.05)


def test_compiled_backward_takes_short_batches_of_any_size():
    """Issue 63's crash, at its smallest: the two-cell convolution (kernels 3 and 15, Prime's), compiled with dynamic
    shapes, forward and backward on a batch shorter than the widest kernel (T 10, B 5), then on another short batch
    of another batch size (T 5, B 4). Its compiled backward failed there (``assert_size_stride``: the saved windows'
    strides fixed to the first batch's) while the backward's windows were the forward's ops; it now matches eager.
    Then a batch longer than the kernel (T 20, B 3): the same program (one cache entry), since the window view is
    laid out contiguously under compile (``_laid_out``), not by comparing T with K. (Long and short batches over a
    corpus's stream: tests/test_compile_stream.py trains Prime compiled.)"""
    import logging

    from umst_dev import compiled_layers
    from umst_plugin.compilation import dispatch

    dispatch.configure_dynamo()
    logging.getLogger("filelock").setLevel(logging.WARNING)

    def conv(x, short, wide, gates):
        return multi_dynamic_convolution(x, [short, wide], [1, 7], gates)
    compiled = torch.compile(conv, dynamic=True, fullgraph=True)
    for T, B in ((10, 5), (5, 4), (20, 3)):
        torch.manual_seed(T)
        inputs = [torch.randn(T, B, 8), torch.randn(T, B, 2, 3), torch.randn(T, B, 2, 15), torch.randn(2)]
        grads = []
        for fn in (compiled, conv):
            leaves = [t.clone().requires_grad_() for t in inputs]
            for logits in leaves[1:3]:
                # the kernel widths are constants, as in a Prime layer, whose kernels come from its weights (torch
                # 2.11's dynamo cannot trace them as symbols into the autograd function: docs/compile.md, torch 2.11)
                torch._dynamo.mark_static(logits, 3)
            out = fn(*leaves)
            out.backward(torch.ones_like(out))
            grads.append([out] + [t.grad for t in leaves])
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"T {T}, B {B}: {m}")
    assert compiled_layers.cache_entries(conv) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_keeps_the_softmax_outputs_or_the_half_precision_logits(dtype):
    """What backward keeps of each cell's kernels: the fp32 softmax outputs where the logits are fp32 (as many bytes
    as the logits), the logits themselves where they are half precision (half the bytes of fp32 softmax outputs;
    backward recomputes the softmax from them)."""
    torch.manual_seed(2)
    x = torch.randn(10, 2, 8, dtype=dtype, requires_grad=True)
    logits = [torch.randn(10, 2, 2, k, dtype=dtype, requires_grad=True) for k in (3, 15)]
    gates = torch.softmax(torch.randn(2), 0)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        multi_dynamic_convolution(x, logits, [1, 7], gates)
    kernels = sorted((t for t in saved if t.dim() == 4 and t.shape[:3] == (10, 2, 2) and t.size(-1) in (3, 15)),
                     key=lambda t: t.size(-1))
    assert [t.size(-1) for t in kernels] == [3, 15], [(t.shape, t.dtype) for t in saved]
    for kept, lg in zip(kernels, logits):
        if dtype == torch.float32:
            assert torch.equal(kept, torch.softmax(lg, -1))
        else:
            assert kept.dtype == torch.bfloat16 and torch.equal(kept, lg)
