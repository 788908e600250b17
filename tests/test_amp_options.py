"""fairseq's AMP options do what fairseq's help says (umst_plugin/patches/amp_optimizer.py): --amp-init-scale is the
first loss scale, --amp-scale-window the good updates before it grows, --min-loss-scale where training stops.
fairseq's own AMPOptimizer read --fp16-init-scale and passed --amp-init-scale as the growth interval."""
import pytest
import torch

import umst_plugin  # noqa: F401  (installs the patches)
from benchmarks import bench_launches


def _amp_trainer(**overrides):
    return bench_launches.build_trainer("transformer", dict(bench_launches.PRENORM, **overrides), "fp16",
                                        plugin=True, quick=True)


def test_amp_init_scale_is_the_first_loss_scale():
    trainer, sample = _amp_trainer(amp_init_scale=512, fp16_init_scale=64)
    trainer.train_step([sample])  # a good update keeps it (the window is 2,000)
    assert trainer.optimizer.scaler.get_scale() == 512.0


def test_amp_scale_window_is_the_growth_interval():
    """--amp-scale-window 2: the scale doubles after every 2 updates without an overflow (fairseq: after 2,000,
    or after --amp-init-scale updates when a window was given)."""
    trainer, sample = _amp_trainer(amp_init_scale=16, amp_scale_window=2)
    scales = []
    for _ in range(4):
        trainer.train_step([sample])
        scales.append(trainer.optimizer.scaler.get_scale())
    assert scales == [16.0, 32.0, 32.0, 64.0]


def test_min_loss_scale_stops_training():
    """An overflow that would take the scale to --min-loss-scale stops with fairseq's FloatingPointError; above it,
    the scale backs off and training goes on."""
    for min_loss_scale, stops in ((64, True), (1, False)):
        trainer, sample = _amp_trainer(amp_init_scale=128, min_loss_scale=min_loss_scale)
        optimizer = trainer.optimizer
        optimizer.scaler.scale(torch.ones(()))  # the scaler builds its scale tensor on first use
        params = list(trainer.model.parameters())
        for p in params:
            p.grad = torch.ones_like(p)
        params[0].grad[0] = float("inf")
        if stops:
            with pytest.raises(FloatingPointError, match="Minimum loss scale reached"):
                optimizer.clip_grad_norm(0.0)
        else:
            assert not torch.isfinite(optimizer.clip_grad_norm(0.0))
            optimizer.step()
            assert optimizer.scaler.get_scale() == 64.0


def test_the_amp_optimizer_takes_its_dtype_device_and_weight_cache_from_the_flags(monkeypatch, caplog):
    """What the patched AMPOptimizer reads from the command line: ``--amp-dtype`` (fp16 without it, fairseq's
    --amp), a fixed loss scale of 1 for bf16 (said in its log line), ``--no-amp-weight-cache``; and its grad
    scaler's device: the CPU under ``--cpu`` or where no CUDA device is visible, else CUDA."""
    import logging
    from types import SimpleNamespace

    from umst_plugin.patches import amp_optimizer

    with caplog.at_level(logging.INFO, logger="umst_plugin"):
        fp16 = bench_launches.build_trainer("transformer", bench_launches.PRENORM, "fp16", plugin=False,
                                            quick=True)[0].optimizer  # --amp without --amp-dtype
        bf16 = bench_launches.build_trainer("transformer", dict(bench_launches.PRENORM, no_amp_weight_cache=True),
                                            "bf16", plugin=True, quick=True)[0].optimizer
    assert (fp16.amp_dtype, fp16.amp_weight_cache) == ("float16", True)
    assert (bf16.amp_dtype, bf16.amp_weight_cache) == ("bfloat16", False)
    assert "mixed precision: bfloat16 autocast on cpu, loss scale fixed at 1 (non-finite steps skipped)" in caplog.text
    assert "mixed precision: float16 autocast on cpu, grad scaler from" in caplog.text

    def device(cpu, cuda):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        return amp_optimizer.amp_device_type(SimpleNamespace(common=SimpleNamespace(cpu=cpu)))
    assert [device(cpu, cuda) for cpu, cuda in ((True, True), (False, True), (True, False), (False, False))] == \
        ["cpu", "cuda", "cpu", "cpu"]
