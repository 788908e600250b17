"""The retry of a training update whose compiled backward failed: every step of it, in the order it happens.

A compiled forward that fails falls back inside the layer call (``dispatch``: the call runs eager, nothing else
changes). A compiled *backward* fails later, inside ``loss.backward()``, in autograd's engine, where no layer call
is on the stack: the error says neither which layer nor which variant, and fairseq's Trainer would write
``crash.pt`` and stop for any error that is not a RuntimeError. So, under fairseq-train ``--compile``:

1. **The forward marks where each compiled backward starts** (:func:`mark_backward`, called by ``dispatch`` for a
   compiled call under autograd): a hook on the layer's (first) output, which autograd runs when that output's
   gradient is ready -- right before the layer's compiled backward, and the next layer's hook only after it -- and
   which records the layer, its arguments and its modes in ``STATE.in_backward``.
2. **The task's ``train_step`` names the failure** (:func:`catch_compiled_backward` wraps it on the Trainer's task):
   an error from compiled code (:func:`from_compiled_code`) while a compiled backward runs becomes a
   :class:`CompileFailure` naming the layer class, the shapes and the error (:func:`backward_failure`), and that
   variant runs eager from now on (``fallback.fall_back``). A CompileFailure is a RuntimeError: fairseq's Trainer
   passes it on as it is, without writing ``crash.pt``. Out-of-memory errors and errors of eager code go on as
   they came.
3. **The Trainer's ``train_step`` retries the update** (:func:`train_step`, called by ``flags``'s wrapper of
   ``Trainer.train_step``): from the start, with the same batches (fairseq zeroes the gradients and sets the same
   seed), now running that variant eager. Each failure turns one more variant eager, so the retries end (at most
   ``RECOMPILE_LIMIT``). With several processes the update cannot be retried (the others wait inside its gradient
   all-reduce): the failure stops the run, saying to resume it.
4. **Each attempt starts clean** (:func:`start_step`, before and after every attempt): no compiled backward has run.

Outside fairseq's Trainer (a test, a benchmark) :func:`backward_failure` turns an error into the same
CompileFailure; the caller retries.
"""
import logging
import traceback

import torch

from umst_plugin.compilation import fallback
from umst_plugin.compilation.state import STATE

logger = logging.getLogger(__package__)


class CompileFailure(RuntimeError):
    """A compiled layer's backward failed (the layer class and shapes in the message); the training step that
    raised it is retried with that variant eager (:func:`train_step`). A RuntimeError, so fairseq's Trainer passes
    it on without writing ``crash.pt``."""

    def __init__(self, message, key=None):
        super().__init__(message)
        self.key = key


def mark_backward(layer, eager, args, kwargs, out):
    """Step 1: a hook on the compiled call's output that records ``layer`` in ``STATE.in_backward`` when its
    compiled backward starts."""
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if isinstance(first, torch.Tensor) and first.requires_grad:
        info = (layer, eager, args, kwargs, fallback.modes(layer))  # (described only if its backward fails)

        def entering(grad):
            STATE.in_backward = info
        first.register_hook(entering)


def start_step():
    """Step 4: before (and after) a training step's forward and backward: no compiled backward has run yet."""
    STATE.in_backward = None


def from_compiled_code(e):
    """Whether ``e`` was raised in compiled code (AOTAutograd's runtime or inductor's generated code) or by the
    compiler itself."""
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
    """Step 2: a :class:`CompileFailure` naming the compiled layer whose backward raised ``error`` (and marking that
    variant eager), or None where ``error`` did not come from a compiled layer's backward."""
    info = STATE.in_backward
    if info is None or isinstance(error, CompileFailure) or fallback.out_of_memory(error) or \
            not from_compiled_code(error):
        return None
    layer, eager, args, kwargs, modes = info
    STATE.in_backward = None
    key, shapes = fallback.variant(layer, args, kwargs, modes), fallback.shapes(args, kwargs)
    fallback.fall_back(layer, eager, key, shapes, "backward", error)
    failure = CompileFailure(f"--compile: the compiled backward of {type(layer).__name__} failed (inputs {shapes}): "
                             f"{fallback.reason(error)}", key=(eager, key))
    failure.__cause__ = error
    return failure


def catch_compiled_backward(task):
    """Step 2: the task's ``train_step`` (forward and backward of one batch) with a failure of a compiled layer's
    backward raised as :class:`CompileFailure`, for :func:`train_step` to retry the update. Once per task."""
    if "train_step" in task.__dict__:
        return
    original = task.train_step

    def train_step(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except Exception as e:
            failure = backward_failure(e)
            if failure is None:
                raise
            raise failure from e
    task.train_step = train_step


def train_step(trainer, original, samples, raise_oom):
    """Step 3: fairseq's ``Trainer.train_step`` (``original``) with an update whose compiled backward failed retried
    from the start (fairseq zeroes the gradients and sets the same seed) with the failing layer variant eager; each
    failure turns one more variant eager, so the retries end."""
    try:
        for _ in range(fallback.RECOMPILE_LIMIT):
            start_step()
            try:
                return original(trainer, samples, raise_oom)
            except CompileFailure as failure:
                if trainer.data_parallel_world_size > 1:
                    raise CompileFailure(
                        f"{failure} -- with {trainer.data_parallel_world_size} processes the update cannot be "
                        "retried (the others are inside its gradient all-reduce); resume the run (the same command) "
                        "from its last checkpoint, or drop --compile") from failure
                logger.warning("--compile: retrying update %d (the same batches) with that variant eager",
                               trainer.get_num_updates() + 1)
        raise RuntimeError(f"--compile: update {trainer.get_num_updates() + 1} failed in {fallback.RECOMPILE_LIMIT} "
                           "compiled variants")
    finally:
        start_step()
