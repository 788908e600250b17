"""``--optimizer adam`` is fairseq's adam, computed in one fused multi-tensor kernel, on CUDA and on the CPU.

fairseq's ``FairseqAdam`` uses apex's fused Adam when apex is installed (CUDA only) and otherwise its own
``fairseq.optim.adam.Adam``, which loops over the parameter tensors in Python: about 7 kernels per tensor
(2,410 launches an update for ``umst_base``'s 344 tensors), as many as the model's forward and backward together.
On a GPU at base width a step is launch-bound (docs/performance.md), so that loop nearly doubled an update.

With the plugin loaded, ``FairseqAdam`` builds :class:`FusedAdam`: fairseq's ``Adam`` -- the same update, the same
state and the same checkpoint format -- whose step is torch's fused AdamW kernel (``torch._fused_adamw_``: one
multi-tensor kernel per chunk of tensors on CUDA, one op on the CPU). ``--use-old-adam`` opts out (fairseq's flag),
as do the paths the kernel does not serve: ``--fp16-adam-stats``, TPUs, and parameters that are not float32
(``--memory-efficient-fp16/bf16`` step fp16/bf16 weights through fairseq's Adam, which keeps fp32 math for them).

**The same update, not torch's.** fairseq's adam (AdamW: decoupled weight decay) steps, at a parameter's step t,

    p <- p - lr * wd * p - lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps),    bc1 = 1 - beta1^t, bc2 = 1 - beta2^t

while torch's kernel steps ``p <- p - lr * wd * p - lr / bc1 * m / (sqrt(v / bc2) + eps)``: eps is added after the
bias correction, which is fairseq's update with ``eps * sqrt(bc2)`` in place of eps -- 18 times smaller at step 1
with beta2 = 0.997, and far from negligible for weights whose gradients are small (the shared embedding of a
5-update transformer run moved 47% of the summed learning rate apart from fairseq's). So the kernel is never given the step: it is given step infinity (its
bias corrections are then exactly 1) and fairseq's step size ``lr * sqrt(bc2) / bc1`` as its learning rate, which
makes its update fairseq's term by term: ``p - lr_t * wd_t * p - lr_t * m / (sqrt(v) + eps)`` with ``lr_t * wd_t
= lr * wd``. Parameters whose step counts differ (one first used late: fairseq's adam skips a parameter without
a gradient and does not count the step) are stepped in one kernel call per distinct step count.

* fp32 and ``--fp16``/``--bf16`` (flat fp32 master weights; fairseq's loss scaler skips an overflowing step on
  the host before the optimizer runs): the step counts are Python ints, as in fairseq's adam, and every number
  the kernel gets is a Python float -- one kernel call per step count, nothing else.
* ``--amp`` (the grad scaler hands the optimizer its non-finite flag, ``_step_supports_amp_scaling``): a step with
  inf/NaN gradients is skipped on the device, without the host sync fairseq's adam needs to decide it, so the
  step count lives on the device (one 0-d tensor per group of parameters with the same history), the step size
  is computed there (a few 0-d ops) and handed to the kernel as a tensor, and weight decay is one multi-tensor
  multiply by ``1 - lr * wd`` (by 1 on a skipped step) before the kernel, which gets weight decay 0.

tests/test_fused_update.py holds it to fairseq's own ``Adam`` over 100 steps (with weight decay, a warm-up lr,
a parameter first used late, amsgrad, the flat master weights of ``--fp16``, ``--amp`` with skipped steps).

Checkpoints are fairseq's adam's: the parameter groups hold fairseq's keys, and every step is saved as an int (a
device step is read once, when a checkpoint is written). Stock fairseq, ``--use-old-adam`` and this optimizer
load each other's checkpoints, as do checkpoints of the plugin's earlier versions (torch's AdamW: tensor steps
and torch's extra group keys, dropped on load).
"""
import logging
import math

import torch

from umst_plugin.patches import wrap

logger = logging.getLogger(__name__)

OPTIONS = "fairseq's `--optimizer adam`; its `--use-old-adam` turns this off"
TARGET = "fairseq.optim.adam.FairseqAdam.__init__, .load_state_dict"
SYMPTOM = ("--optimizer adam loops over every parameter tensor in Python (about 7 kernels each: 2,410 launches an "
           "update for umst_base, as many as forward and backward); its AMP step syncs with the host")
REMOVE_WHEN = "fairseq runs its adam's update in a fused multi-tensor kernel itself"

# The keys torch's AdamW adds to a parameter group (checkpoints of the plugin before it stepped fairseq's adam):
# fairseq's adam has none of them.
TORCH_ADAMW_KEYS = ("foreach", "fused", "capturable", "differentiable", "maximize", "decoupled_weight_decay")

_announced = set()


def fused_available(params):
    """``"fused"`` where torch's fused AdamW kernel serves these parameters (all float32, on one device type that
    has the kernel), else None: fairseq's adam."""
    params = [p for p in params if isinstance(p, torch.Tensor)]
    if not params or any(p.dtype != torch.float32 for p in params):
        return None
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = {p.device.type for p in params}
    if len(devices) == 1 and devices <= set(_get_fused_kernels_supported_devices()):
        return "fused"
    return None


def _flat_params(params):
    out = []
    for p in params:
        if isinstance(p, dict):
            out.extend(p["params"])
        else:
            out.append(p)
    return out


class FusedAdam(torch.optim.Optimizer):
    """fairseq's ``Adam`` (same arguments, parameter groups, state and update) stepped by torch's fused AdamW kernel.

    What fairseq asks of an optimizer holds: flat fp32 master parameters are fine (``supports_flat_params``); fp16
    weights are not (``supports_memory_efficient_fp16``: those go through fairseq's adam)."""

    _step_supports_amp_scaling = True  # GradScaler.step hands over grad_scale and found_inf (see step)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults)
        self._infinite_steps = {}  # device -> 0-d float32 inf: the step the kernel is told (bias corrections 1)

    @property
    def supports_memory_efficient_fp16(self):
        return False

    @property
    def supports_flat_params(self):
        return True

    def _infinite_step(self, device):
        step = self._infinite_steps.get(device)
        if step is None:
            step = self._infinite_steps[device] = torch.tensor(math.inf, dtype=torch.float32, device=device)
        return step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)  # set by GradScaler.step for this call
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            self._step_group(group, grad_scale, found_inf)
        return loss

    def _step_group(self, group, grad_scale, found_inf):
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay, amsgrad = group["lr"], group["eps"], group["weight_decay"], group.get("amsgrad", False)
        # (device, step) -> lists: parameters with the same step count share one kernel call
        cohorts = {}
        for p in group["params"]:
            if p.grad is None:
                continue  # as fairseq's adam: no update, the step not counted
            if p.grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
            state = self.state[p]
            if len(state) == 0:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            step = state["step"]
            if found_inf is not None and not torch.is_tensor(step):
                # the first --amp step (or the first after loading): the count moves to the device, where a
                # skipped step can leave it unchanged without the host knowing
                step = self._device_step(step, p.device)
            key = (p.device, step if not torch.is_tensor(step) else id(step))
            lists = cohorts.setdefault(key, ([], [], [], [], [], [], step))
            grad = p.grad if p.grad.dtype == p.dtype else p.grad.to(p.dtype)
            for i, t in enumerate((p, grad, state["exp_avg"], state["exp_avg_sq"],
                                   state["max_exp_avg_sq"] if amsgrad else None, state)):
                if t is not None:
                    lists[i].append(t)
        if not cohorts:
            return
        if found_inf is None and not any(torch.is_tensor(c[6]) for c in cohorts.values()):
            for (device, step), (params, grads, exp_avgs, exp_avg_sqs, max_sqs, states, _) in cohorts.items():
                self._host_step(device, step + 1, params, grads, exp_avgs, exp_avg_sqs, max_sqs, states, lr, beta1,
                                beta2, eps, weight_decay, amsgrad, grad_scale)
            return
        self._device_steps(cohorts, found_inf, grad_scale, lr, beta1, beta2, eps, weight_decay, amsgrad)

    def _device_step(self, step, device):
        """One shared 0-d float64 tensor per (device, count): parameters with the same count stay one cohort."""
        cache = self.__dict__.setdefault("_converting", {})
        key = (device, int(step))
        if key not in cache:
            cache[key] = torch.tensor(float(step), dtype=torch.float64, device=device)
        return cache[key]

    def _host_step(self, device, t, params, grads, exp_avgs, exp_avg_sqs, max_sqs, states, lr, beta1, beta2, eps,
                   weight_decay, amsgrad, grad_scale):
        # the step size exactly as fairseq's adam computes it (Python floats, double precision)
        step_size = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_sqs, [self._infinite_step(device)] * len(params),
                            lr=step_size, beta1=beta1, beta2=beta2,
                            weight_decay=weight_decay * lr / step_size if step_size else 0.0, eps=eps,
                            amsgrad=amsgrad, maximize=False, grad_scale=grad_scale, found_inf=None)
        for state in states:
            state["step"] = t

    def _device_steps(self, cohorts, found_inf, grad_scale, lr, beta1, beta2, eps, weight_decay, amsgrad):
        self.__dict__.pop("_converting", None)
        taken = {}  # device -> 1 - found_inf (0 on a skipped step), float64
        for (device, _), (params, grads, exp_avgs, exp_avg_sqs, max_sqs, states, step) in cohorts.items():
            if device not in taken:
                taken[device] = (torch.ones((), dtype=torch.float64, device=device) if found_inf is None else
                                 1 - found_inf.to(device, torch.float64, non_blocking=True))
            if weight_decay != 0:
                # decoupled weight decay, by 1 on a skipped step; the kernel's own would be lr_t * wd
                decay = (taken[device] * (-lr * weight_decay)).add_(1).to(torch.float32)
                torch._foreach_mul_(params, decay)
            t = step + taken[device]  # a new tensor: the cohort's count; the parameters not stepped keep theirs
            step_size = (torch.pow(beta2, t).neg_().add_(1).sqrt_().mul_(lr)
                         .div_(torch.pow(beta1, t).neg_().add_(1)).to(torch.float32))
            torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_sqs,
                                [self._infinite_step(device)] * len(params), lr=step_size, beta1=beta1, beta2=beta2,
                                weight_decay=0.0, eps=eps, amsgrad=amsgrad, maximize=False, grad_scale=grad_scale,
                                found_inf=None if found_inf is None else found_inf.to(device, non_blocking=True))
            for state in states:
                state["step"] = t

    def state_dict(self):
        """fairseq's adam's: every step an int (a device step is read here, once per cohort)."""
        state_dict = super().state_dict()
        state_dict["state"] = _steps_to_int(dict(state_dict["state"]))
        return state_dict

    def load_state_dict(self, state_dict):
        """fairseq's adam's state (int steps), or that of the plugin's earlier torch AdamW (tensor steps, torch's
        group keys): steps become ints, torch's keys are dropped."""
        state_dict = dict(state_dict)
        state_dict["param_groups"] = [{k: v for k, v in g.items() if k not in TORCH_ADAMW_KEYS}
                                      for g in state_dict["param_groups"]]
        state_dict["state"] = _steps_to_int(dict(state_dict.get("state", {})))
        super().load_state_dict(state_dict)


def _steps_to_int(state):
    """Every ``state[...]["step"]`` as an int (fairseq's adam reads it as a number: ``beta ** step``,
    ``math.sqrt``): a tensor step of a checkpoint becomes an int once, at load time; saving, a device step shared
    by a cohort of parameters is read once. Entries with a tensor step are replaced by copies, never changed."""
    read = {}
    for key, value in list(state.items()):
        if isinstance(value, dict) and torch.is_tensor(value.get("step")):
            step = value["step"]
            if id(step) not in read:
                read[id(step)] = int(round(step.item()))
            state[key] = dict(value, step=read[id(step)])
    return state


def install():
    from fairseq.optim.adam import Adam, FairseqAdam

    def make_init(original_init):
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
            self._optimizer = FusedAdam(params, **self.optimizer_config)
            if implementation not in _announced:
                _announced.add(implementation)
                logger.info("--optimizer adam: fairseq's adam in torch's fused AdamW kernel, all parameters in one "
                            "multi-tensor step (--use-old-adam: fairseq's per-parameter loop)")
        return __init__

    def make_load_state_dict(original_load):
        def load_state_dict(self, state_dict, optimizer_overrides=None):
            if isinstance(self._optimizer, Adam):
                state_dict = dict(state_dict, state=_steps_to_int(dict(state_dict.get("state", {}))))
            return original_load(self, state_dict, optimizer_overrides)
        return load_state_dict

    wrap(FairseqAdam, "__init__", make_init, __name__, "(self, cfg: fairseq.optim.adam.FairseqAdamConfig, params)")
    wrap(FairseqAdam, "load_state_dict", make_load_state_dict, __name__,
         "(self, state_dict, optimizer_overrides=None)")
