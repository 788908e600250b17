"""Compiling the layers of a model (:func:`compile_layers`), and what a compiled layer's ``forward`` runs
(:func:`_dispatch`): its class's compiled forward, or its eager one for incremental decoding steps, inside
:func:`layers_eager`, and for the variants whose compile failed (``fallback``).
"""
import contextlib
import inspect
import time
import types

import torch
import torch.fx.experimental._config as fx_config

from umst_plugin.compilation import cache, fallback, graph_shapes, probe, regions, retry, telemetry
from umst_plugin.compilation.state import STATE
from umst_plugin.patches import inductor_scan, saved_activation_strides


def is_compiled(module):
    return "_umst_compiled" in module.__dict__


@contextlib.contextmanager
def layers_eager():
    """Inside, compiled layers run their eager forward (nothing is compiled, nothing falls back): for a pass under
    a dispatch mode, which compiled code refuses (the first ``--amp`` update records autocast's casts with one,
    ``amp_weights.WeightCache``)."""
    before = STATE.layers_eager
    STATE.layers_eager = True
    try:
        yield
    finally:
        STATE.layers_eager = before


def _incremental_index(function):
    """Position of ``incremental_state`` among ``function``'s positional parameters after ``self`` (None if it
    has none)."""
    params = list(inspect.signature(function).parameters)
    if "incremental_state" not in params:
        return None
    return params.index("incremental_state") - 1


def _plain(t):
    """``t`` as a contiguous tensor of its own (not a view). dynamo guards on strides and on whether an input is a
    view of another tensor: the first encoder layer gets a transposed view and the others a plain tensor, and
    fairseq's decoder passes its causal mask sliced from a buffer that is sometimes exactly its size -- as they
    come, each of those would compile a graph of its own. A copy costs one small kernel; a mask passed to every
    layer of a stack is copied once (the last one is kept while the same tensor, unchanged, comes again)."""
    if t._base is None and t.is_contiguous():
        return t
    if t.requires_grad:
        return t.clone(memory_format=torch.contiguous_format)
    source, version, copy = STATE.last_plain
    current = None if t.is_inference() else t._version
    if source is t and version == current and current is not None:
        return copy
    copy = t.clone(memory_format=torch.contiguous_format)
    STATE.last_plain = (t, current, copy)
    return copy


def _dispatch(self, *args, **kwargs):
    """A compiled layer's ``forward``: its class's compiled forward, except for incremental decoding steps and for
    the variants whose compiling failed (run eager, see ``fallback.fall_back``)."""
    compiled, eager, index = self._umst_compiled
    if STATE.layers_eager:
        return eager(self, *args, **kwargs)
    if index is not None:
        state = kwargs.get("incremental_state") if "incremental_state" in kwargs else (
            args[index] if len(args) > index else None)
        if state is not None:
            return eager(self, *args, **kwargs)
    args = tuple(_plain(a) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: _plain(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    key = (eager, fallback.variant(self, args, kwargs)) if STATE.eager_variants else None
    if key is not None and key in STATE.eager_variants:
        return eager(self, *args, **kwargs)
    if STATE.graph_caps:  # --compile-cudagraphs: beyond the class's cap of recorded shapes, compiled without graphs
        compiled = graph_shapes.pick(self, eager, compiled, args, kwargs)
    graphs, start = telemetry.compiled_graphs(), time.perf_counter()
    try:
        out = compiled(self, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 -- a failed compile falls back to eager; eager's own errors are raised
        if fallback.out_of_memory(e):
            raise  # fairseq's OOM handling, as eager
        fallback.fall_back(self, eager, fallback.variant(self, args, kwargs), fallback.shapes(args, kwargs),
                           "forward", e)
        return eager(self, *args, **kwargs)
    if telemetry.compiled_graphs() != graphs:
        telemetry.log_compiled(self, eager, time.perf_counter() - start, telemetry.compiled_graphs() - graphs)
    if torch.is_grad_enabled():
        retry.mark_backward(self, eager, args, kwargs, out)  # where its backward starts, if that fails
    return out


def configure_dynamo():
    """dynamo's settings while ``--compile`` is on (process-wide; see the package's docstring)."""
    import torch._dynamo.config as config  # (the compiler: imported only once something compiles)

    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # (torch < 2.7)
    if getattr(config, limit) < fallback.RECOMPILE_LIMIT:
        setattr(config, limit, fallback.RECOMPILE_LIMIT)
    config.specialize_float = True  # Python floats (dropout rates, scale fractions) are constants, not inputs
    # no duck sizing: two sizes equal in the first batch (as many words as tokens, a length equal to the width) are
    # not taken for one symbol, whose next batch would compile again; sizes that must be equal still are (guards)
    fx_config.use_duck_shape = False
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True  # an error, not a silent fall back to eager
    allow_custom_functions_in_autograd_cache()
    inductor_scan.install(load=True)  # prefix sums as ATen's scan on a GPU: Triton's took minutes to compile
    saved_activation_strides.install(load=True)  # a backward's saved strides symbolic, not the first batch's
    cache.key_caches_on_compiler_patches()  # (inductor's cache keys do not see the two patches above)


def allow_custom_functions_in_autograd_cache():
    """Let AOTAutograd's on-disk cache keep layers that call a custom ``torch.autograd.Function``: every family's
    lean layers do (UMST's GCN and attention, TranSFormer's, Prime's convolution), and torch leaves such graphs out
    of the cache by default, so each new process (a resumed run, every row of a speed table) traced and partitioned
    their forward + backward again, warm inductor cache or not (Prime's resumed toy run: 11.2 s of compiling, 5.3 s
    with this; docs/compile.md). torch's flag
    (``torch._functorch.config.autograd_cache_allow_custom_autograd_functions``) keys the cache on the Function's
    traced forward and backward graphs, so a changed Function compiles anew
    (tests/test_compile_cache.py). ``TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD=0`` in the environment turns
    it off (torch reads that variable before any value set here)."""
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "autograd_cache_allow_custom_autograd_functions"):  # (torch >= 2.8)
        functorch_config.autograd_cache_allow_custom_autograd_functions = True


CUDAGRAPHS_MODE = "reduce-overhead"  # torch.compile's mode with inductor's CUDA graph trees


def compile_layers(model, *, device=None, backend="inductor", mode=None, dynamic=True, fullgraph=True, check=True,
                   graph_shapes_cap=0):
    """Compile every encoder and decoder layer of ``model`` in place (see the package's docstring); returns the
    layers' names. ``check``: first ``probe.check_available`` on ``device`` (default: the model's). Compiling is
    lazy: each layer class compiles at its first call. ``graph_shapes_cap`` (with ``mode="reduce-overhead"``, CUDA
    graphs): each layer class records at most that many batch shapes as CUDA graphs and runs the others compiled
    without graphs (``graph_shapes``; 0: no cap). Raises ValueError for a model without layers this knows,
    ``CompileUnavailable`` where torch.compile cannot run."""
    graph_shapes.check_limit(graph_shapes_cap)
    layers = regions.find_layers(model)
    if not layers:
        raise ValueError(f"--compile: {type(model).__name__} has no encoder or decoder layer of a class "
                         f"--compile knows ({regions.KNOWN})")
    wrapped = [name for name, layer in layers if "forward" in layer.__dict__ and not is_compiled(layer)]
    if wrapped:  # fairseq's --checkpoint-activations replaces a layer's forward: compiling would drop it
        raise ValueError(f"--compile: the forward of {wrapped[0]} is replaced already (fairseq's "
                         "--checkpoint-activations?); compiling it would undo that: drop one of the two")
    if check:
        if device is None:
            param = next(model.parameters(), None)
            device = param.device if param is not None else "cpu"
        probe.check_available(device, backend)
    configure_dynamo()
    capped = mode == CUDAGRAPHS_MODE and graph_shapes_cap > 0
    if capped:
        _quiet_shape_warning(graph_shapes_cap)
    for _, layer in layers:
        if "_umst_compiled" in layer.__dict__:
            continue
        eager = type(layer).forward
        compiled = _compiled_function(eager, backend, mode, dynamic, fullgraph)
        if capped:  # (the graph-less variant compiles only if a call goes beyond the cap)
            graph_shapes.cap(compiled, graph_shapes_cap, _compiled_function(eager, backend, None, dynamic, fullgraph))
        layer._umst_compiled = (compiled, eager, _incremental_index(eager))
        layer.forward = types.MethodType(_dispatch, layer)
    return [name for name, _ in layers]


def _quiet_shape_warning(cap):
    """inductor warns once a compiled graph has recorded more than ``triton.cudagraph_dynamic_shape_warn_limit``
    sizes (8 in torch 2.13), advising to pad the inputs to a few shapes: a run on 8 length buckets meets about 16.
    With the cap a graph records at most ``cap`` sizes, and the cap's own warning says when a shape goes beyond."""
    import torch._inductor.config as inductor_config  # (the compiler: imported only once something compiles)

    limit = inductor_config.triton.cudagraph_dynamic_shape_warn_limit
    if limit is not None and limit < cap:
        inductor_config.triton.cudagraph_dynamic_shape_warn_limit = cap


def _compiled_function(eager, backend, mode, dynamic, fullgraph):
    """``eager`` compiled with these options: one torch.compile wrapper per class and options, shared by the
    class's layers."""
    key = (eager, (backend, mode, dynamic, fullgraph))
    if key not in STATE.compiled_functions:
        STATE.compiled_functions[key] = torch.compile(eager, backend=backend, mode=mode, dynamic=dynamic,
                                                      fullgraph=fullgraph)
    return STATE.compiled_functions[key]
