"""Mixed precision on every device: ``--amp --amp-dtype {float16,bfloat16}`` on CUDA and on CPU, under any task.

The pieces that change fairseq's own code live in ``umst_plugin/training/amp_dtype_flag.py`` (``--amp-dtype`` in
fairseq's common options, so every task and CLI has it) and in ``umst_plugin/patches`` (``amp_optimizer``: the
grad scaler per device and dtype, gradients unscaled once; ``task_autocast``: every task's training, validation
and decoding steps autocast on the model's device; ``bf16_cli_flag`` and ``generate_cli``: the command line's
precision recorded, plain ``--bf16`` off TPUs; ``checkpoint_precision``: the dtype a loaded checkpoint was trained
in). This module holds what they
and the tasks share:

* :func:`autocast`: ``torch.autocast`` on the device the model lives on, in the ``--amp-dtype``;
* :func:`make_grad_scaler`: what scales the loss for a device and dtype (fp16: a grad scaler; bf16: none is
  needed, but a fixed-scale one finds non-finite gradients so their step is skipped, as with fp16);
* :func:`amp_train_step`: fairseq's ``FairseqTask.train_step`` with that autocast;
* :func:`configured_amp_dtype`: the ``--amp-dtype`` a config names (``common.amp_dtype``, or the task's own
  ``amp_dtype`` that ``multiscale_translation`` configs, older checkpoints' included, carry);
* the inference-precision rules (:func:`inference_amp`, :func:`inference_amp_dtype`): validation and decoding
  autocast when the command line of *this* process asks for ``--amp``, not because the checkpoint was trained
  with it; in the dtype this process names, else the one the checkpoint was trained in, else float16.
"""
import contextlib
import logging

import torch

from umst_plugin import amp_weights
from umst_plugin.compilation import layers_eager

logger = logging.getLogger(__name__)

AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
AUTOCAST_DEVICE_TYPES = ("cuda", "cpu")


def amp_dtype(name):
    return AMP_DTYPES[str(name)]


def model_device_type(model):
    """'cuda', 'cpu', ... : where the model's parameters live (fairseq moves model and batch together)."""
    for p in model.parameters():
        return p.device.type
    return "cpu"


_announced = set()


def autocast(model, dtype_name, enabled=True, what=None):
    """``torch.autocast`` on the model's device in ``dtype_name``; a no-op when disabled or on devices autocast
    does not cover here (XLA keeps fairseq's own path). ``what`` (e.g. "decoding") is logged once."""
    device_type = model_device_type(model)
    if not enabled or device_type not in AUTOCAST_DEVICE_TYPES:
        return contextlib.nullcontext()
    if what and (what, device_type, dtype_name) not in _announced:
        _announced.add((what, device_type, dtype_name))
        logger.info("mixed precision: %s under %s autocast on %s", what, dtype_name, device_type)
    return torch.autocast(device_type, dtype=amp_dtype(dtype_name))


class FixedScaleGradScaler(torch.amp.GradScaler):
    """bf16's grad scaler: scale 1 (bf16 has fp32's exponent range: nothing underflows that fp32 keeps), never
    above 1. It stays enabled for what a scaler does besides scaling: ``unscale_`` finds inf/NaN gradients,
    ``step`` skips the update that would write them into the weights, and the scale halves, so fairseq's AMP
    path logs the overflow, retries the batch ``--amp-batch-retries`` times and skips it; after
    log2(1 / --min-loss-scale) overflows close together fairseq stops with FloatingPointError (crash checkpoint,
    NaN detector), as an fp16 run does. Good steps double the scale back to 1 (every ``growth_interval``)."""

    def update(self, new_scale=None):
        super().update(new_scale)
        if self._scale is not None:
            self._scale.clamp_(max=1.0)  # on the device: no host sync


def make_grad_scaler(device_type, dtype_name, init_scale=128, scale_window=None):
    """The grad scaler fairseq's ``AMPOptimizer`` should use for ``--amp-dtype dtype_name`` on ``device_type``:
    fp16 starts at ``init_scale`` (``--amp-init-scale``); both grow the scale after ``scale_window`` updates
    without an overflow (``--amp-scale-window``; torch's 2,000 when None), bf16 back to 1 at most."""
    growth_interval = 2000 if scale_window is None else int(scale_window)
    if dtype_name == "bfloat16":
        return FixedScaleGradScaler(device_type, init_scale=1.0, growth_interval=growth_interval)
    # fp16: torch.cuda.amp.GradScaler disables itself without CUDA, yet fp16 gradients underflow on a CPU too
    return torch.amp.GradScaler(device_type, init_scale=float(init_scale), growth_interval=growth_interval)


def is_amp_optimizer(optimizer):
    from fairseq.optim.amp_optimizer import AMPOptimizer

    return isinstance(optimizer, AMPOptimizer)


def amp_train_step(task, sample, model, criterion, optimizer, update_num, ignore_grad):
    """``FairseqTask.train_step`` (same steps) with ``torch.autocast(device, --amp-dtype)`` in place of fairseq's
    fp16-CUDA-only ``torch.cuda.amp.autocast``, which cannot be nested inside (it would switch a bf16 region
    back to fp16) and does nothing on a CPU."""
    model.train()
    model.set_num_updates(update_num)
    dtype_name = training_amp_dtype(optimizer, task)
    cache = weight_cache(model, optimizer, dtype_name)
    recording = cache is not None and cache.names is None  # the first update runs autocast's way, recorded
    usage = none_before = None
    if cache is not None and cache.names:  # a cached parameter unused in this pass must keep a None gradient
        usage = amp_weights.Usage()
        none_before = {id(p) for p in cache.parameters() if p.grad is None}
    with torch.autograd.profiler.record_function("forward"):
        # the recording update runs compiled layers eager: compiled code refuses the recorder's dispatch mode
        # (and would take it for a failed compile)
        with cache.record(amp_dtype(dtype_name)) if recording else contextlib.nullcontext(), \
                layers_eager() if recording else contextlib.nullcontext():
            with autocast(model, dtype_name, what="training"):
                with amp_weights.cast_weights_once(model, amp_dtype(dtype_name), cache, usage):
                    loss, sample_size, logging_output = criterion(model, sample)
    if ignore_grad:
        loss *= 0
    with torch.autograd.profiler.record_function("backward"):
        optimizer.backward(loss)
    if recording:
        cache.settle()
    elif usage is not None:
        cache.drop_unused_gradients(usage, none_before)
    return loss, sample_size, logging_output


def weight_cache(model, optimizer, dtype_name):
    """The model's :class:`amp_weights.WeightCache` (autocast's parameter casts in one kernel), or None where it
    is off: ``--no-amp-weight-cache``, a device autocast does not cover, LayerDrop. Under ``--compile`` too: each
    layer's graph would otherwise cast its weights one kernel each (on a simulated H200, a fifth of the transformer's
    compiled forward and backward kernels, docs/compile.md)."""
    if not getattr(optimizer, "amp_weight_cache", True) or model_device_type(model) not in AUTOCAST_DEVICE_TYPES:
        return None
    cache = model.__dict__.get("_umst_amp_weight_cache")
    if cache is None:
        if amp_weights.layerdrop(model):
            cache = False
            logger.info("autocast casts: LayerDrop leaves parameters unused in some updates; one cast each")
        else:
            cache = amp_weights.WeightCache(model)
        model.__dict__["_umst_amp_weight_cache"] = cache
    return cache or None


def task_option(task_cfg, name, default):
    """An option of the task config, or ``default`` where it has none (a config stored before the option
    existed, or a task without it) or cannot resolve it (``amp: ${common.amp}`` in a task config built
    without the full fairseq config, e.g. from a bare dataclass)."""
    try:
        value = getattr(task_cfg, name, default)
    except Exception:  # unresolvable interpolation
        return default
    return default if value is None else value


def configured_amp_dtype(cfg):
    """The ``--amp-dtype`` a full fairseq config names, or None where it names none: the task's own ``amp_dtype``
    (``multiscale_translation``'s, which follows ``common.amp_dtype`` unless set apart: a config stored before
    the flag was common, or ``+task.amp_dtype=...``), else ``common.amp_dtype`` (any task)."""
    for group in ("task", "common"):
        try:
            node = getattr(cfg, group, None)
        except Exception:
            node = None
        value = task_option(node, "amp_dtype", None)
        if value is not None:
            return check_amp_dtype(value)
    return None


def check_amp_dtype(name):
    """``name`` as a string, or ValueError naming the choices."""
    name = str(name)
    if name not in AMP_DTYPES:
        raise ValueError(f"amp_dtype {name!r}: expected one of {', '.join(AMP_DTYPES)}")
    return name


def training_amp_dtype(optimizer, task=None):
    """The autocast dtype of a training step: the one the ``AMPOptimizer`` built its grad scaler for (from the
    run's config, ``patches/amp_optimizer.py``), else the task's, else float16."""
    name = getattr(optimizer, "amp_dtype", None)
    if name is None and task is not None:
        name = task_option(getattr(task, "cfg", None), "amp_dtype", None)
    return str(name or "float16")


# ---- inference precision: the command line of this process, not the checkpoint --------------------------

_process_amp = None  # None: no command line seen
_process_amp_dtype = None  # None: the command line named no --amp-dtype


def set_process_amp(enabled, dtype_name=None):
    """Record whether this process's command line asked for ``--amp``, and the ``--amp-dtype`` it named, if any
    (fairseq-train, -validate, -interactive, -hydra-train: their entry ``call_main`` sees it; fairseq-generate:
    its ``main``)."""
    global _process_amp, _process_amp_dtype
    _process_amp = bool(enabled)
    _process_amp_dtype = None if dtype_name is None else check_amp_dtype(dtype_name)


def record_command_line(cfg):
    """What a CLI entry calls with its full config: :func:`set_process_amp` from it, and a warning where
    ``--amp-dtype`` is given without ``--amp`` (it does nothing then)."""
    amp = bool(task_option(getattr(cfg, "common", None), "amp", False))
    dtype_name = configured_amp_dtype(cfg)
    if dtype_name is not None and not amp and task_option(getattr(cfg, "common", None), "amp_dtype", None):
        logger.warning("--amp-dtype %s has no effect without --amp", dtype_name)
    set_process_amp(amp, dtype_name)


def inference_amp(task):
    """Whether validation and decoding autocast: what ``from_pretrained(..., amp=...)`` said for this task (default
    no), else the command line of this process when one was seen, else the task config's ``amp`` (which
    fairseq-generate resolves from its own command line). A checkpoint trained with ``--amp`` stores
    ``amp: true`` in its task config; ``from_pretrained`` and fairseq-validate rebuild the task from it, so
    without this rule they would decode under autocast wherever the model is loaded."""
    explicit = getattr(task, "inference_amp", None)
    if explicit is not None:
        return bool(explicit)
    if _process_amp is not None:
        return _process_amp
    return bool(task_option(getattr(task, "cfg", None), "amp", False))


def inference_amp_dtype(task):
    """The autocast dtype of validation and decoding, the first that names one of: ``from_pretrained(...,
    amp_dtype=...)``; this process's ``--amp-dtype``; the task config's ``amp_dtype`` (``multiscale_translation``:
    the checkpoint's, where fairseq-validate rebuilds the task from it); the dtype the loaded checkpoint was
    trained in (any task: ``patches/checkpoint_precision.py``); else float16 (fairseq's ``--amp``)."""
    for value in (getattr(task, "inference_amp_dtype", None), _process_amp_dtype,
                  task_option(getattr(task, "cfg", None), "amp_dtype", None),
                  getattr(task, "checkpoint_amp_dtype", None)):
        if value is not None:
            return check_amp_dtype(value)
    return "float16"


def inference_autocast(task, model, what):
    """The autocast of a validation or decoding step of ``task`` (a no-op unless :func:`inference_amp`)."""
    if not inference_amp(task):
        return contextlib.nullcontext()
    return autocast(model, inference_amp_dtype(task), what=what)
