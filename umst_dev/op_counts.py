"""Counting what a model step dispatches: matmuls left in fp32 under autocast, and host-device syncs.

Both are ``TorchDispatchMode``s, so they see every aten op a step runs -- forward, the autograd engine's
backward, custom autograd functions -- on any device, a CPU included: a count taken on a CPU is the count a GPU
would see (the same Python runs the same ops), which is how the GPU path is checked without a GPU.

* :class:`MatmulDtypes`: every matrix product (mm, bmm, addmm, baddbmm, convolution, fused attention) with the
  floating dtypes of its inputs. Under ``torch.autocast(dtype=bf16/fp16)`` a product whose inputs are all
  float32 forgoes the low-precision units; in the backward pass that happens when a forward op ran in fp32 (its
  saved tensors are fp32) or a custom autograd function's backward runs outside autocast.
* :class:`HostSyncs`: every op that makes a GPU wait for the host (``.item()``, ``bool(t)``, ``if t.any()``,
  ``int(t)``, ``nonzero``, boolean-mask indexing, ...), each attributed to the innermost frame outside torch and
  this module (``file:line``), so a count says whose line it is (the plugin's, fairseq's, the caller's).
  Tensors that live on the host even when the model is on a GPU -- shapes turned into tensors
  (``torch.onnx.operators.shape_as_tensor``, as fairseq's positional embedding does), ``torch.tensor(...)``
  literals, and whatever is computed from those alone -- are tracked, and reading them is not counted.
  A copy to the host (``.cpu()``) is not seen on a CPU, where it is no op.
"""
import collections
import functools
import os
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
MATMUL_OPS = {_aten.mm.default, _aten.bmm.default, _aten.addmm.default, _aten.baddbmm.default,
              _aten.addbmm.default, _aten.convolution.default, _aten.convolution_backward.default,
              _aten._scaled_dot_product_flash_attention.default,
              _aten._scaled_dot_product_efficient_attention.default,
              _aten._scaled_dot_product_flash_attention_for_cpu.default,
              _aten._scaled_dot_product_flash_attention_backward.default,
              _aten._scaled_dot_product_efficient_attention_backward.default,
              _aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
SYNC_OPS = {_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.nonzero.default,
            _aten.equal.default, _aten.masked_select.default, _aten._unique2.default, _aten.unique_dim.default,
            _aten.unique_consecutive.default, _aten.repeat_interleave.Tensor}

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)


def _float_dtypes(args, kwargs):
    out = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            out.append(a.dtype)
    return out


class MatmulDtypes(TorchDispatchMode):
    """Counts matrix products by input dtypes: ``total``, ``fp32_only`` (every floating input float32)."""

    def __init__(self):
        super().__init__()
        self.total = 0
        self.fp32_only = 0
        self.by_op = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MATMUL_OPS:
            dtypes = _float_dtypes(args, kwargs)
            self.total += 1
            if dtypes and all(d == torch.float32 for d in dtypes):
                self.fp32_only += 1
                self.by_op[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)


def caller(skip=(_TORCH_DIR, _HERE)):
    """'path:line' of the innermost stack frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        name = os.path.abspath(frame.filename)
        if not name.startswith(skip) and "<frozen" not in name:
            return f"{name}:{frame.lineno}"
    return "?"


def owner(location):
    """'plugin', 'fairseq' or 'other' for a 'path:line'."""
    path = location.rsplit(":", 1)[0]
    if f"{os.sep}umst_plugin{os.sep}" in path:
        return "plugin"
    if f"{os.sep}fairseq{os.sep}" in path or f"{os.sep}fairseq_cli{os.sep}" in path:
        return "fairseq"
    return "other"


HOST_SOURCES = {_aten._shape_as_tensor.default, _aten.lift_fresh.default, _aten.lift_fresh_copy.default}


def tensors_in(x):
    """Every tensor in ``x``, through lists, tuples and dict values (an op's arguments, a module's output)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensors_in(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from tensors_in(v)


class HostSyncs(TorchDispatchMode):
    """Counts host-device syncs by the line that asked for them: ``locations`` ('path:line' -> n)."""

    def __init__(self):
        super().__init__()
        self.locations = collections.Counter()
        self._host = set()  # ids of live tensors that stay on the host on any device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = list(tensors_in(args)) + list(tensors_in(kwargs))
        host_inputs = bool(inputs) and all(id(t) in self._host for t in inputs)
        sync = func in SYNC_OPS
        if func is _aten.index.Tensor:  # boolean-mask indexing: the result size needs a nonzero
            sync = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or []))
        if sync and not host_inputs:
            self.locations[caller()] += 1
        out = func(*args, **kwargs)
        # a factory given no device at all (shape_as_tensor's empty) makes a host tensor on any device
        made_on_host = not inputs and "device" not in kwargs
        if func in HOST_SOURCES or host_inputs or made_on_host:
            for t in tensors_in(out):
                self._host.add(id(t))
                weakref.finalize(t, self._host.discard, id(t))
        return out

    def snapshot(self):
        """The counts so far as a new object, and start counting afresh (host tensors stay known)."""
        taken = HostSyncs.__new__(HostSyncs)
        taken.locations = self.locations
        self.locations = collections.Counter()
        return taken

    def by_owner(self):
        counts = collections.Counter()
        for location, n in self.locations.items():
            counts[owner(location)] += n
        return counts

    def plugin_lines(self):
        return {loc: n for loc, n in self.locations.items() if owner(loc) == "plugin"}


# ---- kernel launches ----------------------------------------------------------------------------------------

# ops that run no kernel on any device: views (``func.is_view``) are caught by their tag; these are the rest --
# bare allocations (memory, no work), metadata and aliasing ops, and the host read of a scalar (a copy engine
# transfer, not a kernel: the syncs above count it)
NO_KERNEL_OPS = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
                 _aten.new_empty.default, _aten.new_empty_strided.default, _aten._unsafe_view.default,
                 _aten.lift_fresh.default, _aten.resize_.default, _aten.set_.source_Storage,
                 _aten.set_.source_Storage_storage_offset, _aten.set_.source_Tensor, _aten._local_scalar_dense.default,
                 _aten.is_nonzero.default, _aten.sym_size.int, _aten.sym_stride.int, _aten.sym_numel.default,
                 _aten.sym_storage_offset.default, _aten.is_same_size.default, _aten.record_stream.default}
for _name in ("_record_function_enter", "_record_function_enter_new", "_record_function_exit"):
    _packet = getattr(torch.ops.profiler, _name, None)  # the profiler's range markers (record_function): no kernel
    if _packet is not None:
        NO_KERNEL_OPS.update(getattr(_packet, overload) for overload in _packet.overloads())
# torch's multi-tensor apply (every ``_foreach_*``, the fused optimizers, AMP's unscale) launches one CUDA kernel
# per chunk of tensors: at most MAX_TENSORS[depth] tensors (depth = the number of tensor lists the op reads and
# writes) and 320 blocks of 65,536 elements per launch (ATen/native/cuda/MultiTensorApply.cuh)
MULTI_TENSOR_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
MULTI_TENSOR_BLOCKS, MULTI_TENSOR_CHUNK = 320, 65536


def multi_tensor_launches(args):
    """Estimated CUDA launches of one multi-tensor op, from its tensor-list arguments (MultiTensorApply.cuh)."""
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    if not lists:
        return 1
    tensors = lists[0]
    max_tensors = MULTI_TENSOR_MAX_TENSORS.get(len(lists), 30)
    launches, in_launch, blocks = 0, 0, 0
    for t in tensors:
        if t.numel() == 0:
            continue
        chunks = -(-t.numel() // MULTI_TENSOR_CHUNK)
        in_launch += 1
        for _ in range(chunks):
            blocks += 1
            if blocks == MULTI_TENSOR_BLOCKS:
                launches, blocks = launches + 1, 0
                in_launch = 0 if _ == chunks - 1 else 1
        if in_launch == max_tensors:
            launches, in_launch, blocks = launches + (1 if blocks else 0), 0, 0
    return launches + (1 if blocks else 0) or 1


def is_multi_tensor(func):
    name = func.overloadpacket.__name__
    return name.startswith(("_foreach_", "_fused_", "_amp_foreach"))


def launches_of(func, args):
    """Kernels ``func`` launches on a GPU: 0 for views, allocations and metadata; multi-tensor ops by chunks;
    1 for every other op."""
    if func.is_view or func in NO_KERNEL_OPS:
        return 0
    if is_multi_tensor(func):
        return multi_tensor_launches(args)
    return 1


class KernelLaunches(TorchDispatchMode):
    """Counts the kernels a step launches, below autograd (forward ops, the autograd engine's backward, custom
    autograd functions, optimizers), by ``phase`` (set it, or use :meth:`in_phase`) and by op name.

    On a CPU the same Python dispatches the same aten ops as on a GPU, and on a GPU at base width a training
    step is launch-bound (docs/performance.md): this count, taken anywhere, is what a step costs there. What it
    counts as a launch: every op but views, bare allocations and metadata (:data:`NO_KERNEL_OPS`); a
    multi-tensor op as the launches CUDA's multi-tensor apply makes for its tensor lists. It does not see what
    runs below one aten op (a cuBLAS call is one op; on the GPU a matmul is one or two kernels), nor
    ``torch.compile``'s generated kernels (counted as the ops of the graph it runs: use the profiler there).
    """

    def __init__(self):
        super().__init__()
        self.phase = "rest"
        self.by_phase = collections.Counter()
        self.ops = collections.Counter()  # (phase, op name) -> launches
        self.dispatched = collections.Counter()  # phase -> aten ops dispatched (multi-tensor ops once)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        n = launches_of(func, args)
        if n:
            self.by_phase[self.phase] += n
            self.ops[(self.phase, func.overloadpacket.__name__)] += n
            self.dispatched[self.phase] += 1
        return func(*args, **kwargs)

    @property
    def total(self):
        return sum(self.by_phase.values())

    def in_phase(self, name):
        """Context manager: count what runs inside as ``name`` (restores the enclosing phase on exit)."""
        counter = self

        class _Phase:
            def __enter__(self):
                self.outer, counter.phase = counter.phase, name

            def __exit__(self, *exc):
                counter.phase = self.outer
        return _Phase()

    def top_ops(self, phase=None, n=15):
        counts = collections.Counter()
        for (p, op), k in self.ops.items():
            if phase is None or p == phase:
                counts[op] += k
        return counts.most_common(n)


# ---- matmul FLOPs that torch's counter misses ---------------------------------------------------------------

def _register_missing_flop_formulas():
    """``torch.utils.flop_counter`` has no formula for ``addbmm`` (a batched product summed over the batch: the
    same multiply-adds as ``bmm``); without one the benchmarks' FLOPs, the denominator of every per-FLOP ratio,
    left those products out (MSC's lean path uses it)."""
    from torch.utils import flop_counter

    if _aten.addbmm.default in flop_counter.flop_registry or _aten.addbmm in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(_aten.addbmm)
    def addbmm_flop(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
        return flop_counter.bmm_flop(a_shape, b_shape)


_register_missing_flop_formulas()


# ---- kernel launches from a profiler trace (compiled code) -----------------------------------------------------

# what torch.compile's inductor names the kernels it generates: C++ on a CPU (seen by the profiler with inductor's
# ``cpp.enable_kernel_profile``, see :func:`count_generated_kernels`), Triton on a GPU
GENERATED_KERNEL_MARKS = ("cpp_fused", "triton_", "triton kernel")  # the last: a Triton launch without a name
# a profiler range around a compiled graph that ran eagerly on a CPU, named with the kernels inductor generated for
# it for a simulated GPU (umst_dev.simulated_gpu): "simulated_gpu:<launches>:<generated kernels>"
SIMULATED_GPU_PREFIX = "simulated_gpu:"
# autograd metadata on a tensor, no kernel (the dispatch mode never sees it); a tensor's metadata queries (composite
# in torch 2.13, kernels of their own in torch 2.11)
NO_KERNEL_NAMES = {"detach_", "dim", "is_contiguous", "numel", "storage_offset"}


@functools.lru_cache(maxsize=None)
def _aten_kind(name):
    """How :func:`profiled_launches` treats a profiler event ``aten::name``: 'count' (one launch), 'skip' (no kernel:
    a view, an allocation, metadata -- and nothing below it counts), or 'composite' (decomposed above autograd,
    as ``linear`` or ``dropout``: what it calls is counted, not the op)."""
    packet = getattr(_aten, name, None)
    if packet is None:
        return "composite"  # not an aten operator torch knows by that name: look below it
    # (a named-tensor overload -- ``sum.dim_DimnameList``, ``cat.names`` -- is composite in torch 2.11, the GPU
    # machines' torch, and would make ``sum``, ``cat``, ``mean``, ``gather``, ... look decomposed: the kernel op
    # the event ran is another overload; torch 2.13 has none of these overloads)
    overloads = [getattr(packet, o) for o in packet.overloads() if not _named_tensor_overload(o)]
    if name in NO_KERNEL_NAMES:
        return "skip"
    if any(_is_composite_implicit(o) for o in overloads):  # first: ``to`` and ``contiguous`` may alias
        return "composite"
    if any(o.is_view or o in NO_KERNEL_OPS for o in overloads):
        return "skip"
    return "count"


def _named_tensor_overload(overload_name):
    """Whether an overload takes dimension names ('dim_DimnameList', 'dimname_out', 'names', 'names_dim')."""
    return "dimname" in overload_name.lower() or "names" in overload_name.split("_")


def _is_composite_implicit(overload):
    try:
        return overload.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except (RuntimeError, AttributeError):
        return False


def profiled_launches(events, phase_prefix="phase:"):
    """Kernel launches in a ``torch.profiler`` trace of CPU ops, by phase: ``(by_phase, by_op)`` Counters.

    What :class:`KernelLaunches` counts where a dispatch mode cannot look -- inside ``torch.compile``d code, which
    refuses to run under one: every outermost aten op below autograd (an op decomposed above autograd, such as
    ``linear``, counts as the ops it calls; views, allocations and metadata count nothing), and every kernel the
    compiler generated (``by_op['generated']``; on a CPU visible only where inductor compiled with
    ``cpp.enable_kernel_profile``). A phase is the innermost enclosing ``record_function`` range named
    ``phase_prefix + name`` ('rest' outside any); ops of another CPU thread than the one that opened the first
    phase range count as 'backward' (on a GPU the autograd engine runs backward on its device thread, outside
    the caller's ranges). On an eager step this gives KernelLaunches' count within 2% (tested; measured at most
    4 ops apart in 360, in UMST's backward). A multi-tensor op counts once here (the trace
    does not keep its tensor lists): count optimizer phases with KernelLaunches.
    """
    from torch.autograd import DeviceType

    by_phase, by_op = collections.Counter(), collections.Counter()
    roots = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    marked = [e for e in roots if e.name.startswith(phase_prefix)]
    main_thread = marked[0].thread if marked else None
    stack = [(e, "rest" if main_thread is None or e.thread == main_thread else "backward") for e in roots]
    while stack:
        event, phase = stack.pop()
        name = event.name
        if name.startswith(phase_prefix):
            phase = name[len(phase_prefix):]
        if name.startswith(SIMULATED_GPU_PREFIX):  # a compiled graph run eagerly, counted as its GPU program
            launches, generated = (int(n) for n in name[len(SIMULATED_GPU_PREFIX):].split(":"))
            by_phase[phase] += launches
            by_op["generated"] += generated
            by_op["simulated library calls"] += launches - generated
            continue
        if any(mark in name for mark in GENERATED_KERNEL_MARKS):
            by_phase[phase] += 1
            by_op["generated"] += 1
            continue
        if name.startswith("aten::"):
            kind = _aten_kind(name[len("aten::"):])
            if kind == "skip":
                continue
            if kind == "count":
                by_phase[phase] += 1
                by_op[name[len("aten::"):]] += 1
                continue
        stack.extend((child, phase) for child in event.cpu_children)
    return by_phase, by_op


def count_generated_kernels():
    """A context manager under which inductor compiles C++ kernels that the profiler sees (one range per call), so
    :func:`profiled_launches` can count them on a CPU. It must enclose the compilation, not only the run."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch({"cpp.enable_kernel_profile": True})
