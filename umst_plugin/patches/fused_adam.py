"""Patch: ``--optimizer adam`` steps every parameter in one fused multi-tensor kernel, on CUDA and on the CPU.

fairseq's ``FairseqAdam`` uses apex's fused Adam when apex is installed (CUDA only) and otherwise its own
``fairseq.optim.adam.Adam``, which loops over the parameter tensors in Python: about 7 kernels per tensor
(2,410 launches an update for ``umst_base``'s 344 tensors), as many as the model's forward and backward together.
On a GPU at base width a step is launch-bound (docs/performance.md), so that loop nearly doubled an update.

With the plugin loaded, ``FairseqAdam`` builds :class:`FusedAdam` -- torch's fused AdamW (``torch._fused_adamw_``:
one multi-tensor kernel per chunk of tensors on CUDA, one op on the CPU), or its ``foreach`` implementation on a
device without the fused kernel -- following fairseq's own convention of using a fused Adam when one is
available. ``--use-old-adam`` opts out (fairseq's flag), as do the paths the fused kernel cannot serve exactly:
``--fp16-adam-stats``, TPUs, and parameters that are not float32 (``--memory-efficient-fp16/bf16`` step fp16/bf16
weights through fairseq's Adam, which keeps fp32 math for them). Under ``--amp`` the grad scaler hands the
fused kernel its non-finite flag (``_step_supports_amp_scaling``): a step with inf/NaN gradients is skipped on
the device, without the host sync that fairseq's adam needs to decide it.

The same algorithm: fairseq's adam is AdamW (decoupled weight decay: ``p -= lr * wd * p`` before the update). One
difference, the one apex's fused Adam (what fairseq uses on GPUs where apex is installed) has too: fairseq's own
adam adds eps to ``sqrt(v)`` and applies the bias correction to the step size, ``lr * sqrt(bc2) / bc1 * m /
(sqrt(v) + eps)``, while the fused kernels add it to the bias-corrected ``sqrt(v / bc2)``: ``lr / bc1 * m /
(sqrt(v / bc2) + eps)``. The two are identical for eps = 0 and differ by ``eps (1/sqrt(bc2) - 1)`` in the
denominator, which vanishes as training proceeds (bc2 -> 1 after about 1 / (1 - beta2) updates) and is
negligible next to ``sqrt(v)`` for any parameter that has seen gradients (tests/test_fused_update.py compares
the weights of both over several steps, with weight decay and under AMP).

Checkpoints load across the two: fairseq's adam stores the step as an int, torch's as a tensor; each side's
``load_state_dict`` converts.
"""
import logging

import torch

from umst_plugin.patches import expect_signature

logger = logging.getLogger(__name__)

TARGET = "fairseq.optim.adam.FairseqAdam.__init__, .load_state_dict"
SYMPTOM = ("--optimizer adam loops over every parameter tensor in Python (about 7 kernels each: 2,410 launches an "
           "update for umst_base, as many as forward and backward); its AMP step syncs with the host")
REMOVE_WHEN = "fairseq builds torch's fused AdamW for --optimizer adam itself"

_announced = set()


def fused_available(params):
    """``"fused"``, ``"foreach"`` or None: which of torch's AdamW implementations serves these parameters
    exactly (all float32, on a device with the fused kernel / any device), None where fairseq's adam must."""
    params = [p for p in params if isinstance(p, torch.Tensor)]
    if not params or any(p.dtype != torch.float32 for p in params):
        return None
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = {p.device.type for p in params}
    if len(devices) == 1 and devices <= set(_get_fused_kernels_supported_devices()):
        return "fused"
    return "foreach"


def _flat_params(params):
    out = []
    for p in params:
        if isinstance(p, dict):
            out.extend(p["params"])
        else:
            out.append(p)
    return out


class FusedAdam(torch.optim.AdamW):
    """torch's AdamW in its fused (or foreach) implementation, with what fairseq asks of an optimizer: flat
    fp32 master parameters are fine (``supports_flat_params``), fp16 weights are not
    (``supports_memory_efficient_fp16``: those go through fairseq's adam), and it loads the state of fairseq's
    adam (int steps)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
                 implementation="fused"):
        if implementation not in ("fused", "foreach"):
            raise ValueError(f"implementation must be 'fused' or 'foreach', got {implementation!r}")
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         fused=implementation == "fused", foreach=implementation == "foreach")
        self.implementation = implementation

    @property
    def supports_memory_efficient_fp16(self):
        return False

    @property
    def supports_flat_params(self):
        return True

    def load_state_dict(self, state_dict):
        # fairseq's adam keeps the step as an int; torch's fused and foreach paths need a float32 tensor
        for state in state_dict.get("state", {}).values():
            if isinstance(state.get("step"), (int, float)):
                state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32)
        super().load_state_dict(state_dict)


def _steps_to_int(state_dict):
    """fairseq's adam reads ``state["step"]`` as a number (``beta ** step``, ``math.sqrt``): a tensor step from a
    checkpoint of :class:`FusedAdam` becomes an int once, at load time, not a host sync per parameter per step."""
    for state in state_dict.get("state", {}).values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = int(state["step"].item())
    return state_dict


def install():
    from fairseq.optim.adam import Adam, FairseqAdam

    if getattr(FairseqAdam, "_umst_patched", False):
        return
    original_init = FairseqAdam.__init__
    original_load = FairseqAdam.load_state_dict
    expect_signature(original_init, "(self, cfg: fairseq.optim.adam.FairseqAdamConfig, params)", __name__)
    expect_signature(original_load, "(self, state_dict, optimizer_overrides=None)", __name__)

    def __init__(self, cfg, params):
        params = list(params)
        implementation = None
        if not (getattr(cfg, "use_old_adam", False) or getattr(cfg, "tpu", False)
                or getattr(cfg, "fp16_adam_stats", False)):
            implementation = fused_available(_flat_params(params))
        if implementation is None:
            original_init(self, cfg, params)
            why = ("--use-old-adam" if getattr(cfg, "use_old_adam", False) else
                   "non-float32 parameters or --fp16-adam-stats or a TPU")
            if ("old", why) not in _announced:
                _announced.add(("old", why))
                logger.info("--optimizer adam: fairseq's per-parameter Adam (%s)", why)
            return
        super(FairseqAdam, self).__init__(cfg)  # FairseqOptimizer.__init__
        self._optimizer = FusedAdam(params, implementation=implementation, **self.optimizer_config)
        if implementation not in _announced:
            _announced.add(implementation)
            logger.info("--optimizer adam: torch's %s AdamW, all parameters in one multi-tensor step "
                        "(--use-old-adam: fairseq's per-parameter Adam)", implementation)

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        if isinstance(self._optimizer, Adam):
            state_dict = _steps_to_int(state_dict)
        return original_load(self, state_dict, optimizer_overrides)

    FairseqAdam.__init__ = __init__
    FairseqAdam.load_state_dict = load_state_dict
    FairseqAdam._umst_patched = True
