"""The gradient norm in one multi-tensor op, not one norm per parameter tensor.

fairseq's ``utils.clip_grad_norm_`` (every optimizer's ``clip_grad_norm``, run once an update whatever
``--clip-norm`` is: fairseq logs the norm) uses apex's ``multi_tensor_l2norm`` where apex is installed and
otherwise ``torch.norm`` on each gradient, one kernel per parameter tensor (344 for ``umst_base``). This module
computes the same norm -- the 2-norm of the per-tensor 2-norms, in float32 -- with ``torch._foreach_norm`` (one
multi-tensor op per device and dtype), and clips with ``torch._foreach_mul_`` by a coefficient that stays on
the device (as fairseq's does): no host sync, no per-tensor kernel. Expert gradients (MoE) are clipped but not
counted in the norm, as in fairseq.
"""
from collections import defaultdict

import torch

from umst_plugin.patches import wrap

OPTIONS = "none: every run (fairseq computes the norm every update, whatever `--clip-norm` is)"
TARGET = "fairseq.utils.clip_grad_norm_"
SYMPTOM = "the gradient norm launched one kernel per parameter tensor every update (without apex)"
REMOVE_WHEN = "fairseq computes the norm with torch._foreach_norm"


def total_norm(grads):
    """The 2-norm over all ``grads`` (float32): one ``_foreach_norm`` per device and dtype."""
    groups = defaultdict(list)
    for g in grads:
        groups[(g.device, g.dtype)].append(g)
    norms = []
    for (device, _), group in groups.items():
        norms.extend(torch._foreach_norm(group, 2.0, dtype=torch.float32))
    if len(norms) == 1:
        return norms[0]
    device = grads[0].device
    return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))


def clip_grad_norm_(params, max_norm, aggregate_norm_fn=None) -> torch.Tensor:
    """fairseq's ``utils.clip_grad_norm_`` (same arguments, same result) with multi-tensor ops."""
    if isinstance(params, torch.Tensor):
        params = [params]
    params = list(params)
    with_grad = [p for p in params if p is not None and getattr(p, "grad", None) is not None]
    grads = [p.grad.detach() for p in with_grad if not hasattr(p, "expert")]
    expert_grads = [p.grad.detach() for p in with_grad if hasattr(p, "expert")]
    if not grads:
        return params[0].new_tensor(0.0) if params else torch.tensor(0.0)
    norm = total_norm(grads)
    if aggregate_norm_fn is not None:
        norm = aggregate_norm_fn(norm)
    if max_norm > 0:
        clip_coef = (float(max_norm) / (norm + 1e-6)).clamp_(max=1)
        for (device, _), group in _by_device_dtype(grads + expert_grads).items():
            torch._foreach_mul_(group, clip_coef.to(device))
    return norm


def _by_device_dtype(tensors):
    groups = defaultdict(list)
    for t in tensors:
        groups[(t.device, t.dtype)].append(t)
    return groups


def install():
    from fairseq import utils

    # fairseq's own stays clip_grad_norm_.__wrapped__: the reference in tests/test_fused_update.py
    wrap(utils, "clip_grad_norm_", lambda original: clip_grad_norm_, __name__,
         "(params, max_norm, aggregate_norm_fn=None) -> torch.Tensor")
