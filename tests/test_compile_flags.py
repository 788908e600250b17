"""``--compile`` and ``--tf32`` where fairseq meets them (``umst_plugin/compilation/flags.py``): the Trainer's set-up
(``--tf32`` asked of the Trainer's device, the runs ``--compile`` refuses naming the flag to drop, inductor's caches
in ``SAVE_DIR/compile_cache`` unless ``--no-save``), the compile log after an update (a line only where something
compiled), the device a CLI main compiles for, and ``_CommandLine``, which a CLI main runs inside (its error goes
through, its summary only after a main that returned). What the flags compute: tests/test_compile.py and
tests/test_compile_stream.py. Found by a flip sweep of flags.py (docs/tests-and-benchmarks.md)."""
import logging
import os
import types

import pytest
import torch
from omegaconf import OmegaConf, open_dict

import umst_plugin  # noqa: F401  (installs the patches)
from umst_dev import dev
from umst_plugin import compilation
from umst_plugin.compilation import cache, flags, telemetry

TINY = dict(encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=2, encoder_layers=1,
            decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=2, decoder_layers=1)


def _options(**options):
    return dict(TINY, cpu=True, optimizer="adam", lr="1e-3", max_tokens=100, **options)


def _cfg(**options):
    return dev.config_of(dev.parse_args("transformer", _options(**options)))


def _trainer(**options):
    """fairseq's Trainer on the tiny transformer, built as fairseq-train builds it (flags' set-up runs in its
    ``__init__``)."""
    return dev.build_trainer("transformer", _options(**options))


def test_the_trainer_asks_for_tf32_on_its_device_only_with_tf32(caplog):
    """On this CPU, ``--tf32`` reaches ``set_tf32(True, cpu)``, which warns that the run computes on the CPU; without
    the flag nothing is said (and nothing set)."""
    with caplog.at_level(logging.WARNING, logger="umst_plugin.compilation"):
        _trainer(no_save=True)
        assert "--tf32" not in caplog.text
        _trainer(no_save=True, tf32=True)
    assert "--tf32: TF32 needs an NVIDIA GPU" in caplog.text and "this run computes on the cpu" in caplog.text


@pytest.mark.parametrize("field,value,named", [
    ("common.tpu", True, "--tpu"),
    ("distributed_training.pipeline_model_parallel", True, "--pipeline-model-parallel"),
    ("distributed_training.ddp_backend", "fully_sharded", "--ddp-backend fully_sharded"),
])
def test_compile_refuses_tpu_pipelines_and_fully_sharded_naming_the_flag(field, value, named):
    """Set-up stops before anything compiles, naming the flag that --compile does not run with (the flag set on the
    run's config: the Trainer itself would need a TPU, fairscale or a pipeline to get that far)."""
    for compile_ in (True, False):
        cfg = _cfg(no_save=True, compile=compile_)
        with open_dict(cfg):
            OmegaConf.update(cfg, field, value)
        trainer = types.SimpleNamespace(cfg=cfg, device=torch.device("cpu"))
        if not compile_:
            flags._setup_training(trainer)  # without --compile, none of them is refused
            continue
        with pytest.raises(compilation.CompileUnavailable) as raised:
            flags._setup_training(trainer)
        assert str(raised.value) == f"--compile is not supported with {named}; drop one of them"


def test_the_trainer_keeps_compiled_code_in_its_save_dir_unless_no_save(tmp_path, monkeypatch):
    """A run that saves checkpoints keeps inductor's caches in SAVE_DIR/compile_cache (this process's
    TORCHINDUCTOR_CACHE_DIR points there); --no-save leaves the directory as it was, and the save dir empty."""
    monkeypatch.setattr(cache, "USER_CACHE_DIR", None)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.delenv("UMST_PLUGIN_INDUCTOR_CACHE_DIR", raising=False)
    try:
        _trainer(compile=True, no_save=True, save_dir=str(tmp_path / "unsaved"))
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "before")
        assert not (tmp_path / "unsaved").exists()
        _trainer(compile=True, save_dir=str(tmp_path / "saved"))
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "saved" / cache.CACHE_DIRNAME)
        assert (tmp_path / "saved" / cache.CACHE_DIRNAME).is_dir()
    finally:
        from torch._inductor.utils import clear_caches

        clear_caches()  # (paths of the test's directories kept in memory)


def test_the_compile_log_says_a_line_only_after_an_update_that_compiled(caplog):
    """After each update under --compile: a line where the compile seconds grew by more than 0.05 s or the cache
    counted a hit or a miss since the last line, none otherwise; each line restarts the count."""
    now = [compilation.compile_seconds(), *telemetry.cache_counts()]
    trainer = types.SimpleNamespace(get_num_updates=lambda: 7)

    def logged(last):
        trainer._umst_compile_log = list(last)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=flags.__name__):
            flags._log_compiling(trainer)
        return [r.getMessage() for r in caplog.records]

    seconds, hits, misses = now
    assert logged([seconds, hits, misses]) == [] and trainer._umst_compile_log == now
    assert logged([seconds - 0.04, hits, misses]) == []  # within the clock's noise
    (line,) = logged([seconds - 0.06, hits, misses])
    assert line.startswith("--compile: update 7: compile: 0.1 s (cache cold: 0 hit(s), 0 miss(es))")
    assert trainer._umst_compile_log == now
    (line,) = logged([seconds, hits - 1, misses])
    assert "cache warm: 1 hit(s), 0 miss(es)" in line and trainer._umst_compile_log == now
    (line,) = logged([seconds, hits, misses - 2])
    assert "cache cold: 0 hit(s), 2 miss(es)" in line and trainer._umst_compile_log == now


def test_a_trainer_without_compile_updates_as_fairseqs_does(caplog):
    """Without --compile, the replaced train_step and valid_step are fairseq's own: an update and a validation step
    run, nothing is logged of compiling (fairseq-train --compile's updates and their log: test_compile_stream.py)."""
    trainer = _trainer(no_save=True)
    with caplog.at_level(logging.INFO):
        trainer.train_step([dev.random_sample(trainer.task, 2, 5, 7, seed=1)])
        trainer.valid_step(dev.random_sample(trainer.task, 2, 5, 7, seed=2))
    assert trainer.get_num_updates() == 1 and "_umst_compile_log" not in trainer.__dict__
    assert "--compile" not in caplog.text


def test_a_cli_main_compiles_for_cuda_only_where_there_is_one_and_no_cpu(monkeypatch):
    assert not torch.cuda.is_available()  # (this machine; the GPU check has its own)
    assert flags._device(OmegaConf.create({"common": {"cpu": False}})) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert flags._device(OmegaConf.create({"common": {"cpu": False}})) == "cuda"
    assert flags._device(OmegaConf.create({"common": {"cpu": True}})) == "cpu"


def test_a_cli_main_s_error_goes_through_and_its_summary_follows_a_main_that_returned(caplog):
    """``_CommandLine`` around a CLI main with --compile: an exception of the main reaches the caller (and no
    summary is logged), a main that returned gets its summary line; the request is gone either way."""
    cfg = OmegaConf.create({"common": {"compile": True, "tf32": False, "cpu": True}})
    with caplog.at_level(logging.INFO, logger="umst_plugin.compilation"):
        with pytest.raises(RuntimeError, match="the main failed"):
            with flags._CommandLine(cfg):
                assert flags._compile_request() == (True, False, "cpu")
                raise RuntimeError("the main failed")
        assert flags._compile_request() is None
        assert "this run compiled" not in caplog.text
        with flags._CommandLine(cfg):
            pass
    assert "--compile: this run compiled 0 graph(s) in" in caplog.text and flags._compile_request() is None


def test_the_replacements_keep_fairseqs_defaults():
    """Trainer.train_step / valid_step and FairseqTask.build_model / build_criterion, as --compile replaces them:
    what fairseq's callers leave out means what fairseq's own default means (raise_oom, from_checkpoint False)."""
    import inspect

    from fairseq.tasks.fairseq_task import FairseqTask
    from fairseq.trainer import Trainer

    for owner, name, argument in ((Trainer, "train_step", "raise_oom"), (Trainer, "valid_step", "raise_oom"),
                                  (FairseqTask, "build_model", "from_checkpoint"),
                                  (FairseqTask, "build_criterion", "from_checkpoint")):
        function, checked = getattr(owner, name), []
        while function is not None:  # every layer that names it (fairseq's own decorator takes ``*args``)
            own = inspect.signature(function, follow_wrapped=False).parameters
            if argument in own:
                assert own[argument].default is False, (function.__module__, name)
                checked.append(function.__module__)
            function = getattr(function, "__wrapped__", None)
        assert checked[0] == flags.__name__ and checked[-1].startswith("fairseq."), checked
