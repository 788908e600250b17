"""Patch: fairseq's ``AMPOptimizer`` scales the loss the way the device and ``--amp-dtype`` need, and unscales
the gradients once.

fairseq-fixed 0.12.3.1's ``AMPOptimizer``

* builds ``torch.cuda.amp.GradScaler``, which disables itself without CUDA: on a CPU, fp16 ``--amp`` gradients
  were never scaled (they underflow) and no overflow was ever detected;
* for bf16 the plugin used to switch the scaler off; fairseq's overflow path then called
  ``get_backoff_factor()`` on the disabled scaler (``AttributeError: '_backoff_factor'``: a bf16 run died
  with a traceback on its first non-finite gradient, seen on an H100), and a disabled scaler's ``step`` would
  have written the inf into the weights;
* builds its scaler from ``--fp16-init-scale`` and, when ``--amp-scale-window`` is given, passes
  ``--amp-init-scale`` as the growth interval: ``--amp-init-scale`` ("default AMP loss scale") never set the
  scale and ``--amp-scale-window`` ("number of updates before increasing AMP loss scale") was never read;
* unscales through ``self.optimizer`` (the torch optimizer) in ``clip_grad_norm`` but steps through
  ``self.fp32_optimizer`` (its fairseq wrapper); the scaler keeps its unscaled state per object, so ``step``
  unscaled a second time and every update was divided by the loss scale (SGD lr 1, gradient 2, scale 128
  moved a weight by 2/128).

``__init__`` now ends by installing ``mixed_precision.make_grad_scaler(device, dtype)`` (fp16: a grad scaler on
CUDA or CPU from ``--amp-init-scale``, growing it after ``--amp-scale-window`` good updates (torch's 2,000 when
not given); bf16: the fixed-scale scaler that finds and skips non-finite steps) for
the run's ``--amp-dtype`` (``common.amp_dtype``, any task; ``training/amp_dtype_flag.py``), keeps that dtype as
``amp_dtype`` for the training step's autocast, and ``step`` steps through the object ``clip_grad_norm``
unscaled.
"""
import warnings

import torch

from umst_plugin import mixed_precision
from umst_plugin.patches import wrap

TARGET = "fairseq.optim.amp_optimizer.AMPOptimizer.__init__, .step"
SYMPTOM = ("--amp updates divided by the loss scale (double unscale); fp16 unscaled on a CPU; bf16 --amp "
           "dies on the first non-finite gradient (AttributeError '_backoff_factor')")
REMOVE_WHEN = ("fairseq unscales and steps through one object, builds its scaler per device and dtype, and reads "
               "--amp-init-scale and --amp-scale-window")


def amp_device_type(cfg):
    return "cpu" if getattr(cfg.common, "cpu", False) or not torch.cuda.is_available() else "cuda"


def install():
    from fairseq.optim.amp_optimizer import AMPOptimizer

    def make_init(original_init):
        def __init__(self, cfg, params, fp32_optimizer, **kwargs):
            with warnings.catch_warnings():  # the CUDA scaler it builds (and we replace) warns on a CPU
                warnings.simplefilter("ignore")
                original_init(self, cfg, params, fp32_optimizer, **kwargs)
            dtype_name = mixed_precision.configured_amp_dtype(cfg) or "float16"  # --amp-dtype, any task
            self.amp_dtype = dtype_name  # what train_step autocasts to (patches/task_autocast.py)
            # whether train_step casts the parameters autocast would cast in one kernel (umst_plugin/amp_weights.py)
            self.amp_weight_cache = not getattr(cfg.common, "no_amp_weight_cache", False)
            device_type = amp_device_type(cfg)
            option = mixed_precision.task_option  # a config without the key (a bare one in tests): the default
            init_scale = option(cfg.common, "amp_init_scale", None) or option(cfg.common, "fp16_init_scale", 2 ** 7)
            window = option(cfg.common, "amp_scale_window", None)
            self._grad_scaler = mixed_precision.make_grad_scaler(device_type, dtype_name, init_scale, window)
            mixed_precision.logger.info("mixed precision: %s autocast on %s, %s", dtype_name, device_type,
                                        "loss scale fixed at 1 (non-finite steps skipped)" if dtype_name == "bfloat16"
                                        else f"grad scaler from {init_scale} (--amp-init-scale), grown after "
                                             f"{window or 2000} good updates (--amp-scale-window)")
        return __init__

    def make_step(original_step):  # replaced, not called
        def step(self):
            # clip_grad_norm unscaled through self.optimizer: step through the same object, so the scaler sees
            # that the gradients are already unscaled (and skips the step when they were not finite)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return step

    wrap(AMPOptimizer, "__init__", make_init, __name__,
         "(self, cfg: omegaconf.dictconfig.DictConfig, params, fp32_optimizer, **kwargs)")
    wrap(AMPOptimizer, "step", make_step, __name__, "(self)")
