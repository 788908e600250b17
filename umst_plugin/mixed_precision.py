"""Mixed precision on every device: ``--amp --amp-dtype {float16,bfloat16}`` on CUDA and on CPU.

The pieces that change fairseq's own code live in ``umst_plugin/patches`` (``amp_optimizer``: the grad scaler per
device and dtype, gradients unscaled once; ``task_autocast``: every task's ``train_step`` autocasts on the model's
device; ``bf16_cli_flag``: plain ``--bf16`` off TPUs). This module holds what they and the task share:

* :func:`autocast`: ``torch.autocast`` on the device the model lives on, in the ``--amp-dtype``;
* :func:`make_grad_scaler`: what scales the loss for a device and dtype (fp16: a grad scaler; bf16: none is
  needed, but a fixed-scale one finds non-finite gradients so their step is skipped, as with fp16);
* :func:`amp_train_step`: fairseq's ``FairseqTask.train_step`` with that autocast;
* the inference-precision rule (:func:`inference_amp`): validation and decoding autocast when the command
  line of *this* process asks for ``--amp``, not because the checkpoint was trained with it.
"""
import contextlib
import logging

import torch

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


def make_grad_scaler(device_type, dtype_name, init_scale=128):
    """The grad scaler fairseq's ``AMPOptimizer`` should use for ``--amp-dtype dtype_name`` on ``device_type``
    (``init_scale``: ``--fp16-init-scale``)."""
    if dtype_name == "bfloat16":
        return FixedScaleGradScaler(device_type, init_scale=1.0, growth_interval=2000)
    # fp16: torch.cuda.amp.GradScaler disables itself without CUDA, yet fp16 gradients underflow on a CPU too
    return torch.amp.GradScaler(device_type, init_scale=init_scale)


def is_amp_optimizer(optimizer):
    from fairseq.optim.amp_optimizer import AMPOptimizer

    return isinstance(optimizer, AMPOptimizer)


def amp_train_step(task, sample, model, criterion, optimizer, update_num, ignore_grad=False):
    """``FairseqTask.train_step`` (same steps) with ``torch.autocast(device, --amp-dtype)`` in place of fairseq's
    fp16-CUDA-only ``torch.cuda.amp.autocast``, which cannot be nested inside (it would switch a bf16 region
    back to fp16) and does nothing on a CPU."""
    model.train()
    model.set_num_updates(update_num)
    with torch.autograd.profiler.record_function("forward"):
        with autocast(model, task_option(task.cfg, "amp_dtype", "float16")):
            loss, sample_size, logging_output = criterion(model, sample)
    if ignore_grad:
        loss *= 0
    with torch.autograd.profiler.record_function("backward"):
        optimizer.backward(loss)
    return loss, sample_size, logging_output


def task_option(task_cfg, name, default):
    """An option of the task config, or ``default`` where it has none (a config stored before the option
    existed, or a task without it) or cannot resolve it (``amp: ${common.amp}`` in a task config built
    without the full fairseq config, e.g. from a bare dataclass)."""
    try:
        value = getattr(task_cfg, name, default)
    except Exception:  # unresolvable interpolation
        return default
    return default if value is None else value


# ---- inference precision: the command line of this process, not the checkpoint --------------------------

_process_amp = None  # None: no command line seen (fairseq-generate builds its task from its own command line)


def set_process_amp(enabled):
    """Record whether this process's command line asked for ``--amp`` (fairseq-train, -validate, -interactive,
    -hydra-train: their entry ``call_main`` sees it; ``from_pretrained``: its ``amp`` argument)."""
    global _process_amp
    _process_amp = bool(enabled)


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
    return bool(task_option(task.cfg, "amp", False))
