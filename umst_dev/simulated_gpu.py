"""What inductor would launch on a GPU, counted on a machine without one.

``torch.compile`` on a GPU turns each graph into Triton kernels plus library calls (matrix products, fused
attention); on a CPU it generates C++ loops, fused differently (on an H200 the Triton backward of the same
transformer update came in 666 kernels where the C++ one has 355). This module lets inductor generate the GPU
program on the CPU, without compiling or running it:

* each graph a compiled layer hands to inductor (forward and backward, after AOTAutograd's partition, which
  does not depend on the device) is copied onto fake CUDA tensors and lowered by inductor's own CUDA path,
  against the properties of a simulated device (:data:`DEVICES`); the Python wrapper it generates is kept and
  its ``call`` is read: every Triton kernel launch, library call (``extern_kernels.mm``, ...) and aten fallback
  is one kernel (:func:`count_launches`);
* the graph itself runs eagerly on the CPU inside a profiler range named with that count
  (:data:`umst_dev.op_counts.SIMULATED_GPU_PREFIX`), so ``op_counts.profiled_launches`` counts a compiled
  update as the GPU would launch it, the eager ops around the layers as it counts them anyway;
* what each program moves and computes (:class:`Program`): every Triton kernel's bytes as inductor estimates them
  (``kernel_num_gb``), every library call's by its input views and outputs, and the FLOPs of the products and
  attentions; :meth:`Backend.traffic` sums them over the programs' runs in a counted block (a memory-traffic proxy
  for a GPU's time per FLOP where launches are not what it waits for).

It needs what a GPU machine's torch has and a CPU wheel lacks: a CUDA build of torch and Triton (on a machine
without a driver: ``VENV=/tmp/venv-cu TORCH_VERSION=2.11.0 bash scripts/setup_env.sh``, the GPU machines'
torch). :func:`unavailable` says why not, else None.

Two things differ from a real GPU run, and both are handled where they would change the count:

* ``F.scaled_dot_product_attention`` picks its kernel by device: on a CPU with dropout its math path (a dozen
  ops in the graph), on a GPU one fused kernel (memory-efficient attention) forward and one backward. While
  counting, :func:`fused_attention` stands in for it: one custom op each way (inductor calls it as one kernel),
  computing the same function on the CPU; its dropout mask is drawn from a seed it returns, as the GPU's kernel
  returns its Philox seed, so the backward sees the forward's mask.
* Autocast's casts in the graph are the CPU's policy (the graph is traced on the CPU); casts are pointwise and
  fuse into the neighbouring Triton kernels, so they move the count little.

Validated against the profiler on an H200 (docs/compile.md, "A GPU's compiled kernels counted on a CPU").
"""
import collections
import contextlib
import copy
import hashlib
import re
import types
from unittest import mock

import torch

# the simulated device: what inductor reads of a GPU when it lowers a graph (hints.DeviceProperties) and what its
# heuristics ask torch.cuda for
DEVICES = {
    "h200": dict(name="NVIDIA H200 (simulated)", major=9, minor=0, multi_processor_count=132,
                 total_memory=150_000_000_000, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                 max_threads_per_block=1024, warp_size=32, L2_cache_size=60 * 2**20,
                 shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
                 shared_memory_per_block=49152, gcnArchName=""),
}
# wrapper-code calls that launch nothing: allocation, views, checks, streams. torch 2.14's wrapper adds host-side
# checks of its inputs (assert_size_stride_grouped, assert_tensor_metadata) and copy_if_misaligned, which clones an
# input only where its address breaks the alignment a kernel was generated for (torch 2.11 made the same clone,
# only when misaligned, without a call of its own); the caching allocator aligns every tensor a layer receives
_NO_KERNEL = {"empty_strided_cuda", "empty_strided", "reinterpret_tensor", "assert_size_stride", "assert_alignment",
              "get_raw_stream", "torch.cuda.set_device", "torch.cuda._DeviceGuard", "args.clear", "len",
              "as_strided", "alloc_from_pool", "torch._check", "torch._check_is_size", "assert_size_stride_grouped",
              "assert_tensor_metadata", "copy_if_misaligned"}
_CALL = re.compile(r"^(?:[\w, ]+ = )?([\w.]+)\(")


def unavailable():
    """Why the simulation cannot run with this torch (a reason), or None."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build: inductor's CUDA path needs a CUDA build of torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (a CUDA build of torch from PyPI brings it)"
    return None


_KERNEL_SOURCE = re.compile(r"^(\w+) = async_compile\.triton\('\w+', '\'\'(.*?)'\'\'", re.S | re.M)
_KERNEL_BYTES = re.compile(r"'kernel_num_gb': ([0-9.eE+-]+)")


def _call_body(wrapper_code):
    """The lines of the wrapper's ``call``: what one run of the graph launches (the kernels' own sources, which
    inductor embeds in the wrapper as strings and which hold benchmark code of their own, left out)."""
    code = _KERNEL_SOURCE.sub(lambda m: f"{m.group(1)} = async_compile.triton(...)", wrapper_code)
    start = code.index("def call(")
    end = code.find("\nrunner = ", start)  # torch 2.11: the call method of a Runner, then module code
    return code[start:end if end > 0 else None].splitlines()[1:]


def _launch_kind(fn):
    """The kind of kernel a wrapper call ``fn`` launches (see :func:`count_launches`), or None: no kernel."""
    if fn in _NO_KERNEL or fn.endswith((".size", ".stride", ".storage_offset", ".numel", ".item")):
        return None
    if fn.endswith(".run"):
        return "triton"
    if fn.startswith("extern_kernels."):
        return "extern:" + fn[len("extern_kernels."):]
    if fn.startswith(("torch.ops.", "aten.")):
        return "fallback:" + fn.split("ops.", 1)[-1].replace("aten.", "", 1)
    return "other:" + fn


def count_launches(wrapper_code):
    """Kernels one call of an inductor-generated GPU wrapper launches, by kind: ``triton`` (a generated kernel),
    ``extern:<name>`` (a library call: mm, bmm, addmm, ...), ``fallback:<op>`` (an aten op inductor did not
    lower), ``other:<call>`` (anything else the wrapper calls, counted as one launch so it is seen)."""
    counts = collections.Counter()
    for line in _call_body(wrapper_code):
        match = _CALL.match(line.strip())
        kind = match and _launch_kind(match.group(1))
        if kind:
            counts[kind] += 1
    return counts


def triton_bytes(wrapper_code):
    """Bytes the generated Triton kernels of one call of the wrapper read and write: inductor's estimate per
    kernel (``kernel_num_gb``, written into each kernel's metadata under ``config.benchmark_kernel``: every input
    and output buffer it touches, a sliced one by its slices, at the sizes of the graph's first inputs), summed
    over the call's launches. A kernel without the estimate counts 0 and is named in ``missing``."""
    gigabytes = {name: _KERNEL_BYTES.search(source) for name, source in _KERNEL_SOURCE.findall(wrapper_code)}
    total, missing = 0, []
    for line in _call_body(wrapper_code):
        match = _CALL.match(line.strip())
        if match and match.group(1).endswith(".run"):
            found = gigabytes.get(match.group(1)[:-len(".run")])
            if found is None:
                missing.append(match.group(1))
            else:
                total += round(float(found.group(1)) * 1e9)
    return total, missing


@contextlib.contextmanager
def simulated_device(device="h200"):
    """torch.cuda and inductor see one GPU of kind ``device`` (:data:`DEVICES`); Triton targets its architecture
    without a driver. Only for lowering and code generation: nothing may run on it."""
    from torch._dynamo import device_interface
    from torch._inductor.runtime import hints
    from torch.utils import _triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    props = types.SimpleNamespace(**DEVICES[device])
    hint = hints.DeviceProperties(type="cuda", index=0, multi_processor_count=props.multi_processor_count,
                                  cc=props.major * 10 + props.minor, major=props.major,
                                  regs_per_multiprocessor=props.regs_per_multiprocessor,
                                  max_threads_per_multi_processor=props.max_threads_per_multi_processor,
                                  max_threads_per_block=props.max_threads_per_block, warp_size=props.warp_size)
    backend = make_backend(GPUTarget("cuda", props.major * 10 + props.minor, props.warp_size))
    backend_hash = hashlib.sha256(f"simulated {device} {backend.hash()}".encode()).hexdigest().upper()
    cuda, interface = torch.cuda, device_interface.CudaInterface
    patches = [
        (hints.DeviceProperties, "create", classmethod(lambda cls, d: hint)),
        (cuda, "is_available", lambda: True),
        (cuda, "device_count", lambda: 1),
        (cuda, "current_device", lambda: 0),
        (cuda, "set_device", lambda d: None),
        (cuda, "synchronize", lambda d=None: None),
        (cuda, "_exchange_device", lambda d: 0),
        (cuda, "_maybe_exchange_device", lambda d: 0),
        (cuda, "get_device_capability", lambda d=None: (props.major, props.minor)),
        (cuda, "get_device_properties", lambda d=None: props),
        (cuda, "get_device_name", lambda d=None: props.name),
        (cuda, "get_rng_state", lambda device="cuda": torch.zeros(16, dtype=torch.uint8)),
        (cuda, "set_rng_state", lambda state, device="cuda": None),
        (interface, "is_available", staticmethod(lambda: True)),
        (interface, "device_count", staticmethod(lambda: 1)),
        (interface, "current_device", staticmethod(lambda: 0)),
        (interface, "get_compute_capability", staticmethod(lambda d=None: props.major * 10 + props.minor)),
        (interface.Worker, "get_device_properties", staticmethod(lambda d=None: props)),
        (interface.Worker, "current_device", staticmethod(lambda: 0)),
        (_triton, "triton_backend", lambda: backend),
        (_triton, "triton_hash_with_backend", lambda: backend_hash),
    ]
    with contextlib.ExitStack() as stack:
        for owner, name, value in patches:
            stack.enter_context(mock.patch.object(owner, name, value))
        _triton.has_triton.cache_clear()  # cached False on a machine without a GPU; True while simulated
        stack.callback(_triton.has_triton.cache_clear)
        yield


class _Generated(Exception):
    """Raised once inductor has written the wrapper: nothing is compiled or loaded."""

    def __init__(self, code, library):
        super().__init__("wrapper generated")
        self.code, self.library = code, library


class Program:
    """The GPU program inductor generated for one graph, as counted: ``kind`` (forward or backward), ``launches``
    (:func:`count_launches`), ``bytes`` by the same kinds (the memory one call reads and writes: the Triton kernels'
    by inductor's estimate, :func:`triton_bytes`; each library call and fallback its inputs' and outputs' bytes by
    their shapes: the elements each input's view covers, the outputs by the scheduler's
    ``get_read_write_buffer_accesses``), ``flops`` (the matrix products' and
    attentions' FLOPs, inductor's ``estimate_flops``, the same formulas as ``torch.utils.flop_counter``), and
    ``unsized``: launches whose bytes inductor did not estimate (counted as 0). Sizes are the graph's first inputs'
    (under dynamic shapes, the hints of its size symbols)."""

    def __init__(self, kind, code, library, cudagraph_blockers=()):
        self.kind, self.code = kind, code
        # what would keep inductor from replaying it as a CUDA graph (:func:`cudagraph_blockers`)
        self.cudagraph_blockers = list(cudagraph_blockers)
        self.launches = count_launches(code)
        self.bytes = collections.Counter()
        self.bytes["triton"], missing = triton_bytes(code)
        self.unsized = list(missing)
        self.flops = 0
        library_calls = collections.Counter()
        for kind_, nbytes, flops in library:
            self.bytes[kind_] += nbytes
            self.flops += flops
            library_calls[kind_] += 1
        # every library call and fallback of the wrapper has its scheduler node (the two are the same list)
        for kind_, n in self.launches.items():
            if kind_ != "triton" and library_calls[kind_] != n:
                self.unsized.append(f"{kind_}: {n} launched, {library_calls[kind_]} sized")

    def record(self):
        """A JSON-able summary."""
        return dict(kind=self.kind, launches=dict(self.launches), bytes=dict(self.bytes), flops=self.flops,
                    unsized=self.unsized, cudagraph_blockers=list(self.cudagraph_blockers))


def cudagraph_blockers(gm):
    """What in the graph ``gm`` inductor would not replay as a CUDA graph under ``--compile-cudagraphs``
    (torch.compile's ``reduce-overhead``): the first op it cannot capture, by inductor's own check
    (``get_first_incompatible_cudagraph_node``: a host sync such as ``_local_scalar_dense``, a checkpointed
    region's random state, a data-dependent size), and every input the graph writes into (a ``copy_`` into a
    placeholder, which inductor's graph trees refuse unless the input is a parameter). A list of strings, each
    naming the op or input and the user line it came from; empty where nothing stands in the way."""
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    def where(node):
        lines = (node.meta.get("stack_trace") or "").strip().splitlines()
        return f" ({lines[-2].strip()})" if len(lines) >= 2 else ""
    found = []
    node = get_first_incompatible_cudagraph_node(gm)
    if node is not None:
        found.append(f"op {node.target}{where(node)}")
    for node in gm.graph.nodes:
        if node.op == "call_function" and str(node.target) == "aten.copy_.default" and \
                getattr(node.args[0], "op", None) == "placeholder":
            found.append(f"input {node.args[0].name} written{where(node)}")
    return found


def _library_traffic(scheduler):
    """(launch kind, bytes, FLOPs) of each library call and fallback among a scheduler's nodes (after code
    generation). Attention without dropout stays the CPU's flash kernel in the graph (one kernel each way, as the
    GPU's: see :func:`fused_attention`), which ``torch.utils.flop_counter`` has no formula for: it is counted with
    the GPU's flash attention's."""
    from torch._inductor import ir
    from torch._inductor.scheduler import ExternKernelSchedulerNode
    from torch.utils import flop_counter

    aten = torch.ops.aten
    registry = flop_counter.flop_registry
    cpu_attention = {aten._scaled_dot_product_flash_attention_for_cpu: registry[aten._scaled_dot_product_flash_attention],
                     aten._scaled_dot_product_flash_attention_for_cpu_backward:
                         registry[aten._scaled_dot_product_flash_attention_backward]}
    out = []
    with mock.patch.dict(registry, {k: v for k, v in cpu_attention.items() if k not in registry}):
        for node in scheduler.nodes:
            if not isinstance(node, ExternKernelSchedulerNode) or isinstance(node.node, ir.MultiOutput):
                continue
            name = getattr(node.node, "python_kernel_name", None)
            kind = name and _launch_kind(name)
            if kind is None:
                continue
            writes = sum(node.get_read_write_buffer_accesses(include_reads=False, include_writes=True).values())
            reads = sum(_view_bytes(inp) for inp in _tensor_inputs(node.node.inputs))
            out.append((kind, int(reads + writes), _flops(node.node)))
    return out


def _tensor_inputs(inputs):
    for inp in inputs:
        if isinstance(inp, (list, tuple)):
            yield from _tensor_inputs(inp)
        elif inp is not None and hasattr(inp, "get_size"):
            yield inp


def _view_bytes(view):
    """Bytes a library call reads of one input: the elements its view covers, a broadcast (stride 0) dimension once.
    (The scheduler's own estimate counts every buffer an input views whole: q, k and v as three slices of one
    packed projection were read as the packed buffer, the FFN's columns included.)"""
    from torch._inductor.utils import get_dtype_size
    from torch._inductor.virtualized import V

    hint = V.graph.sizevars.optimization_hint
    try:
        sizes, strides = view.get_size(), view.get_stride()
    except (AttributeError, NotImplementedError):
        return 0
    elements = 1
    for size, stride in zip(sizes, strides):
        if hint(stride, fallback=1) != 0:
            elements *= hint(size, fallback=0)
    return elements * get_dtype_size(view.get_dtype())


def _flops(ir_node):
    """The FLOPs of an extern kernel's op at the graph's size hints (``estimate_flops`` of inductor's scheduler,
    not its cached value: that was taken before the CPU attention's formula was there)."""
    from torch._inductor.fx_utils import count_flops_fx
    from torch._inductor.virtualized import V

    origin = ir_node.get_origin_node()
    if origin is None:  # a fallback kernel (attention): the graph node of its op among its origins
        op = getattr(ir_node, "op_overload", None)
        origin = next((n for n in getattr(ir_node, "origins", ()) if op is not None and n.target is op), None)
    flops = None if origin is None else count_flops_fx(origin)
    if flops is None:
        return 0
    if isinstance(flops, torch.SymInt):
        flops = flops.node.expr
    return int(V.graph.sizevars.optimization_hint(flops, fallback=0))


def _on_cuda(gm):
    """A copy of ``gm`` whose CPU device arguments name the simulated GPU."""
    gm = copy.deepcopy(gm)
    cuda = torch.device("cuda", 0)

    def moved(value):
        return cuda if isinstance(value, torch.device) and value.type == "cpu" else value

    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.args = tuple(moved(a) for a in node.args)
            node.kwargs = {k: moved(v) for k, v in node.kwargs.items()}
    _as_gpu_attention(gm.graph)
    _as_gpu_random(gm)
    gm.recompile()
    return gm


def _as_gpu_random(gm):
    """Random ops as AOTAutograd leaves them for a GPU: ``bernoulli`` (kept whole for a CPU, where inductor calls
    torch's kernel) as ``rand < p``, then inductor's own pass to its generated random numbers
    (``replace_random_passes``, which runs on the joint graph before the split)."""
    from torch._inductor.fx_passes.replace_random import replace_random_passes

    aten, graph = torch.ops.aten, gm.graph
    # a size symbol's input, for shapes made of them (a product of symbols is left as a value: the graph fails)
    symbols = {str(n.meta["val"]): n for n in graph.find_nodes(op="placeholder")
               if isinstance(n.meta.get("val"), torch.SymInt)}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.bernoulli.p:
            x, p = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
            size = [symbols.get(str(d), d) if isinstance(d, torch.SymInt) else d for d in x.meta["val"].shape]
            with graph.inserting_before(node):
                uniform = graph.call_function(aten.rand.default, (size,), {"dtype": torch.float32,
                                                                           "device": torch.device("cuda", 0)})
                drawn = graph.call_function(aten.lt.Scalar, (uniform, p))
                drawn = graph.call_function(torch.ops.prims.convert_element_type.default,
                                            (drawn, node.meta["val"].dtype))
            node.replace_all_uses_with(drawn)
            graph.erase_node(node)
    replace_random_passes(gm)  # on the graph (_on_cuda recompiles the module after it)


def _as_gpu_attention(graph):
    """The fused-attention stand-in's nodes as the GPU's own: aten's memory-efficient attention forward and
    backward, so inductor lowers them with their layout constraints (``sdpa_constraint``: the copies it makes
    around them are the GPU program's). What the backward reads and the stand-in did not save (the output, the
    log-sum-exp, Philox seed and offset) comes from allocations, which launch nothing; the program is only counted,
    never run."""
    if not _attention_ops:  # the stand-in never registered: no such node
        return
    aten = torch.ops.aten
    cuda = torch.device("cuda", 0)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is torch.ops.umst_simulated.attention.default:
            q, k, v, mask, dropout_p, is_causal, scale = node.args
            with graph.inserting_before(node):
                fused = graph.call_function(aten._scaled_dot_product_efficient_attention.default,
                                            (q, k, v, mask, True, dropout_p, is_causal), {"scale": scale})
            for user in list(node.users):  # getitem 0: the output; 1: the seed (saved for the backward)
                user.args = (fused, 0 if user.args[1] == 0 else 2)
            graph.erase_node(node)
        elif node.target is torch.ops.umst_simulated.attention_backward.default:
            grad, q, k, v, mask, _seed, dropout_p, is_causal, scale = node.args
            with graph.inserting_before(node):
                # allocations shaped by q (no sizes read: they are symbols): the output in the kernel's layout,
                # the log-sum-exp (batch, heads, length) in float32
                by_length = graph.call_function(aten.permute.default, (q, [0, 2, 1, 3]))
                out = graph.call_function(aten.empty_like.default, (by_length,),
                                          {"dtype": grad.meta["val"].dtype, "memory_format": torch.contiguous_format})
                out = graph.call_function(aten.permute.default, (out, [0, 2, 1, 3]))
                lse = graph.call_function(aten.empty_like.default, (graph.call_function(aten.select.int, (q, -1, 0)),),
                                          {"dtype": torch.float32, "memory_format": torch.contiguous_format})
                seed, offset = (graph.call_function(aten.empty.memory_format, ([],), {"dtype": torch.int64,
                                                                                     "device": cuda})
                                for _ in range(2))
                fused = graph.call_function(aten._scaled_dot_product_efficient_attention_backward.default,
                                            (grad, q, k, v, mask, out, lse, seed, offset, dropout_p,
                                             [True, True, True, False], is_causal), {"scale": scale})
            node.replace_all_uses_with(fused)
            graph.erase_node(node)


def gpu_program(gm, example_inputs, device="h200", **inner_kwargs):
    """The :class:`Program` inductor generates for ``gm`` (an AOTAutograd forward or backward graph, traced on the
    CPU) on the simulated ``device``."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.graph import GraphLowering
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    fake_mode = torch._guards.detect_fake_mode(example_inputs)
    with fake_mode:
        inputs = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
                  if isinstance(t, torch.Tensor) else t for t in example_inputs]

    def generate_only(self):
        wrapper, _ = self.codegen()
        raise _Generated(getattr(wrapper, "value", wrapper), _library_traffic(self.scheduler))

    gm = _on_cuda(gm)
    with simulated_device(device):  # every node's value on the GPU (the attention nodes are new)
        FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*inputs)
    kind = "backward" if inner_kwargs.get("is_backward") else "forward"
    try:
        # benchmark_kernel: each Triton kernel's metadata carries inductor's estimate of its bytes (kernel_num_gb);
        # it changes no kernel, only adds benchmark code to each kernel's source
        with simulated_device(device), mock.patch.object(GraphLowering, "compile_to_module", generate_only), \
                inductor_config.patch(benchmark_kernel=True):
            compile_fx_inner(gm, inputs, **inner_kwargs)
    except Exception as e:  # inductor wraps what its code generation raised
        cause = e
        while cause is not None and not isinstance(cause, _Generated):
            cause = getattr(cause, "inner_exception", None) or cause.__cause__ or cause.__context__
        if cause is None:
            raise
        return Program(kind, cause.code, cause.library, cudagraph_blockers(gm))
    raise RuntimeError("inductor compiled the graph without generating a wrapper")


def gpu_wrapper_code(gm, example_inputs, device="h200", **inner_kwargs):
    """The Python wrapper inductor generates for ``gm`` on the simulated ``device`` (:func:`gpu_program`)."""
    return gpu_program(gm, example_inputs, device, **inner_kwargs).code


class Backend:
    """A ``torch.compile`` backend: AOTAutograd and inductor's graph passes as ``"inductor"``, then each forward
    and backward graph counted as the simulated GPU would launch it (:func:`gpu_program`) and run eagerly
    on the CPU inside a profiler range that carries the count. ``graphs``: (forward/backward, counts) per graph;
    ``programs``: the :class:`Program` of each; ``runs``: how often each program (by its index) ran since
    :meth:`count_runs` last cleared it (see :meth:`traffic`)."""

    def __init__(self, device="h200"):
        self.device = device
        self.graphs = []
        self.programs = []
        self.runs = collections.Counter()
        self.__name__ = f"simulated_{device}"

    def __call__(self, gm, example_inputs):
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        # nothing into or out of the caches: what this backend returns runs eagerly, and its graphs may hold the
        # attention stand-in; a real compile in another process must never load either
        with functorch_config.patch(enable_autograd_cache=False, enable_remote_autograd_cache=False), \
                inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
            return compile_fx(gm, example_inputs, inner_compile=self._inner)

    def _inner(self, gm, example_inputs, **kwargs):
        program = gpu_program(gm, example_inputs, self.device, **kwargs)
        index = len(self.programs)
        self.programs.append(program)
        counts = program.launches
        self.graphs.append((program.kind, counts))
        from umst_dev.op_counts import SIMULATED_GPU_PREFIX

        label = f"{SIMULATED_GPU_PREFIX}{sum(counts.values())}:{counts['triton']}"
        run = gm.forward
        runs = self.runs

        def call(args):
            runs[index] += 1
            with torch.profiler.record_function(label):
                return run(*args)
        call._boxed_call = True  # AOTAutograd passes a list
        return call

    @contextlib.contextmanager
    def count_runs(self):
        """Count the programs' runs afresh inside the block (:meth:`traffic` reads them)."""
        self.runs.clear()
        yield self

    def traffic(self):
        """What the programs' counted runs moved, by kind (forward, backward): launches, Triton launches, bytes,
        Triton bytes, FLOPs and the launches without a byte estimate, summed over runs (a layer class's program
        runs once per layer)."""
        out = {kind: dict(launches=0, triton=0, bytes=0, triton_bytes=0, flops=0, unsized=0, runs=0)
               for kind in ("forward", "backward")}
        for index, n in self.runs.items():
            program = self.programs[index]
            row = out[program.kind]
            row["runs"] += n
            row["launches"] += n * sum(program.launches.values())
            row["triton"] += n * program.launches["triton"]
            row["bytes"] += n * sum(program.bytes.values())
            row["triton_bytes"] += n * program.bytes["triton"]
            row["flops"] += n * program.flops
            row["unsized"] += n * len(program.unsized)
        return out


# ---- fused attention, as a GPU runs it ----------------------------------------------------------------------

def gpu_layout(shape, dtype, device=None):
    """An empty tensor of ``shape`` (batch, heads, length, dim) laid out as the GPU's fused attention lays out its
    outputs and gradients: batch, length, heads, dim in memory (aten's meta functions for memory-efficient
    attention); other ranks contiguous."""
    if len(shape) != 4:
        return torch.empty(shape, dtype=dtype, device=device)
    b, h, m, d = shape
    return torch.empty(b, m, h, d, dtype=dtype, device=device).transpose(1, 2)


_attention_ops = []


def _register_attention():
    """``umst_simulated::attention`` and its backward (once): one op each way, as a GPU's fused kernel."""
    if _attention_ops:
        return _attention_ops[0]
    from typing import Optional

    from torch import Tensor

    def probabilities(q, k, mask, dropout_p, is_causal, scale, seed):
        """softmax(q k^T scale + mask) and the dropout's scaled keep-mask, drawn from ``seed``."""
        scale = q.size(-1) ** -0.5 if scale is None else scale
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if mask is not None:
            scores = scores + mask
        if is_causal:
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(scores, dim=-1)
        keep = None
        if dropout_p > 0:
            generator = torch.Generator().manual_seed(int(seed))
            keep = (torch.rand(p.shape, generator=generator) >= dropout_p).to(p.dtype) / (1 - dropout_p)
        return p, keep, scale

    @torch.library.custom_op("umst_simulated::attention", mutates_args=())
    def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float, is_causal: bool,
                  scale: Optional[float]) -> tuple[Tensor, Tensor]:
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)  # as the GPU's kernel returns its Philox seed
        p, keep, _ = probabilities(q, k, mask, dropout_p, is_causal, scale, seed)
        return laid_out_as(torch.matmul(p if keep is None else p * keep, v)), seed

    def laid_out_as(result):
        """``result`` in the layout the GPU's fused kernel gives its outputs and gradients (batch, length, heads,
        dim in memory, seen as batch, heads, length, dim): the traced graph's views rely on it, and the GPU's
        lowering (``_as_gpu_attention``) must find the same."""
        return gpu_layout(result.shape, result.dtype).copy_(result)

    @attention.register_fake
    def _(q, k, v, mask, dropout_p, is_causal, scale):
        return gpu_layout((*q.shape[:-1], v.shape[-1]), q.dtype, q.device), q.new_empty(1, dtype=torch.int64)

    @torch.library.custom_op("umst_simulated::attention_backward", mutates_args=())
    def attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], seed: Tensor,
                           dropout_p: float, is_causal: bool, scale: Optional[float]) -> tuple[Tensor, Tensor, Tensor]:
        p, keep, scale = probabilities(q, k, mask, dropout_p, is_causal, scale, seed)
        dropped = p if keep is None else p * keep
        dv = torch.matmul(dropped.transpose(-2, -1), grad)
        dp = torch.matmul(grad, v.transpose(-2, -1))
        if keep is not None:
            dp = dp * keep
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * scale
        return laid_out_as(torch.matmul(ds, k)), laid_out_as(torch.matmul(ds.transpose(-2, -1), q)), laid_out_as(dv)

    @attention_backward.register_fake
    def _(grad, q, k, v, mask, seed, dropout_p, is_causal, scale):
        return tuple(gpu_layout(t.shape, t.dtype, t.device) for t in (q, k, v))

    def setup_context(ctx, inputs, output):
        q, k, v, mask, dropout_p, is_causal, scale = inputs
        ctx.save_for_backward(q, k, v, mask, output[1])
        ctx.options = (dropout_p, is_causal, scale)

    def backward(ctx, grad, _seed_grad):
        q, k, v, mask, seed = ctx.saved_tensors
        dq, dk, dv = attention_backward(grad, q, k, v, mask, seed, *ctx.options)
        return dq, dk, dv, None, None, None, None

    attention.register_autograd(backward, setup_context=setup_context)
    _attention_ops.append(attention)
    return attention


def additive_mask(mask, dtype):
    """An attention mask as the fused kernels take it: added to the scores, in the inputs' dtype (a boolean mask's
    False is -inf)."""
    from umst_plugin.modules.common import attention as plugin_attention

    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return plugin_attention.additive_mask(~mask, dtype)
    return mask.to(dtype)


@contextlib.contextmanager
def fused_attention():
    """``F.scaled_dot_product_attention`` with dropout as one op forward and one backward, as on a GPU (see the
    module's docstring): the same function of its inputs, its dropout mask from a seed of its own; the plugin's
    :func:`umst_plugin.modules.common.attention.attention` calls it wherever it would on a GPU. Without dropout
    torch's own runs (on a CPU its flash kernel, one op each way: inductor's GPU lowering then matched an H200's
    generated kernels exactly for the transformer's update)."""
    import torch.nn.functional as F

    op = _register_attention()
    real = F.scaled_dot_product_attention

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if enable_gqa or dropout_p == 0:  # without dropout a CPU runs its flash kernel: one op each way already
            return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        return op(q, k, v, additive_mask(attn_mask, q.dtype), dropout_p, is_causal, scale)[0]

    from umst_plugin.modules.common import attention as plugin_attention

    # the plugin's attention takes the GPU's path too: on a CPU, half precision with dropout would run its
    # explicit core (three kernels and their copies each way) and every core with dropout would be recomputed in
    # backward, neither of which a GPU does
    with mock.patch.object(F, "scaled_dot_product_attention", attention), plugin_attention.gpu_paths_on_cpu():
        yield
