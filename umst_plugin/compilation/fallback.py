"""A compile that fails runs that variant of the layer class eager, with a warning that says where and why.

A failure after start-up -- a layer's first call, a recompile, compiled code failing at run time (a graph break,
the recompile limit, an inductor error), a compiled backward (``retry``) -- does not end the run: the variant of the
layer class (:func:`variant`) runs eager from then on (:func:`fall_back`), with a warning naming the class, the
shapes and the error (:func:`reason`). The eager forward computes the same function, so results do not change.
"""
import logging
import os
import re
import traceback

import torch

from umst_plugin.compilation.state import STATE

logger = logging.getLogger(__package__)

# dynamo keeps at most this many compiled variants per code object (torch's default: 8). A layer class's variants:
# train and eval, padding mask or none, sizes 1 specialised, layers whose Python attributes differ (the last
# decoder layer returns its attention for alignment; Prime's kernel sizes per layer); fairseq's base layers share
# one forward between the transformer's, UMST's and TranSFormer's decoders. Each variant falls back at most once,
# which also bounds the retries of an update (retry.train_step).
RECOMPILE_LIMIT = 64


def _describe(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(min(int(s), 2) for s in value.shape))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _describe(v)) for k, v in value.items()))
    return type(value).__name__ if value is not None else None


def modes(layer):
    """(class, train / eval, autograd, autocast) of a call of ``layer`` now."""
    autocast = torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")
    return type(layer), layer.training, torch.is_grad_enabled(), autocast


def variant(layer, args, kwargs, modes_at_call=None):
    """What a compiled variant of ``layer``'s forward is keyed on here: its class, train / eval, autograd, autocast
    (``modes_at_call``: as they were at the call), and per argument its type, dtype, rank and each size as 0, 1 or
    more (torch specialises sizes 0 and 1; any other size is symbolic). Every size of a variant runs eager once its
    compile failed, without compiling again."""
    return (*(modes_at_call or modes(layer)), tuple(_describe(a) for a in args),
            tuple((k, _describe(v)) for k, v in kwargs.items()))


def shapes(args, kwargs):
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


def out_of_memory(e):
    """An out-of-memory error: raised as eager code raises it (fairseq handles it), never a fallback."""
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def _inductor_cache_dir():
    """Where inductor writes the code it generates (without asking torch, whose ``cache_dir()`` sets
    TORCHINDUCTOR_CACHE_DIR in this process's environment)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()


def generated_frame(e):
    """(path, line number, that line) of the innermost frame of ``e``'s traceback in a module inductor generated
    (under its cache directory): the line of a compiled graph's code that failed, such as a check of a saved
    tensor's strides (``assert_size_stride``); None where no frame is in generated code."""
    root = os.path.realpath(_inductor_cache_dir()) + os.sep
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if os.path.realpath(frame.filename).startswith(root):
            return frame.filename, frame.lineno, (frame.line or "").strip()
    return None


def generated_excerpt(e, context=8):
    """The lines of generated code around where ``e`` was raised (:func:`generated_frame`), numbered, the failing
    one marked: what a report of a compiled graph failing at run time needs, since inductor's cache, where the code
    lies, goes with the machine. "" where ``e`` was not raised in generated code."""
    found = generated_frame(e)
    if found is None:
        return ""
    path, lineno, _ = found
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return f"generated code {path}:{lineno} (no longer readable)\n"
    first, last = max(1, lineno - context), min(len(lines), lineno + context)
    shown = [f"{'>' if n == lineno else ' '}{n:6d}  {lines[n - 1]}" for n in range(first, last + 1)]
    return f"generated code {path}:{lineno}:\n" + "\n".join(shown) + "\n"


def reason(e):
    """One line: the exception and its message's first line; for dynamo's wrapper of a backend's error
    (``BackendCompilerFailed``, whose own first line is only "backend='...' raised:") the wrapped error too,
    which is the one that says what failed. An error raised in a compiled graph's generated code (a stride check
    of inductor's) also names the operator its message names on a later line ("Error in op: ...") and the
    generated line that raised it, whose symbolic sizes and strides say what the graph expected."""
    inner = getattr(e, "inner_exception", None)
    if type(e).__name__ == "BackendCompilerFailed" and isinstance(inner, BaseException):
        return f"{type(e).__name__} ({getattr(e, 'backend_name', 'backend')}): {reason(inner)}"
    own, _, traced = str(e).strip().partition("from user code:")  # dynamo appends the user's frames to its messages
    first = next((line for line in own.splitlines() if line.strip()), "")
    if first:
        op = re.search(r"^Error in op: (\S+)", own, flags=re.M)
        found = generated_frame(e)
        return (f"{type(e).__name__}: {first[:300]}" + (f" (in {op.group(1)})" if op else "")
                + (f"; generated code {os.path.basename(found[0])}:{found[1]}: {found[2][:300]}" if found else ""))
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
    match = re.match(r'File "(.*)", line (\d+), in (.*)', line)
    return f"{_short_path(match.group(1))}:{match.group(2)} ({match.group(3)})" if match else line


def mode_words(key):
    """A variant's mode as the warnings say it: "training, autograd", "evaluation, no autograd", ..."""
    return ("training" if key[1] else "evaluation") + (", autograd" if key[2] else ", no autograd")


def fall_back(layer, eager, key, input_shapes, where, error):
    """Run ``layer``'s class eagerly for the variant ``key`` from now on, with a warning naming the class, the
    shapes and the error. The eager forward computes the same function, so results do not change."""
    name = eager.__qualname__
    mode = mode_words(key)
    why = reason(error)
    STATE.eager_variants[(eager, key)] = f"{where}: {why}"
    inner = getattr(error, "inner_exception", None)  # dynamo's wrapper drops the backend's own traceback
    excerpt = generated_excerpt(error)
    STATE.fallback_tracebacks[(eager, key)] = "".join(traceback.format_exception(error) + (
        traceback.format_exception(inner) if isinstance(inner, BaseException) else []))[-6000:] + excerpt
    logger.warning("--compile: the compiled %s of %s failed (%s; inputs %s): %s. This variant of %s (same mode, "
                   "argument ranks and dtypes, any sizes other than 0 and 1) runs eager from now on, with the same "
                   "results; the other layers and variants stay compiled", where, type(layer).__name__, mode,
                   input_shapes, why, name)
    if excerpt:  # the code is in inductor's cache, on the machine: its lines go into the log
        logger.warning("--compile: where the compiled %s of %s failed, %s", where, type(layer).__name__,
                       excerpt.rstrip())
