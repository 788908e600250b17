"""The fused update (umst_plugin/patches/fused_adam.py, grad_norm.py): the same weights as fairseq's adam and grad
norm, in a handful of launches instead of several per parameter tensor."""
import copy
import math

import pytest
import torch

import umst_plugin  # noqa: F401  (installs the patches)
from benchmarks import bench_launches
from umst_plugin.op_counts import KernelLaunches
from umst_plugin.patches import fused_adam, grad_norm


def _params(seed=0, n=12):
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,)] * (n // 4)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _run(optimizer_cls, params, steps, seed=1, lr_schedule=(1e-2, 5e-3, 2e-3), **kwargs):
    opt = optimizer_cls(params, **kwargs)
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g) * (0.1 + i)
        for group in opt.param_groups:  # fairseq's set_lr changes lr between steps
            group["lr"] = lr_schedule[i % len(lr_schedule)]
        opt.step()
    return opt


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
@pytest.mark.parametrize("eps", [0.0, 1e-8])
def test_same_weights_as_fairseqs_adam(implementation, eps):
    from fairseq.optim.adam import Adam

    reference, fused = _params(), _params()
    kwargs = dict(lr=1e-2, betas=(0.9, 0.98), eps=eps, weight_decay=0.01)
    _run(Adam, reference, 8, **kwargs)
    _run(fused_adam.FusedAdam, fused, 8, implementation=implementation, **kwargs)
    for a, b in zip(reference, fused):
        # eps sits inside the bias correction in the fused kernel (module docstring): equal at eps = 0 up to
        # float32 rounding; otherwise apart by about lr * eps (1/sqrt(bc2) - 1) / sqrt(v) per step, which is
        # largest for the entries whose first gradients were tiny (here up to ~5e-6 after 8 steps at lr 1e-2)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=2e-5 if eps else 1e-6)


def test_eps_convention_is_what_the_docstring_says():
    """With a large eps the two conventions visibly differ, and by the stated formula."""
    from fairseq.optim.adam import Adam

    p_ref, p_fused = [torch.nn.Parameter(torch.ones(1))], [torch.nn.Parameter(torch.ones(1))]
    for opt in (Adam(p_ref, lr=1.0, betas=(0.9, 0.98), eps=0.1), fused_adam.FusedAdam(p_fused, lr=1.0,
                                                                                       betas=(0.9, 0.98), eps=0.1)):
        params = opt.param_groups[0]["params"]
        params[0].grad = torch.tensor([0.5])
        opt.step()
    bc1, bc2 = 1 - 0.9, 1 - 0.98
    m, v = 0.1 * 0.5, 0.02 * 0.25
    assert p_ref[0].item() == pytest.approx(1 - math.sqrt(bc2) / bc1 * m / (math.sqrt(v) + 0.1), rel=1e-6)
    assert p_fused[0].item() == pytest.approx(1 - 1 / bc1 * m / (math.sqrt(v / bc2) + 0.1), rel=1e-6)


def test_state_loads_across_the_two():
    from fairseq.optim.adam import Adam

    old = _run(Adam, _params(), 3, lr=1e-2, weight_decay=0.01)
    assert isinstance(old.state_dict()["state"][0]["step"], int)
    new_params = [p.detach().clone().requires_grad_() for p in old.param_groups[0]["params"]]
    new = fused_adam.FusedAdam(new_params, lr=1e-2, weight_decay=0.01)
    new.load_state_dict(copy.deepcopy(old.state_dict()))
    assert torch.is_tensor(new.state[new_params[0]]["step"]) and new.state[new_params[0]]["step"].item() == 3
    # both continue identically from the same state (eps 0: no convention difference)
    for opt in (old, new):
        for group in opt.param_groups:
            group["eps"] = 0.0
        for p in opt.param_groups[0]["params"]:
            p.grad = torch.full_like(p, 0.3)
        opt.step()
    for a, b in zip(old.param_groups[0]["params"], new_params):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    back = fused_adam._steps_to_int(copy.deepcopy(new.state_dict()))
    assert back["state"][0]["step"] == 4


def _trainer(arch="transformer", **overrides):
    name_overrides = dict(bench_launches.PRENORM, **overrides) if arch == "transformer" else overrides
    return bench_launches.build_trainer(arch, name_overrides, overrides.pop("precision", "fp32"), plugin=True,
                                        quick=True)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fairseq_trainer_same_weights_as_old_adam(precision):
    """Five real fairseq updates (clipping, weight decay, inverse-sqrt lr, --amp bf16 on the CPU): the plugin's
    fused update against fairseq's adam and per-tensor norm, from the same initial weights and batch."""
    from fairseq import utils as fairseq_utils

    runs = {}
    for old in (False, True):
        trainer, sample = bench_launches.build_trainer(
            "transformer", dict(bench_launches.PRENORM, use_old_adam=old, weight_decay=0.01, adam_eps=0.0),
            precision, plugin=True, quick=True)
        patched_norm = fairseq_utils.clip_grad_norm_
        if old:  # fairseq's own norm too: the original function, kept by the patch module's test helper below
            fairseq_utils.clip_grad_norm_ = _fairseq_clip_grad_norm_
        try:
            for _ in range(5):
                out = trainer.train_step([sample])
        finally:
            fairseq_utils.clip_grad_norm_ = patched_norm
        runs[old] = ({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, out)
        expected_cls = "Adam" if old else "FusedAdam"
        assert type(trainer.optimizer.optimizer).__name__ == expected_cls
    new_state, old_state = runs[False][0], runs[True][0]
    for key in old_state:
        if key.endswith("k_proj.bias"):
            # its gradient is zero but for rounding (softmax ignores a shift of every key score): Adam scales
            # that noise up to steps of about lr, and under bf16 the noise differs as soon as the weights differ
            # in their last fp32 bit; the learning rates of the 5 warm-up updates sum to 7.5e-5
            assert (new_state[key] - old_state[key]).abs().max() <= 2 * 7.5e-5, key
            continue
        torch.testing.assert_close(new_state[key], old_state[key], rtol=1e-4, atol=1e-5, msg=key)


def _fairseq_clip_grad_norm_(params, max_norm, aggregate_norm_fn=None):
    """fairseq 0.12.3's own clip_grad_norm_ without apex (the per-tensor norm), the reference."""
    params = [p for p in params if getattr(p, "grad", None) is not None]
    grads = [p.grad.detach() for p in params]
    if len(grads) == 1:
        total = torch.norm(grads[0], p=2, dtype=torch.float32)
    else:
        total = torch.norm(torch.stack([torch.norm(g, p=2, dtype=torch.float32) for g in grads]))
    if aggregate_norm_fn is not None:
        total = aggregate_norm_fn(total)
    if max_norm > 0:
        clip_coef = (float(max_norm) / (total + 1e-6)).clamp_(max=1)
        torch._foreach_mul_(grads, clip_coef)
    return total


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_grad_norm_equals_fairseqs(max_norm):
    ref, new = _params(n=40), _params(n=40)
    for params in (ref, new):  # a second dtype group: a bf16 weight
        params[0] = torch.nn.Parameter(params[0].detach().to(torch.bfloat16))
    g = torch.Generator().manual_seed(3)
    for a, b in zip(ref, new):
        a.grad = torch.randn(a.shape, generator=g).to(a.dtype)
        b.grad = a.grad.clone()
    n_ref = _fairseq_clip_grad_norm_(ref, max_norm)
    with KernelLaunches() as counter:
        n_new = grad_norm.clip_grad_norm_(new, max_norm)
    torch.testing.assert_close(n_new, n_ref, rtol=1e-6, atol=0)
    for a, b in zip(ref, new):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=0)
    assert counter.total <= 12, counter.top_ops()  # not one per tensor (40 here)


def test_patch_chooses_per_parameters():
    assert fused_adam.fused_available([torch.zeros(2), torch.zeros(3)]) == "fused"
    assert fused_adam.fused_available([torch.zeros(2, dtype=torch.float16)]) is None
    trainer, _ = bench_launches.build_trainer("transformer", dict(bench_launches.PRENORM, use_old_adam=True), "fp32",
                                              plugin=True, quick=True)
    from fairseq.optim.adam import Adam

    assert isinstance(trainer.optimizer.optimizer, Adam)


def test_amp_skips_a_non_finite_step_on_the_device():
    """bf16 --amp: an inf gradient leaves the weights and the fused optimizer's step count alone, and the grad
    scaler hands the flag to the kernel (no host sync in the scaler's step)."""
    from umst_plugin.op_counts import HostSyncs

    trainer, sample = bench_launches.build_trainer("transformer", dict(bench_launches.PRENORM), "bf16", plugin=True,
                                                   quick=True)
    trainer.train_step([sample])
    optimizer = trainer.optimizer
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    params = [p for p in trainer.model.parameters() if p.grad is not None or True]
    for p in params:
        p.grad = torch.ones_like(p)
    params[0].grad[0] = float("inf")
    optimizer.scaler.unscale_(optimizer.optimizer)
    with HostSyncs() as syncs:
        optimizer.step()
    assert not syncs.locations, dict(syncs.locations)
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)
    step = next(iter(optimizer.optimizer.state.values()))["step"]
    assert step.item() == 1


def test_update_launches_few_kernels_outside_the_model():
    """One whole fairseq update at tiny width: the optimizer and the grad norm take a handful of launches with the
    plugin (stock fairseq: about 7 per parameter tensor and 1 per tensor)."""
    fused = bench_launches.measure("transformer", "transformer", bench_launches.PRENORM, "fp32", True, True)
    old = bench_launches.measure("old", "transformer", dict(bench_launches.PRENORM, use_old_adam=True), "fp32", True,
                                 True)
    tensors = fused["parameter_tensors"]
    assert old["by_phase"]["optimizer"] >= 7 * tensors
    assert fused["by_phase"]["optimizer"] <= 10
    assert fused["by_phase"]["grad norm"] <= 12
    assert fused["by_phase"]["forward"] == old["by_phase"]["forward"]
