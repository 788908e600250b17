"""umst_dev/simulated_gpu.py: a GPU's compiled kernels counted on a CPU.

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

from umst_dev import simulated_gpu
from umst_dev.op_counts import SIMULATED_GPU_PREFIX, profiled_launches

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


def test_torch_2_14_s_host_side_checks_launch_nothing():
    """torch 2.14's wrapper checks its inputs' sizes and metadata in calls of their own and clones an input only
    where it is misaligned (``copy_if_misaligned``): none is a kernel launch (they were counted as ``other:``
    launches, about 10 per compiled layer)."""
    checks = ("        assert_size_stride_grouped([(primals_2, (s77, 8), (8, 1)), (primals_3, (8, 8), (8, 1))])\n"
              "        assert_tensor_metadata(primals_3, (8, 8), (8, 1), torch.float32)\n"
              "        primals_2 = copy_if_misaligned(primals_2)\n")
    wrapper = WRAPPER.replace("        args.clear()\n", "        args.clear()\n" + checks)
    assert wrapper != WRAPPER
    assert simulated_gpu.count_launches(wrapper) == simulated_gpu.count_launches(WRAPPER)


# a wrapper as inductor (torch 2.11) writes it under config.benchmark_kernel, abridged: each Triton kernel's source
# embedded as a string, with its estimated bytes in its metadata and a benchmark harness of its own (a ``call`` that
# launches it: not the graph's); the graph's call launches the first kernel twice
KERNEL = """
@triton_heuristics.persistent_reduction(
    size_hints={{'x': 64, 'r0_': 8}},
    inductor_meta={{'grid_type': 'Grid1D', 'kernel_name': '{name}', 'kernel_num_gb': {gb}, 'kernel_flop': 0}},
)
@triton.jit
def {name}(in_out_ptr0, in_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    tl.store(in_out_ptr0 + (x0), tmp29, xmask)


def call(args):
    with torch.cuda._DeviceGuard(0):
        stream0 = get_raw_stream(0)
        {name}.run(*args, stream=stream0)


if __name__ == '__main__':
    num_gb = {gb}
"""
Q = "'" * 3  # the quotes inductor puts around a kernel's source
BENCHMARK_WRAPPER = f"""
triton_per_fused_0 = async_compile.triton('triton_per_fused_0', {Q}{KERNEL.format(name="triton_per_fused_0", gb=2.56e-06)}{Q}, device_str='cuda')


triton_poi_fused_1 = async_compile.triton('triton_poi_fused_1', {Q}{KERNEL.format(name="triton_poi_fused_1", gb=0.001)}{Q}, device_str='cuda')


async_compile.wait(globals())

class Runner:
    def call(self, args):
        primals_1, primals_2, primals_3 = args
        with torch.cuda._DeviceGuard(0):
            buf0 = empty_strided_cuda((s77, 8), (8, 1), torch.float32)
            extern_kernels.mm(primals_2, primals_3, out=buf0)
            stream0 = get_raw_stream(0)
            triton_per_fused_0.run(buf4, buf0, s77, 8, stream=stream0)
            triton_poi_fused_1.run(buf4, s77, stream=stream0)
            triton_per_fused_0.run(buf5, buf4, s77, 8, stream=stream0)
        return (buf4, )

runner = Runner(partitions=[])
call = runner.call


def benchmark_compiled_module(args, times=10, repeat=10):
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)
"""


def test_a_benchmark_wrapper_s_launches_and_bytes_are_its_call_s_not_its_kernels_harnesses():
    """The kernels' own benchmark harnesses (each with a ``call`` of its own) launch nothing of the graph; each launch
    of a kernel moves the bytes its metadata estimates (a kernel launched twice: twice)."""
    assert simulated_gpu.count_launches(BENCHMARK_WRAPPER) == {"extern:mm": 1, "triton": 3}
    assert simulated_gpu.triton_bytes(BENCHMARK_WRAPPER) == (2 * 2560 + 1_000_000, [])
    unestimated = BENCHMARK_WRAPPER.replace("'kernel_num_gb': 0.001, ", "")
    assert simulated_gpu.triton_bytes(unestimated) == (2 * 2560, ["triton_poi_fused_1.run"])


def test_a_program_s_bytes_are_its_kernels_estimates_and_its_library_calls_operands():
    """A Program adds the library calls' bytes and FLOPs (the scheduler's, one record per call) to the Triton kernels';
    a launch kind the records do not account for is named as unsized, not silently 0."""
    mm_bytes = (64 * 8 + 8 * 8 + 64 * 8) * 4
    program = simulated_gpu.Program("forward", BENCHMARK_WRAPPER, [("extern:mm", mm_bytes, 2 * 64 * 8 * 8)])
    assert program.bytes == {"triton": 1_005_120, "extern:mm": 4352}
    assert program.flops == 8192 and program.unsized == []
    record = program.record()
    assert record["launches"] == {"extern:mm": 1, "triton": 3} and record["bytes"]["extern:mm"] == 4352
    assert simulated_gpu.Program("forward", BENCHMARK_WRAPPER, []).unsized == ["extern:mm: 1 launched, 0 sized"]


def test_the_backend_s_traffic_is_each_program_times_its_runs():
    """An update's traffic: each program's launches, bytes and FLOPs times how often it ran in the counted block (a
    layer class's program once per layer), forward and backward apart; runs before the block are not counted."""
    backend = simulated_gpu.Backend("h200")
    forward = simulated_gpu.Program("forward", BENCHMARK_WRAPPER, [("extern:mm", 4352, 8192)])
    backward = simulated_gpu.Program("backward", WRAPPER, [("extern:mm", 100, 10), ("fallback:randint.low_out", 8, 0),
                                                           ("fallback:umst_simulated.attention.default", 50, 5)])
    backend.programs = [forward, backward]
    backend.runs[0] = 99  # an earlier update
    with backend.count_runs():
        backend.runs.update({0: 6, 1: 2})
    traffic = backend.traffic()
    assert traffic["forward"] == dict(launches=24, triton=18, bytes=6 * 1_009_472, triton_bytes=6 * 1_005_120,
                                      flops=6 * 8192, unsized=0, runs=6)
    assert traffic["backward"]["launches"] == 8 and traffic["backward"]["bytes"] == 2 * 158
    assert traffic["backward"]["flops"] == 30 and traffic["backward"]["unsized"] == 2  # its Triton kernel (no estimate), twice


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
    # what they move: each product its operands and output by shape (float32; x 4 x 8, w 8 x 8), the Triton kernels
    # inductor's estimate (at least the product's output they read), and the products' FLOPs
    forward, backward = backend.programs
    product = (4 * 8 + 8 * 8 + 4 * 8) * 4
    assert forward.bytes["extern:mm"] == product and backward.bytes["extern:mm"] == 2 * product
    assert forward.bytes["triton"] >= 4 * 8 * 4 and backward.bytes["triton"] >= 4 * 8 * 4
    assert (forward.flops, backward.flops) == (2 * 4 * 8 * 8, 2 * 2 * 4 * 8 * 8)
    assert not forward.unsized and not backward.unsized
    torch._dynamo.reset()

    # a product of a slice of a packed projection (q of q, k, v) reads the slice, not the packed buffer
    backend = simulated_gpu.Backend("h200")
    w3, w2 = torch.randn(8, 24), torch.randn(8, 8)
    torch.compile(lambda x: (x @ w3)[:, 8:16] @ w2, backend=backend, dynamic=True)(x.detach())
    (program,) = backend.programs
    assert program.bytes["extern:mm"] == ((4 * 8 + 8 * 24 + 4 * 24) + (4 * 8 + 8 * 8 + 4 * 8)) * 4
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
    # the fused attention's FLOPs are torch.utils.flop_counter's, with dropout (the stand-in, lowered as the GPU's
    # memory-efficient kernel) and without (the CPU's flash kernel, which the counter has no formula of its own for)
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    shapes = (q.shape, k.shape, v.shape)
    assert [p.flops for p in backend.programs] == [sdpa_flop_count(*shapes), sdpa_backward_flop_count(q.shape, *shapes)]
    torch._dynamo.reset()
    backend = simulated_gpu.Backend("h200")
    torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v).relu(), backend=backend,
                  dynamic=True)(q, k, v).sum().backward()
    assert [p.flops for p in backend.programs] == [sdpa_flop_count(*shapes), sdpa_backward_flop_count(q.shape, *shapes)]
    assert all(p.bytes[kind] > 0 for p in backend.programs for kind in p.launches if kind != "triton")
    torch._dynamo.reset()


@pytest.mark.skipif(simulated_gpu.unavailable() is not None,
                    reason=f"inductor's CUDA code generation: {simulated_gpu.unavailable()}")
def test_a_gpu_program_s_prefix_sums_are_atens_scan_and_its_kernels_compile_for_the_gpu(tmp_path, monkeypatch):
    """TranSFormer's input region's kind of prefix sums, over a length bounded as the source length is
    (max_source_positions): inductor's own lowering makes a Triton scan of them (persistent, 1024 wide, the kind
    that took minutes to compile), the plugin's under --compile (``patches/inductor_scan.py``) one ATen call each.
    Then ``umst_dev.triton_compile_times`` compiles every kernel of the patched program for sm_90, here, in seconds."""
    from umst_dev import triton_compile_times
    from umst_plugin.compilation import dispatch
    from umst_plugin.patches import inductor_scan

    def layout(tokens):
        torch._check(tokens.size(1) <= 1024)  # what the positional embedding's table size tells inductor
        real = tokens.ne(1)
        return torch.cumsum(real.int(), dim=1) * real + 1, torch.cumsum((tokens % 3 == 0).long() + real.long(), 1)

    tokens = torch.randint(0, 9, (40, 30))

    def program():
        torch._dynamo.reset()
        backend = simulated_gpu.Backend("h200")
        out = torch.compile(layout, backend=backend, dynamic=True)(tokens)
        assert all(torch.equal(a, b) for a, b in zip(out, layout(tokens)))
        (generated,) = backend.programs
        return generated.code

    dispatch.configure_dynamo()  # what --compile runs first: installs the patch
    patched = program()
    assert "associative_scan" not in patched and patched.count("aten.cumsum.default(") == 2
    monkeypatch.setattr(inductor_scan, "LIBRARY_SCAN_DEVICES", ())  # inductor's own lowering everywhere
    assert "tl.associative_scan" in program()
    (tmp_path / "layout-0-forward.py").write_text(patched)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    rows = triton_compile_times.measure(str(tmp_path), log=lambda line: None)
    assert rows and all(r["configs"] and r["seconds"] < 30 for r in rows)
    assert triton_compile_times.per_row(rows)["layout"]["kernels"] == len(rows)
    torch._dynamo.reset()


def _traffic(fwd, bwd):
    """A simulated_traffic record: (launches, bytes, FLOPs) forward and backward."""
    return {kind: dict(launches=n, triton=n // 2, bytes=b, triton_bytes=b // 2, flops=f, unsized=0, runs=1)
            for kind, (n, b, f) in (("forward", fwd), ("backward", bwd))}


def test_bench_launches_gives_each_arch_s_layer_traffic_per_flop_against_the_transformer_s_and_its_shape_s():
    """bench_launches --simulate-gpu: bytes and kernels per FLOP of the compiled layers, forward, backward and both,
    against the plugin transformer's of the same run and (--floor) the transformer of the row's shape, from rows of
    known figures."""
    from benchmarks import bench_launches

    rows = [dict(name="transformer", arch="transformer", simulated_traffic=_traffic((100, 10e9, 1e12), (200, 30e9, 2e12))),
            dict(name="prime", arch="prime_base", simulated_traffic=_traffic((150, 12e9, 0.8e12), (300, 40e9, 1.6e12))),
            dict(name="transformer_prime_shape", arch="transformer",
                 simulated_traffic=_traffic((160, 10e9, 0.8e12), (320, 32e9, 1.6e12)))]
    bench_launches.traffic_ratios(rows)
    prime = rows[1]
    assert prime["traffic_per_flop"]["forward"]["bytes_per_flop"] == pytest.approx(0.015)
    assert prime["traffic_per_flop"]["forward + backward"]["kernels_per_gflop"] == pytest.approx(450 / 2400)
    against = prime["traffic_vs_transformer"]
    assert against["forward"]["bytes_per_flop"] == pytest.approx(1.5)  # 0.015 against 0.010
    assert against["backward"]["bytes_per_flop"] == pytest.approx(25 / 15)
    assert against["forward + backward"]["bytes_per_flop"] == pytest.approx((52 / 2.4) / (40 / 3))
    assert against["backward"]["kernels_per_gflop"] == pytest.approx((300 / 1.6) / (200 / 2))
    own = prime["traffic_vs_own_shape"]
    assert own["forward + backward"]["bytes_per_flop"] == pytest.approx(52 / 42)
    assert own["forward"]["kernels_per_gflop"] == pytest.approx(150 / 160)
    assert "traffic_vs_own_shape" not in rows[0]
    table = bench_launches.traffic_markdown(dict(rows=rows))
    line = next(line for line in table.splitlines() if line.startswith("| prime_base"))
    assert "| 800.0 + 1600.0 | 150 + 300 | 12.00 + 40.00 | 0.0150, 0.0250 |" in line
    assert "| 1.50, 1.67 (1.62) |" in line and "| 1.24 |" in line


def test_bench_launches_counts_a_batch_of_the_tokens_and_lengths_asked_for_in_every_row(tmp_path):
    """--max-tokens N --lengths wmt14: one full batch drawn from WMT14's lengths (bench_archs.lengths_batch), the same
    in the plugin's rows and in the stock row's own process."""
    import json

    from benchmarks import bench_launches, harness

    out = tmp_path / "launches.json"
    bench_launches.main(["--quick", "--archs", "transformer", "--max-tokens", "1024", "--lengths", "wmt14",
                         "--json", str(out)])
    result = json.loads(out.read_text())
    sources, targets = harness.lengths_batch(1024, lengths="wmt14")
    assert result["sentences"] == len(sources) and result["max_tokens"] == 1024 and result["lengths"] == "wmt14"
    for row in result["rows"]:
        assert row["sentences"] == len(sources)
        assert row["source_tokens"] == sum(sources) and row["target_tokens"] == sum(targets)
        assert row["padded_source_tokens"] == len(sources) * max(sources)
        assert 0.9 * 1024 <= len(sources) * max(max(sources), max(targets)) <= 1024


def test_cudagraph_blockers_are_inductors_uncapturable_ops_and_written_inputs():
    """``cudagraph_blockers``: a host sync (``.item()``) and an input written in place are named with the line they
    came from; a graph of plain ops has none."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def clean(x, y):
        return torch.relu(x @ y).sum(0)

    def syncs(x, y):
        return x * (x.sum().item() > 0)

    def writes(x, y):
        x.copy_(y)
        return x + 1

    x, y = torch.randn(3, 3), torch.randn(3, 3)
    assert simulated_gpu.cudagraph_blockers(make_fx(clean)(x, y)) == []
    [sync] = simulated_gpu.cudagraph_blockers(make_fx(syncs, tracing_mode="symbolic")(x, y))
    assert sync.startswith("op aten._local_scalar_dense.default"), sync
    written = simulated_gpu.cudagraph_blockers(make_fx(writes)(x, y))
    assert len(written) == 1 and written[0].startswith("input x_1 written"), written
