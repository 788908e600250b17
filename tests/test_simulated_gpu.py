"""umst_plugin/simulated_gpu.py: a GPU's compiled kernels counted on a CPU.

What any torch runs (CI's CPU wheel included): reading an inductor GPU wrapper's launches, the profiler count of a
simulated graph's range, and the fused-attention stand-in (the same function as ``scaled_dot_product_attention``,
its backward exact in float64, dropout included). Inductor's CUDA code generation itself needs a CUDA build of
torch with Triton (the GPU machines' torch, which runs on a CPU): that test skips elsewhere, saying why.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from umst_plugin import simulated_gpu
from umst_plugin.op_counts import SIMULATED_GPU_PREFIX, profiled_launches

# the call method inductor (torch 2.11) generated for a matmul, layer norm, ReLU, dropout and sum on a simulated
# H200 (the forward of the function in test_inductor_generates_the_gpu_program_on_a_cpu), abridged to its call
WRAPPER = '''
class Runner:
    def call(self, args):
        primals_1, primals_2, primals_3 = args
        args.clear()
        s77 = primals_1
        assert_size_stride(primals_2, (s77, 8), (8, 1))
        assert_size_stride(primals_3, (8, 8), (8, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((s77, 8), (8, 1), torch.float32)
            # Topologically Sorted Source Nodes: [matmul], Original ATen: [aten.mm]
            extern_kernels.mm(primals_2, primals_3, out=buf0)
            buf4 = empty_strided_cuda((1, ), (1, ), torch.int64)
            # Topologically Sorted Source Nodes: [], Original ATen: []
            aten.randint.low_out(-9223372036854775808, 9223372036854775807, [1], out=buf4)
            buf6 = empty_strided_cuda((s77, 8), (8, 1), torch.bool)
            buf1 = empty_strided_cuda((s77, 1), (1, s77), torch.float32)
            buf7 = reinterpret_tensor(buf1, (s77, ), (1, ), 0); del buf1  # reuse
            stream0 = get_raw_stream(0)
            triton_per_fused_native_dropout_native_layer_norm_relu_sum_0.run(buf7, buf4, buf0, buf6, 0, s77, 8, stream=stream0)
            buf8 = torch.ops.umst_simulated.attention.default(buf7, buf7, buf7, None, 0.1, False, None)
            del buf4
        return (buf7, buf0, buf6, reinterpret_tensor(primals_2, (8, s77), (1, 8), 0), s77, )

runner = Runner(partitions=[])
call = runner.call
'''


def test_a_wrapper_s_launches_are_its_kernels_library_calls_and_fallbacks():
    counts = simulated_gpu.count_launches(WRAPPER)
    assert counts == {"extern:mm": 1, "fallback:randint.low_out": 1, "triton": 1,
                      "fallback:umst_simulated.attention.default": 1}


def test_the_profiler_counts_a_simulated_graph_as_its_gpu_launches_not_the_ops_it_ran():
    x = torch.randn(4, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("phase:forward"):
            y = x.relu()  # an eager op outside the graph: 1
            with torch.profiler.record_function(f"{SIMULATED_GPU_PREFIX}7:5"):
                (x @ x.t()).softmax(-1).sum()  # the graph run eagerly: counted as 7 launches, 5 generated
            y.exp()  # 1
    by_phase, by_op = profiled_launches(prof.events())
    assert by_phase["forward"] == 9
    assert by_op["generated"] == 5 and by_op["simulated library calls"] == 2
    assert by_op["relu"] == 1 and by_op["exp"] == 1 and "softmax" not in by_op and "mm" not in by_op


def _inputs(batch=2, heads=2, length=5, other=6, dim=4):
    g = torch.Generator().manual_seed(0)

    def t(n):
        return torch.randn(batch, heads, n, dim, dtype=torch.float64, generator=g).requires_grad_()
    return t(length), t(other), t(other)


@pytest.mark.parametrize("mask_kind", ["none", "float", "bool"])
def test_fused_attention_is_scaled_dot_product_attention(mask_kind):
    """Without dropout the stand-in's output and gradients are torch's (float64), for no mask, an additive mask
    and a boolean one (made additive as the fused kernels take it), causal and not, with a scale given."""
    op = simulated_gpu._register_attention()
    q, k, v = _inputs(length=6)
    mask = None
    if mask_kind == "float":
        mask = torch.zeros(2, 1, 1, 6, dtype=torch.float64)
        mask[0, ..., -2:] = float("-inf")
    elif mask_kind == "bool":
        mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
        mask[1, ..., -1] = False
    for is_causal, scale in ((False, None), (True, 0.3)):
        if is_causal and mask is not None:
            continue  # torch takes one or the other
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
        expected_grads = torch.autograd.grad(expected.pow(2).sum(), (q, k, v))
        out = op(q, k, v, simulated_gpu.additive_mask(mask, q.dtype), 0.0, is_causal, scale)[0]
        grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
        torch.testing.assert_close(out, expected)
        for g, e in zip(grads, expected_grads):
            torch.testing.assert_close(g, e)
        # the GPU kernel's layout: batch, length, heads, dim in memory
        assert out.transpose(1, 2).is_contiguous() and all(g.transpose(1, 2).is_contiguous() for g in grads)


def test_fused_attention_stands_in_only_where_a_cpu_would_decompose_it():
    q, k, v = _inputs()
    with simulated_gpu.fused_attention():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            F.scaled_dot_product_attention(q, k, v)
            torch.manual_seed(0)
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    names = [e.name for e in prof.events()]
    assert names.count("umst_simulated::attention") == 1


def test_the_plugin_s_attention_takes_a_gpu_s_path_while_counted():
    """bf16 with dropout, training: on a CPU the plugin's attention runs its explicit core (matrix products, softmax,
    dropout) and recomputes it in backward; a GPU runs one fused kernel each way and keeps no recomputation. While
    counted as a GPU, the trace has the GPU's: one stand-in op forward, one backward, no checkpoint. Outside, the
    CPU's path is unchanged."""
    from umst_plugin.modules.common.attention import attention

    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in _inputs())

    def ops(counted_as_gpu):
        with counted_as_gpu, profile(activities=[ProfilerActivity.CPU]) as prof:
            torch.manual_seed(0)
            attention(q, k, v, None, dropout_p=0.1).float().sum().backward()
        return [e.name for e in prof.events()]

    on_gpu = ops(simulated_gpu.fused_attention())
    assert on_gpu.count("umst_simulated::attention") == 1
    assert on_gpu.count("umst_simulated::attention_backward") == 1
    assert "aten::dropout" not in on_gpu  # (the stand-in draws its own mask, from its seed)
    on_cpu = ops(contextlib.nullcontext())
    assert "umst_simulated::attention" not in on_cpu
    assert on_cpu.count("aten::dropout") == 2  # the explicit core's dropout, drawn again in backward


def test_fused_attention_with_dropout_has_an_exact_backward():
    """The backward redraws the forward's dropout mask from the seed the forward returned (as the GPU kernel
    returns its Philox seed): gradcheck holds only if both see the same mask. Dropout does drop."""
    q, k, v = _inputs()
    op = simulated_gpu._register_attention()
    mask = torch.zeros(2, 1, 1, 6, dtype=torch.float64)

    def dropped(q, k, v):
        torch.manual_seed(5)  # the same seed for every evaluation gradcheck makes
        return op(q, k, v, mask, 0.5, False, None)[0]

    assert torch.autograd.gradcheck(dropped, (q, k, v))
    torch.manual_seed(5)
    without = op(q, k, v, mask, 0.0, False, None)[0]
    assert not torch.allclose(dropped(q, k, v), without)


@pytest.mark.skipif(simulated_gpu.unavailable() is not None,
                    reason=f"inductor's CUDA code generation: {simulated_gpu.unavailable()}")
def test_inductor_generates_the_gpu_program_on_a_cpu():
    """A compiled function's forward and backward are generated as Triton kernels and library calls for the
    simulated H200 (the backward: the layer norm's and ReLU's gradients fused into one kernel, two matrix
    products); they run eagerly, with eager's results; attention under the stand-in is one op each way."""
    def f(x, w):
        return F.dropout(F.layer_norm(x @ w, (8,)).relu(), 0.1).sum(-1)

    backend = simulated_gpu.Backend("h200")
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    torch.manual_seed(0)
    compiled = torch.compile(f, backend=backend, dynamic=True)(x, w)
    compiled.sum().backward()
    assert backend.graphs == [("forward", {"extern:mm": 1, "fallback:randint.low_out": 1, "triton": 1}),
                              ("backward", {"triton": 1, "extern:mm": 2})]
    torch._dynamo.reset()

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1).relu()

    backend = simulated_gpu.Backend("h200")
    q, k, v = (t.float().detach().requires_grad_() for t in _inputs())
    with simulated_gpu.fused_attention():
        torch.compile(attention, backend=backend, dynamic=True)(q, k, v).sum().backward()
    (_, forward), (_, backward) = backend.graphs
    # lowered as the GPU's memory-efficient attention, one kernel each way
    assert forward["fallback:_scaled_dot_product_efficient_attention.default"] == 1, forward
    assert backward["fallback:_scaled_dot_product_efficient_attention_backward.default"] == 1, backward
    assert not any("umst_simulated" in kind for counts in (forward, backward) for kind in counts)
    assert q.grad is not None and torch.isfinite(q.grad).all()
    torch._dynamo.reset()
