"""Regional compilation (``--compile``) and TF32 matmuls (``--tf32``).

``--compile`` compiles every encoder and decoder layer of a model with ``torch.compile`` (PyTorch's "regional
compilation": the layers, not the whole model). Layers of one class run the same compiled code: the class's
``forward`` is compiled once, and dynamo keeps its graphs on that function's code object, reused by every
instance whose attributes pass the same guards -- a 6-layer encoder compiles one graph, not six (and a decoder's
layers share one too, since ``patches/incremental_state_lookup.py`` keeps their per-layer state keys out of it).

* **Dynamic shapes.** Batch size and sequence lengths are symbolic from the first call (``dynamic=True``): the
  batches of an epoch, whatever their shapes, run the graphs compiled at warm-up. A few variants are compiled
  once each when first met: training (train mode, autograd) and evaluation (eval mode, no autograd); a batch
  without padding where fairseq then passes no padding mask; fairseq's decoder's causal mask sliced from a
  larger buffer; sizes 0 and 1, which torch specialises (a batch of one sentence).
* **Incremental decoding stays eager.** A decoder layer called with an ``incremental_state`` (beam search, one
  step at a time) runs its ordinary ``forward``; full-sequence calls (training, validation, scoring, the encoder
  in decoding) run the compiled one.
* **No graph breaks inside a layer** (``fullgraph=True``): a layer is compiled whole or not at all.
* **Loud, and never fatal after start-up.** :func:`check_available` compiles and runs a tiny function on the
  device at start-up, so a missing C++ compiler (inductor on a CPU) or an unsupported GPU (Triton) stops the run
  before training, with the cause. A compile that fails later -- a layer's first call, a recompile, compiled
  code failing at run time (a graph break, the recompile limit, an inductor error) -- does not end the run: that
  variant of the layer class (:func:`variant`) runs eager from then on, with a warning naming the class, the
  shapes and the error (:func:`fall_back`); a compiled backward that fails is traced to its layer (a hook on
  the layer's output marks where its backward starts) and fairseq's training step is retried with that variant
  eager (``patches/compile_flags.py``).
* **Compiled code kept with the run** (:func:`use_cache_dir`): fairseq-train keeps inductor's caches under
  ``SAVE_DIR/compile_cache``, so a resumed or requeued run compiles from them.
* **The compile time is logged**: each compiled call that compiled something logs the layer class, the mode and
  the seconds it took; ``compile_seconds()`` is dynamo's total (backward graphs, compiled at the first backward,
  included), and fairseq-train logs it per update that compiled, with the cache's hits and misses.

dynamo settings while ``--compile`` is on (process-wide): Python floats are constants (``specialize_float``: a
dropout rate or a scale fraction is not a graph input, which torch 2.13 would otherwise make symbolic and then
fail to pass through ``torch.utils.checkpoint``); no duck sizing (``use_duck_shape``: sizes that happen to be
equal in the first batch, such as as many words as tokens, do not become one symbol that the next batch breaks);
at least :data:`RECOMPILE_LIMIT` variants per layer class, and an error when a limit is hit (which falls back to
eager for that variant, with the warning).

``--tf32`` (:func:`set_tf32`): fp32 matmuls on TensorFloat-32 tensor cores (Ampere and newer GPUs): PyTorch's
defaults are ``torch.backends.cuda.matmul.allow_tf32 = False`` (matmuls in full fp32) and
``torch.backends.cudnn.allow_tf32 = True`` (cuDNN convolutions already in TF32); the flag sets both True.

Outside fairseq: ``compile_layers(model)`` compiles a built model the same way (``benchmarks/bench_archs.py
--compile``); :func:`uncompile_layers` undoes it.
"""
import contextlib
import logging
import os
import time
import traceback
import types

import torch

logger = logging.getLogger(__name__)

# dynamo keeps at most this many compiled variants per code object (torch's default: 8). A layer class's variants:
# train and eval, padding mask or none, sizes 1 specialised, layers whose Python attributes differ (the last
# decoder layer returns its attention for alignment; Prime's kernel sizes per layer); fairseq's base layers share
# one forward between the transformer's, UMST's and TranSFormer's decoders.
RECOMPILE_LIMIT = 64


class CompileUnavailable(RuntimeError):
    """torch.compile cannot run here (no C++ compiler for inductor on a CPU, no Triton, an unsupported torch)."""


def layer_classes():
    """The encoder and decoder layer classes ``--compile`` compiles: every family's, and fairseq's transformer
    layers (the transformer's, UMST's, TranSFormer's and MSMSA's decoders, MSMSA's encoder); also TranSFormer's
    encoder input region (``SlowFastInput``: its character table, embeddings and what its blocks share)."""
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

    from umst_plugin.modules.msc.layers import _PreNormMSCLayer
    from umst_plugin.modules.prime.layer import PrimeLayer
    from umst_plugin.models.transformer_sf import SlowFastInput
    from umst_plugin.modules.transformer_sf.encoder import SlowFastLayer
    from umst_plugin.modules.umst.encoder_layer import UMSTEncoderLayer

    return (TransformerEncoderLayerBase, TransformerDecoderLayerBase, UMSTEncoderLayer, SlowFastLayer,
            SlowFastInput, _PreNormMSCLayer, PrimeLayer)


def find_layers(model):
    """(name, module) of every encoder / decoder layer of ``model`` (outermost only), in module order."""
    classes = layer_classes()
    found, inside = [], []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if isinstance(module, classes):
            found.append((name, module))
            inside.append(name)
    return found


def describe(model):
    """'encoder: 6 x UMSTEncoderLayer, decoder: 6 x TransformerDecoderLayerBase' (compiled layers by part)."""
    import collections

    counts = collections.Counter()
    for name, layer in find_layers(model):
        counts[(name.split(".")[0], type(layer).__name__)] += 1
    return ", ".join(f"{part}: {n} x {cls}" for (part, cls), n in counts.items())


# ---- can torch.compile run here? ---------------------------------------------------------------------------

_available = {}


def _smoke(x):
    return torch.nn.functional.gelu(x * 2.0 + 1.0)


def check_available(device="cpu", backend="inductor"):
    """Compile and run a tiny function on ``device`` with ``backend`` (once per device type and backend); raise
    :class:`CompileUnavailable` with the cause and what to do if that fails. Returns the seconds it took."""
    device = torch.device(device)
    key = (device.type, backend)
    if key in _available:
        return _available[key]
    if not hasattr(torch, "compile"):
        raise CompileUnavailable(f"--compile needs torch >= 2.0 with torch.compile; this is torch {torch.__version__}")
    import torch._dynamo as dynamo

    if not dynamo.is_dynamo_supported():
        import sys

        raise CompileUnavailable(f"--compile: torch {torch.__version__} cannot compile on Python "
                                 f"{sys.version.split()[0]} (torch._dynamo does not support it); drop --compile or "
                                 "use a Python this torch supports")
    start = time.perf_counter()
    try:
        x = torch.randn(3, 5, device=device)
        fn = torch.compile(_smoke, backend=backend, fullgraph=True)
        torch.testing.assert_close(fn(x), _smoke(x))
    except Exception as e:  # noqa: BLE001 -- re-raised with the cause
        hint = ("inductor compiles C++ on a CPU: install a C++ compiler (g++ or clang; $CXX picks one)"
                if device.type == "cpu" else
                "inductor compiles Triton kernels on a GPU: install the triton that matches this torch; Triton "
                "needs an NVIDIA GPU of compute capability 7.0 or newer")
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CompileUnavailable(f"--compile: torch.compile (backend {backend}) cannot run on {device.type} here: "
                                 f"{type(e).__name__}: {message}\n{hint}; or drop --compile") from e
    _available[key] = time.perf_counter() - start
    return _available[key]


# ---- compiling the layers ----------------------------------------------------------------------------------

_compiled_functions = {}  # (forward function, options) -> its torch.compile wrapper


def _incremental_index(function):
    """Position of ``incremental_state`` among ``function``'s positional parameters after ``self`` (None if it
    has none)."""
    import inspect

    params = list(inspect.signature(function).parameters)
    if "incremental_state" not in params:
        return None
    return params.index("incremental_state") - 1


def _unique_graphs():
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def compiled_graphs():
    """Graphs dynamo has compiled in this process so far."""
    return int(_unique_graphs())


_last_plain = [None, None, None]  # (a tensor argument that was a view, its version, its plain copy)


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
    source, version, copy = _last_plain
    current = None if t.is_inference() else t._version
    if source is t and version == current and current is not None:
        return copy
    copy = t.clone(memory_format=torch.contiguous_format)
    _last_plain[:] = (t, current, copy)
    return copy


def _dispatch(self, *args, **kwargs):
    """A compiled layer's ``forward``: its class's compiled forward, except for incremental decoding steps and for
    the variants whose compiling failed (run eager, see :func:`fall_back`)."""
    compiled, eager, index = self._umst_compiled
    if _layers_eager[0]:
        return eager(self, *args, **kwargs)
    if index is not None:
        state = kwargs.get("incremental_state") if "incremental_state" in kwargs else (
            args[index] if len(args) > index else None)
        if state is not None:
            return eager(self, *args, **kwargs)
    args = tuple(_plain(a) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: _plain(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    key = (eager, variant(self, args, kwargs)) if _eager_variants else None
    if key is not None and key in _eager_variants:
        return eager(self, *args, **kwargs)
    graphs, start = _unique_graphs(), time.perf_counter()
    try:
        out = compiled(self, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 -- a failed compile falls back to eager; eager's own errors are raised
        if _out_of_memory(e):
            raise  # fairseq's OOM handling, as eager
        fall_back(self, eager, variant(self, args, kwargs), _shapes(args, kwargs), "forward", e)
        return eager(self, *args, **kwargs)
    if _unique_graphs() != graphs:
        _log_compiled(self, eager, time.perf_counter() - start, _unique_graphs() - graphs)
    if torch.is_grad_enabled():
        _mark_backward(self, eager, args, kwargs, out)
    return out


_layers_eager = [False]


@contextlib.contextmanager
def layers_eager():
    """Inside, compiled layers run their eager forward (nothing is compiled, nothing falls back): for a pass under
    a dispatch mode, which compiled code refuses (the first ``--amp`` update records autocast's casts with one,
    ``amp_weights.WeightCache``)."""
    before = _layers_eager[0]
    _layers_eager[0] = True
    try:
        yield
    finally:
        _layers_eager[0] = before


# ---- a compile that fails: that variant runs eager ----------------------------------------------------------------

class CompileFailure(RuntimeError):
    """A compiled layer's backward failed (the layer class and shapes in the message); the training step that
    raised it is retried with that variant eager (``patches/compile_flags.py``). A RuntimeError, so fairseq's
    Trainer passes it on without writing ``crash.pt``."""

    def __init__(self, message, key=None):
        super().__init__(message)
        self.key = key


_eager_variants = {}  # (eager forward function, variant) -> why it runs eager
_fallback_tracebacks = {}  # the same keys -> the end of the failure's traceback (for a bug report, not the log)


def _describe(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(min(int(s), 2) for s in value.shape))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _describe(v)) for k, v in value.items()))
    return type(value).__name__ if value is not None else None


def _modes(layer):
    autocast = torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")
    return type(layer), layer.training, torch.is_grad_enabled(), autocast


def variant(layer, args, kwargs, modes=None):
    """What a compiled variant of ``layer``'s forward is keyed on here: its class, train / eval, autograd, autocast
    (``modes``: as they were at the call), and per argument its type, dtype, rank and each size as 0, 1 or more
    (torch specialises sizes 0 and 1; any other size is symbolic). Every size of a variant runs eager once its
    compile failed, without compiling again."""
    return (*(modes or _modes(layer)), tuple(_describe(a) for a in args),
            tuple((k, _describe(v)) for k, v in kwargs.items()))


def _shapes(args, kwargs):
    """The tensor arguments' shapes and dtypes for a warning: "2x7x64 float32, [2x7 bool, None]"."""
    def one(v):
        if isinstance(v, torch.Tensor):
            return "x".join(map(str, v.shape)) + f" {str(v.dtype).replace('torch.', '')}"
        if isinstance(v, (list, tuple)) and any(isinstance(u, torch.Tensor) for u in v):
            # a list may hold other things beside its tensors (UMST's side inputs: None where a scale has none)
            return "[" + ", ".join(one(u) or type(u).__name__.replace("NoneType", "None") for u in v) + "]"
        return None
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items() if one(v) is not None]
    return ", ".join(p for p in parts if p is not None)


def _out_of_memory(e):
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def _reason(e):
    """One line: the exception and its message's first line; for dynamo's wrapper of a backend's error
    (``BackendCompilerFailed``, whose own first line is only "backend='...' raised:") the wrapped error too,
    which is the one that says what failed."""
    inner = getattr(e, "inner_exception", None)
    if type(e).__name__ == "BackendCompilerFailed" and isinstance(inner, BaseException):
        return f"{type(e).__name__} ({getattr(e, 'backend_name', 'backend')}): {_reason(inner)}"
    own, _, traced = str(e).strip().partition("from user code:")  # dynamo appends the user's frames to its messages
    first = next((line for line in own.splitlines() if line.strip()), "")
    if first:
        return f"{type(e).__name__}: {first[:300]}"
    # no message of its own (a bare ``assert`` in torch): where it was raised, and the user's line that dynamo
    # was tracing then
    frames = traceback.extract_tb(e.__traceback__)
    where = f" in {_short_path(frames[-1].filename)}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
    user = [line.strip() for line in traced.splitlines() if line.strip().startswith("File")]
    return f"{type(e).__name__} (no message){where}" + (f"; tracing {_user_frame(user[-1])}" if user else "")


def _short_path(path):
    """A source path from its package on (``torch/_dynamo/...``, ``umst_plugin/...``), or its file name."""
    path = path.replace("\\", "/")
    for root in ("/torch/", "/umst_plugin/", "/fairseq/"):
        if root in path:
            return root[1:] + path.split(root, 1)[1]
    return os.path.basename(path)


def _user_frame(line):
    """'umst_plugin/x.py:140 (f)' from a traceback line 'File "/.../umst_plugin/x.py", line 140, in f'."""
    import re

    match = re.match(r'File "(.*)", line (\d+), in (.*)', line)
    return f"{_short_path(match.group(1))}:{match.group(2)} ({match.group(3)})" if match else line


def fall_back(layer, eager, key, shapes, where, error):
    """Run ``layer``'s class eagerly for the variant ``key`` from now on, with a warning naming the class, the
    shapes and the error. The eager forward computes the same function, so results do not change."""
    name = eager.__qualname__
    mode = _mode_words(key)
    _eager_variants[(eager, key)] = f"{where}: {_reason(error)}"
    inner = getattr(error, "inner_exception", None)  # dynamo's wrapper drops the backend's own traceback
    _fallback_tracebacks[(eager, key)] = "".join(traceback.format_exception(error) + (
        traceback.format_exception(inner) if isinstance(inner, BaseException) else []))[-6000:]
    logger.warning("--compile: the compiled %s of %s failed (%s; inputs %s): %s. This variant of %s (same mode, "
                   "argument ranks and dtypes, any sizes other than 0 and 1) runs eager from now on, with the same "
                   "results; the other layers and variants stay compiled", where, type(layer).__name__, mode, shapes,
                   _reason(error), name)


def eager_variants():
    """{(layer forward's qualified name, variant): why} for the variants that fell back to eager in this process."""
    return {(f.__qualname__, key): why for (f, key), why in _eager_variants.items()}


def _mode_words(key):
    """A variant's mode as the warnings say it: "training, autograd", "evaluation, no autograd", ..."""
    return ("training" if key[1] else "evaluation") + (", autograd" if key[2] else ", no autograd")


def eager_fallbacks(model):
    """The variants of ``model``'s compiled layer classes that fell back to eager in this process, one line each
    ("Class.forward (training, autograd): forward: RuntimeError: ..."): what a benchmark of compiled layers must
    report beside its numbers, which otherwise count those layers' eager kernels as compiled ones."""
    forwards = compiled_forwards(model)
    return [f"{eager.__qualname__} ({_mode_words(key)}): {why}"
            for (eager, key), why in _eager_variants.items() if eager in forwards]


def fallback_tracebacks(model):
    """The tracebacks (their last 6,000 characters) of the failures behind :func:`eager_fallbacks`, in its order:
    what a report of a failed compile needs beyond the one line the warning gives."""
    forwards = compiled_forwards(model)
    return [_fallback_tracebacks.get((eager, key), "") for (eager, key) in _eager_variants if eager in forwards]


def fallback_record(model):
    """What a benchmark row of ``model`` compiled records of its fallbacks: ``eager_fallbacks`` (one line each,
    for the table) and ``eager_fallback_tracebacks`` (for a bug report)."""
    return dict(eager_fallbacks=eager_fallbacks(model), eager_fallback_tracebacks=fallback_tracebacks(model))


# The compiled layer whose backward runs now: a hook on a compiled layer's output fires when that output's
# gradient is ready, right before the layer's compiled backward runs (and the next layer's hook only after it).
_in_backward = [None]


def _mark_backward(layer, eager, args, kwargs, out):
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if isinstance(first, torch.Tensor) and first.requires_grad:
        info = (layer, eager, args, kwargs, _modes(layer))  # (described only if its backward fails)

        def entering(grad):
            _in_backward[0] = info
        first.register_hook(entering)


def start_step():
    """Before (and after) a training step's forward and backward: no compiled backward has run yet."""
    _in_backward[0] = None


def _from_compiled_code(e):
    """Whether ``e`` was raised in compiled code (AOTAutograd's runtime or inductor's generated code) or by the
    compiler itself."""
    import traceback

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        module = type(e).__module__ or ""
        if module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch")):
            return True
        for frame in traceback.extract_tb(e.__traceback__):
            path = frame.filename.replace("\\", "/")
            if "/torch/_functorch/" in path or "/torch/_inductor/" in path or "torchinductor" in path or \
                    "/torch/_dynamo/" in path:
                return True
        e = e.__cause__ or e.__context__
    return False


def backward_failure(error):
    """A :class:`CompileFailure` naming the compiled layer whose backward raised ``error`` (and marking that
    variant eager), or None where ``error`` did not come from a compiled layer's backward."""
    info = _in_backward[0]
    if info is None or isinstance(error, CompileFailure) or _out_of_memory(error) or not _from_compiled_code(error):
        return None
    layer, eager, args, kwargs, modes = info
    _in_backward[0] = None
    key, shapes = variant(layer, args, kwargs, modes), _shapes(args, kwargs)
    fall_back(layer, eager, key, shapes, "backward", error)
    failure = CompileFailure(f"--compile: the compiled backward of {type(layer).__name__} failed (inputs {shapes}): "
                             f"{_reason(error)}", key=(eager, key))
    failure.__cause__ = error
    return failure


def _log_compiled(layer, forward, seconds, graphs):
    mode = ("training" if layer.training else "evaluation") + (
        ", autograd" if torch.is_grad_enabled() else ", no autograd")
    logger.info("--compile: %s compiled in %.1f s (%s; %d new graph(s), %d in this process, %.1f s of compiling)",
                forward.__qualname__, seconds, mode, graphs, _unique_graphs(), compile_seconds())


def _configure_dynamo():
    import torch._dynamo.config as config

    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # (torch < 2.7)
    if getattr(config, limit) < RECOMPILE_LIMIT:
        setattr(config, limit, RECOMPILE_LIMIT)
    config.specialize_float = True  # Python floats (dropout rates, scale fractions) are constants, not inputs
    # no duck sizing: two sizes equal in the first batch (as many words as tokens, a length equal to the width) are
    # not taken for one symbol, whose next batch would compile again; sizes that must be equal still are (guards)
    import torch.fx.experimental._config as fx_config

    fx_config.use_duck_shape = False
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True  # an error, not a silent fall back to eager


def compile_layers(model, *, device=None, backend="inductor", mode=None, dynamic=True, fullgraph=True, check=True):
    """Compile every encoder and decoder layer of ``model`` in place (see the module docstring); returns the
    layers' names. ``check``: first :func:`check_available` on ``device`` (default: the model's). Compiling is
    lazy: each layer class compiles at its first call. Raises ValueError for a model without layers this knows,
    :class:`CompileUnavailable` where torch.compile cannot run."""
    layers = find_layers(model)
    if not layers:
        raise ValueError(f"--compile: {type(model).__name__} has no encoder or decoder layer of a class "
                         f"--compile knows ({', '.join(c.__name__ for c in layer_classes())})")
    wrapped = [name for name, layer in layers if "forward" in layer.__dict__ and not is_compiled(layer)]
    if wrapped:  # fairseq's --checkpoint-activations replaces a layer's forward: compiling would drop it
        raise ValueError(f"--compile: the forward of {wrapped[0]} is replaced already (fairseq's "
                         "--checkpoint-activations?); compiling it would undo that: drop one of the two")
    if check:
        if device is None:
            param = next(model.parameters(), None)
            device = param.device if param is not None else "cpu"
        check_available(device, backend)
    _configure_dynamo()
    options = (backend, mode, dynamic, fullgraph)
    for _, layer in layers:
        if "_umst_compiled" in layer.__dict__:
            continue
        eager = type(layer).forward
        key = (eager, options)
        if key not in _compiled_functions:
            _compiled_functions[key] = torch.compile(eager, backend=backend, mode=mode, dynamic=dynamic,
                                                     fullgraph=fullgraph)
        layer._umst_compiled = (_compiled_functions[key], eager, _incremental_index(eager))
        layer.forward = types.MethodType(_dispatch, layer)
    return [name for name, _ in layers]


def uncompile_layers(model):
    """Undo :func:`compile_layers` on ``model`` (its layers run their eager ``forward`` again)."""
    for _, layer in find_layers(model):
        layer.__dict__.pop("_umst_compiled", None)
        layer.__dict__.pop("forward", None)


def is_compiled(module):
    return "_umst_compiled" in module.__dict__


def compiled_forwards(model):
    """The eager ``forward`` functions of ``model``'s compiled layers (one per class), whose code objects hold
    dynamo's compiled variants (``cache_entries``)."""
    seen = []
    for _, layer in find_layers(model):
        if is_compiled(layer) and layer._umst_compiled[1] not in seen:
            seen.append(layer._umst_compiled[1])
    return seen


def cache_entries(function):
    """How many compiled variants dynamo holds for ``function`` (all instances of its class together)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(function.__code__))


# ---- compiled code kept with the run ----------------------------------------------------------------------------

CACHE_DIRNAME = "compile_cache"
# the directory use_cache_dir put in TORCHINDUCTOR_CACHE_DIR (torch reads the variable), also named here so that a
# process started from this one (a test's or a script's fairseq-train) does not take it for the user's choice
_SET_BY_PLUGIN = "UMST_PLUGIN_INDUCTOR_CACHE_DIR"


def user_cache_dir(environ):
    """The ``TORCHINDUCTOR_CACHE_DIR`` the user chose, from the environment the process started with, or None.
    Two values found there are not the user's choice and count as unset: the directory this plugin put there
    (named in ``UMST_PLUGIN_INDUCTOR_CACHE_DIR``), and torch's default directory, which torch itself writes into
    ``os.environ`` at a process's first compile (``torch._inductor.runtime.cache_dir_utils.cache_dir``), so that
    every process started after it (a test's or a script's fairseq-train) inherits it."""
    chosen = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or chosen == environ.get(_SET_BY_PLUGIN):
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        return None
    return chosen


_USER_CACHE_DIR = user_cache_dir(os.environ)  # as the process started


def use_cache_dir(directory):
    """Keep inductor's on-disk caches in ``directory`` (the run's ``SAVE_DIR/compile_cache``): its compiled graphs
    (the FX graph cache, C++ or Triton kernels included), AOTAutograd's forward + backward cache and dynamo's
    profile of which sizes are dynamic. A resumed or requeued run of the same command finds them there and skips
    inductor's code generation and kernel compilation (dynamo still traces each layer class once, in seconds).
    ``TORCHINDUCTOR_CACHE_DIR`` set by the user wins. Call before the first compile of the process. Returns
    (the directory in use, how many cached graphs it holds)."""
    if _USER_CACHE_DIR:
        directory = _USER_CACHE_DIR
    else:
        directory = os.path.abspath(directory)
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != directory:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory  # torch reads it at every cache access
            os.environ[_SET_BY_PLUGIN] = directory
            from torch._inductor.utils import clear_caches

            clear_caches()  # (in-memory caches of the previous directory's paths)
    os.makedirs(directory, exist_ok=True)
    return directory, cached_graphs(directory)


def cached_graphs(directory):
    """How many compiled graphs inductor's FX graph cache holds under ``directory``."""
    root = os.path.join(directory, "fxgraph")
    return sum(len(files) for _, _, files in os.walk(root)) if os.path.isdir(root) else 0


def cache_counts():
    """(hits, misses) of inductor's FX graph cache and AOTAutograd's cache in this process so far."""
    from torch._dynamo.utils import counters

    hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    misses = counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"]
    return int(hits), int(misses)


def cache_word(hits, misses):
    return "cache warm" if hits and not misses else ("cache cold" if not hits else "cache partly warm")


# ---- how long compiling took ---------------------------------------------------------------------------------

def compile_seconds():
    """Seconds dynamo and inductor have spent compiling in this process so far (forward and backward graphs)."""
    from torch._dynamo import utils

    spent = utils.calculate_time_spent()
    if "total_wall_time" in spent:
        return float(spent["total_wall_time"])
    return float(spent.get("entire_frame_compile", 0.0)) + float(spent.get("entire_backward_compile", 0.0))


class CompileTimeLog:
    """Compile seconds and graphs since it was made: ``log.summary(what)`` logs them (once)."""

    def __init__(self):
        self.graphs, self.seconds = _unique_graphs(), compile_seconds()

    def since(self):
        return _unique_graphs() - self.graphs, compile_seconds() - self.seconds

    def summary(self, what):
        graphs, seconds = self.since()
        logger.info("--compile: %s compiled %d graph(s) in %.1f s", what, graphs, seconds)
        return graphs, seconds


# ---- TF32 ------------------------------------------------------------------------------------------------------

def tf32_supported(device=None):
    """Whether ``device`` (default: the current CUDA device) has TF32 tensor cores (compute capability >= 8.0)."""
    if not torch.cuda.is_available():
        return False
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def set_tf32(enabled, device=None):
    """``--tf32``: fp32 matmuls and cuDNN convolutions in TensorFloat-32 on a GPU that has it (an info line); a
    warning where asked for without one. ``enabled=False`` changes nothing (PyTorch's defaults: fp32 matmuls in
    full fp32, cuDNN convolutions in TF32). Returns whether TF32 is on."""
    if not enabled:
        return False
    device = torch.device("cuda" if device is None else device)
    if not tf32_supported(device):
        if device.type != "cuda":
            where = f"this run computes on the {device.type}"
        elif not torch.cuda.is_available():
            where = "this process sees no CUDA device"
        else:
            major, minor = torch.cuda.get_device_capability(device)
            where = f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}"
        logger.warning("--tf32: TF32 needs an NVIDIA GPU of compute capability 8.0 or newer (Ampere, Hopper, ...); "
                       "%s, so fp32 matmuls stay in full fp32", where)
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    logger.info("--tf32: fp32 matmuls and convolutions on %s run on TensorFloat-32 tensor cores (inputs rounded to "
                "a 10-bit mantissa, fp32 accumulation)", torch.cuda.get_device_name(device))
    return True
