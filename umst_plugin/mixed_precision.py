"""Mixed precision for the ``multiscale_translation`` task: ``--amp --amp-dtype {float16,bfloat16}`` on CUDA
and on CPU, for training, validation and decoding.

fairseq 0.12 autocasts only inside ``FairseqTask.train_step``, with ``torch.cuda.amp.autocast`` (fp16, CUDA
only: on a CPU ``--amp`` silently trains in fp32), and validates and decodes in fp32. The task calls the
functions here instead, so that

* the forward pass of training, validation and decoding runs under ``torch.autocast(device, dtype)`` on the
  device the model lives on (fp32 master weights: the model stays fp32, autocast casts per op);
* bfloat16 has no loss scaling (its exponent range is fp32's): fairseq's ``AMPOptimizer`` grad scaler is
  switched off before the first backward;
* float16 keeps fairseq's grad scaler on CUDA; on a CPU (where ``torch.cuda.amp.GradScaler`` disables itself)
  it gets torch's CPU grad scaler, starting at ``--fp16-init-scale``, so fp16 gradients are scaled, unscaled
  and overflow-checked there as on a GPU; with either, gradients are unscaled once (a fairseq bug unscaled
  them twice, see ``_clip_grad_norm_unscaling_once``).

``plain_bf16_means_bf16`` makes fairseq's ``--bf16`` (which ``options.py`` turns into ``--tpu``) mean pure bf16
on a GPU or CPU where torch_xla is not installed, i.e. where fairseq would crash in ``get_tpu_device``.
"""
import contextlib
import logging
import types

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


def configure_grad_scaler(optimizer, device_type, dtype_name, init_scale=128):
    """Make fairseq's ``AMPOptimizer`` scale gradients the way ``dtype_name`` needs on ``device_type``
    (``init_scale``: ``--fp16-init-scale``, for the CPU fp16 scaler). Idempotent: called on every train step,
    acts once."""
    if getattr(optimizer, "_umst_amp_configured", None) == (device_type, dtype_name):
        return
    scaler = optimizer._grad_scaler
    if dtype_name == "bfloat16":
        # bf16 has fp32's exponent range: nothing underflows that fp32 keeps, so no loss scaling. A disabled
        # scaler passes the loss and the step through and reports scale 1.0 (fairseq logs it as loss_scale).
        optimizer._grad_scaler = torch.amp.GradScaler(device_type, enabled=False)
    elif device_type == "cpu" and not scaler.is_enabled():
        # torch.cuda.amp.GradScaler disables itself without CUDA; fp16 gradients still underflow on a CPU.
        optimizer._grad_scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    if optimizer._grad_scaler.is_enabled():
        optimizer.clip_grad_norm = types.MethodType(_clip_grad_norm_unscaling_once, optimizer)
    optimizer._umst_amp_configured = (device_type, dtype_name)
    logger.info("mixed precision: %s autocast on %s, %s", dtype_name, device_type,
                "grad scaler on" if optimizer._grad_scaler.is_enabled() else "no loss scaling")


def _clip_grad_norm_unscaling_once(self, max_norm, aggregate_norm_fn=None):
    """``AMPOptimizer.clip_grad_norm`` with the one-word fix of a fairseq 0.12 bug: it unscales through
    ``self.optimizer`` (the torch optimizer) but steps through ``self.fp32_optimizer`` (its fairseq wrapper);
    GradScaler keeps its unscaled/ready state per optimizer object, so ``step`` unscaled the gradients a second
    time and every update was divided by the loss scale (measured: SGD lr 1, gradient 2, scale 128 moved a
    weight by 2/128 instead of 2). Unscaling through the object that steps unscales once."""
    self.scaler.unscale_(self.fp32_optimizer)
    grad_norm = self.fp32_optimizer.clip_grad_norm(max_norm, aggregate_norm_fn)
    if not torch.isfinite(grad_norm).all():
        new_loss_scale = self.next_loss_scale
        if new_loss_scale <= self.min_loss_scale:
            raise FloatingPointError(
                f"AMP: Minimum loss scale reached ({self.min_loss_scale}). Your loss is probably exploding. "
                f"Try restarting training or use fp32. {new_loss_scale}")
        logger.info(f"AMP: overflow detected, setting scale to to {new_loss_scale}")
    return grad_norm


def is_amp_optimizer(optimizer):
    from fairseq.optim.amp_optimizer import AMPOptimizer

    return isinstance(optimizer, AMPOptimizer)


def amp_train_step(sample, model, criterion, optimizer, update_num, dtype_name, ignore_grad=False, init_scale=128):
    """``FairseqTask.train_step`` with ``torch.autocast(device, dtype)`` instead of fairseq's fp16-CUDA-only
    ``torch.cuda.amp.autocast`` (which, nested inside ours, would switch a bf16 region back to fp16)."""
    device_type = model_device_type(model)
    model.train()
    model.set_num_updates(update_num)
    if device_type in AUTOCAST_DEVICE_TYPES:
        configure_grad_scaler(optimizer, device_type, dtype_name, init_scale)
    with torch.autograd.profiler.record_function("forward"):
        with autocast(model, dtype_name):
            loss, sample_size, logging_output = criterion(model, sample)
    if ignore_grad:
        loss *= 0
    with torch.autograd.profiler.record_function("backward"):
        optimizer.backward(loss)
    return loss, sample_size, logging_output


def task_option(task_cfg, name, default):
    """An option of the task config, or ``default`` where it has none (a config stored before the option
    existed) or cannot resolve it (``amp: ${common.amp}`` in a task config built without the full fairseq
    config, e.g. from a bare dataclass)."""
    try:
        value = getattr(task_cfg, name, default)
    except Exception:  # unresolvable interpolation
        return default
    return default if value is None else value


# ---- plain --bf16 ----------------------------------------------------------------------------------

def _tpu_explicitly_requested(argv):
    return any(a == "--tpu" or a.lstrip("+").startswith("common.tpu=") for a in argv)


def plain_bf16_means_bf16(cfg, argv=None):
    """fairseq's options.py turns ``--bf16`` into ``--tpu``, so on a GPU or a CPU ``fairseq-train --bf16`` dies in
    ``get_tpu_device``. Where that would happen -- torch_xla not installed, ``--tpu`` not asked for -- make it
    mean what fairseq-hydra-train's ``common.bf16=true`` already means on those devices: bf16 weights with an
    fp32 master copy (fairseq's FP16Optimizer, no loss scaling). With torch_xla present nothing changes, so
    TPUs keep fairseq's behaviour. Returns whether the config was changed."""
    import importlib.util
    import sys

    from omegaconf import open_dict

    common = cfg.common
    if not (getattr(common, "bf16", False) and getattr(common, "tpu", False)):
        return False
    if importlib.util.find_spec("torch_xla") is not None or _tpu_explicitly_requested(sys.argv if argv is None
                                                                                      else argv):
        return False
    for group in ("common", "distributed_training"):
        node = getattr(cfg, group, None)
        if node is not None and "tpu" in node:
            with open_dict(node):
                node.tpu = False
    logger.info("--bf16 without torch_xla: bf16 weights on %s (fp32 master copy), not a TPU",
                "CPU" if getattr(common, "cpu", False) or not torch.cuda.is_available() else "CUDA")
    return True


def install():
    """Route fairseq's CLI entry (``distributed_utils.call_main``, which fairseq-train, fairseq-hydra-train and
    fairseq-interactive call after importing the plugin) through ``plain_bf16_means_bf16``."""
    from fairseq.distributed import utils as distributed_utils

    if getattr(distributed_utils.call_main, "_umst_bf16", False):
        return
    call_main = distributed_utils.call_main

    def call_main_with_bf16_on_any_device(cfg, main, **kwargs):
        plain_bf16_means_bf16(cfg)
        return call_main(cfg, main, **kwargs)

    call_main_with_bf16_on_any_device._umst_bf16 = True
    distributed_utils.call_main = call_main_with_bf16_on_any_device
