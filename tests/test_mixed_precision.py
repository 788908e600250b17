"""``--amp --amp-dtype {float16,bfloat16}`` through the real CLIs on a CPU (umst_plugin/mixed_precision.py):
training (fairseq-train, fairseq-hydra-train), validation and decoding (fairseq-generate,
fairseq-interactive) under torch.autocast, compared with fp32 runs of the same seed."""
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import e2e
from umst_dev import dev
from umst_plugin import mixed_precision

BF16 = ("--amp", "--amp-dtype", "bfloat16")
TINIER = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
          "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
          "--decoder-attention-heads", "2"]


def last_update_loss(checkpoint):
    """The training loss of the last update, unrounded (fairseq's logs round to 3 decimals): the metrics
    state fairseq stores in every checkpoint."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    for _priority, name, _kind, meter in state["extra_state"]["metrics"]["default"]:
        if name == "loss":
            return float(meter["val"])
    raise AssertionError(f"no training loss in {checkpoint}")


def train_cpu(databin, save_dir, arch, *extra, max_update=30):
    log = e2e.train(databin, save_dir, arch, "--cpu", *e2e.TINY, *extra, max_update=max_update)
    return log, last_update_loss(os.path.join(save_dir, "checkpoint_last.pt"))


# ---- units (fast) -----------------------------------------------------------------------------

def test_autocast_covers_the_models_device_unless_disabled_and_says_once_what_runs_under_it(caplog):
    """``mixed_precision.autocast``: torch.autocast on the model's device in the named dtype (on by default); a
    no-op when disabled or where autocast is not the plugin's to set (a device outside AUTOCAST_DEVICE_TYPES:
    fairseq's own path); ``what`` logged once per (what, device, dtype), nothing logged without it."""
    model = torch.nn.Linear(2, 2)
    with mixed_precision.autocast(model, "bfloat16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with mixed_precision.autocast(model, "bfloat16", enabled=False):
        assert not torch.is_autocast_enabled("cpu")
    elsewhere = torch.nn.Linear(2, 2, device="meta")
    assert mixed_precision.model_device_type(elsewhere) not in mixed_precision.AUTOCAST_DEVICE_TYPES
    with mixed_precision.autocast(elsewhere, "bfloat16"):
        assert not torch.is_autocast_enabled("cpu")
    caplog.set_level("INFO", logger="umst_plugin.mixed_precision")
    for _ in range(2):
        with mixed_precision.autocast(model, "bfloat16", what="a unit test's step"):
            pass
        with mixed_precision.autocast(model, "bfloat16"):
            pass
    said = [r.getMessage() for r in caplog.records if r.name == "umst_plugin.mixed_precision"]
    assert said == ["mixed precision: a unit test's step under bfloat16 autocast on cpu"], said


def test_the_weight_cache_is_built_once_per_model_and_not_under_layerdrop_or_where_switched_off(caplog):
    """``weight_cache``: autocast's parameter casts in one kernel (amp_weights.WeightCache), kept on the model; on
    by default for an optimizer that does not say (one built without the plugin's options); none with
    ``--no-amp-weight-cache`` (the optimizer's ``amp_weight_cache`` False) or under LayerDrop (weights unused in
    some updates), which says so."""
    from fairseq.modules.layer_drop import LayerDropModuleList

    from umst_plugin import amp_weights

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    cache = mixed_precision.weight_cache(model, SimpleNamespace(), "bfloat16")
    assert isinstance(cache, amp_weights.WeightCache)
    assert mixed_precision.weight_cache(model, SimpleNamespace(amp_weight_cache=True), "bfloat16") is cache
    assert mixed_precision.weight_cache(torch.nn.Linear(2, 2), SimpleNamespace(amp_weight_cache=False),
                                        "bfloat16") is None
    caplog.set_level("INFO", logger="umst_plugin.mixed_precision")
    dropping = torch.nn.Sequential(LayerDropModuleList(p=0.2, modules=[torch.nn.Linear(2, 2)]))
    assert mixed_precision.weight_cache(dropping, SimpleNamespace(), "bfloat16") is None
    assert mixed_precision.weight_cache(dropping, SimpleNamespace(), "bfloat16") is None  # decided once
    said = [r.getMessage() for r in caplog.records if r.name == "umst_plugin.mixed_precision"]
    assert said == ["autocast casts: LayerDrop leaves parameters unused in some updates; one cast each"], said


def test_a_training_steps_dtype_is_the_optimizers_else_the_tasks_else_float16():
    bf16_task = SimpleNamespace(cfg=SimpleNamespace(amp_dtype="bfloat16"))
    plain_task = SimpleNamespace(cfg=SimpleNamespace(amp_dtype=None))
    scaler_of = SimpleNamespace  # an AMPOptimizer carries the dtype its grad scaler was built for
    assert mixed_precision.training_amp_dtype(scaler_of(amp_dtype="bfloat16"), plain_task) == "bfloat16"
    assert mixed_precision.training_amp_dtype(scaler_of(amp_dtype="float16"), bf16_task) == "float16"
    assert mixed_precision.training_amp_dtype(scaler_of(), bf16_task) == "bfloat16"
    assert mixed_precision.training_amp_dtype(scaler_of(), plain_task) == "float16"
    assert mixed_precision.training_amp_dtype(scaler_of()) == "float16"


def test_the_command_line_sets_inference_amp_and_warns_of_an_amp_dtype_without_amp(caplog):
    before = (mixed_precision._process_amp, mixed_precision._process_amp_dtype)
    caplog.set_level("WARNING", logger="umst_plugin.mixed_precision")
    try:
        def seen(**common):
            caplog.clear()
            mixed_precision.record_command_line(SimpleNamespace(common=SimpleNamespace(**common), task=None))
            return ((mixed_precision._process_amp, mixed_precision._process_amp_dtype),
                    [r.getMessage() for r in caplog.records if r.name == "umst_plugin.mixed_precision"])

        assert seen(amp=True, amp_dtype="bfloat16") == ((True, "bfloat16"), [])
        assert seen(amp=False, amp_dtype="bfloat16") == (
            (False, "bfloat16"), ["--amp-dtype bfloat16 has no effect without --amp"])
        assert seen(amp=False, amp_dtype=None) == ((False, None), [])
        assert seen(amp_dtype=None) == ((False, None), [])  # a config without the flag: no --amp
    finally:  # what this process's command line said before, for the tests after this one
        mixed_precision._process_amp, mixed_precision._process_amp_dtype = before

def amp_optimizer(weight, dtype_name, lr=1.0):
    """fairseq's AMPOptimizer (patched by umst_plugin/patches/amp_optimizer.py) over one weight, on the CPU."""
    from fairseq import optim
    from fairseq.optim.amp_optimizer import AMPOptimizer
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"optimizer": {"_name": "sgd", "lr": [lr], "momentum": 0.0, "weight_decay": 0.0},
                            "common": {"fp16_init_scale": 128, "min_loss_scale": 1e-4, "cpu": True},
                            "task": {"amp_dtype": dtype_name}})
    return AMPOptimizer(cfg, [weight], optim.build_optimizer(cfg.optimizer, [weight]))


def test_amp_optimizer_unscales_gradients_once():
    """fairseq's AMPOptimizer unscaled twice (clip_grad_norm through the torch optimizer, step through its
    wrapper: the grad scaler's state is per object), dividing every update by the loss scale."""
    weight = torch.nn.Parameter(torch.ones(3))
    amp = amp_optimizer(weight, "float16")
    assert amp.scaler.is_enabled() and amp.scaler.get_scale() == 128.0  # a CPU grad scaler, not a disabled one
    amp.backward((2 * weight).sum())  # gradient 2, scaled by 128
    amp.clip_grad_norm(0.0)
    amp.step()
    torch.testing.assert_close(weight.detach(), torch.full((3,), -1.0))  # 1 - lr x 2, not 1 - 2 / 128


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_a_non_finite_gradient_skips_the_step_and_never_reaches_the_weights(dtype_name):
    """An inf gradient under --amp, bf16 or fp16: fairseq's clip_grad_norm reports it (no AttributeError on
    the scaler), the step leaves the weight as it was, the scale backs off; a finite step then updates."""
    weight = torch.nn.Parameter(torch.ones(3))
    amp = amp_optimizer(weight, dtype_name)
    start_scale = amp.scaler.get_scale()
    assert start_scale == (1.0 if dtype_name == "bfloat16" else 128.0)
    amp.backward((weight * torch.tensor([1.0, float("inf"), 1.0])).sum())
    grad_norm = amp.clip_grad_norm(0.0)
    assert not torch.isfinite(grad_norm)
    amp.step()
    assert torch.equal(weight.detach(), torch.ones(3)), "the non-finite step was applied"
    assert amp.scaler.get_scale() == start_scale / 2
    amp.zero_grad()
    amp.backward((2 * weight).sum())
    assert torch.isfinite(amp.clip_grad_norm(0.0))
    amp.step()
    torch.testing.assert_close(weight.detach(), torch.full((3,), -1.0))


def test_bf16_loss_scale_never_grows_above_one():
    weight = torch.nn.Parameter(torch.ones(3))
    amp = amp_optimizer(weight, "bfloat16", lr=0.0)
    amp.scaler._growth_interval = 1  # grow after every good step, if it could
    for _ in range(3):
        amp.zero_grad()
        amp.backward(weight.sum())
        amp.clip_grad_norm(0.0)
        amp.step()
    assert amp.scaler.get_scale() == 1.0


def test_bf16_stops_with_floating_point_error_at_the_minimum_scale():
    """Overflows close together back the bf16 scale off to --min-loss-scale: then fairseq raises
    FloatingPointError (its crash checkpoint and NaN detector follow), as for fp16."""
    weight = torch.nn.Parameter(torch.ones(3))
    amp = amp_optimizer(weight, "bfloat16")
    with pytest.raises(FloatingPointError, match="Minimum loss scale reached"):
        for _ in range(20):
            amp.zero_grad()
            amp.backward((weight * float("inf")).sum())
            amp.clip_grad_norm(0.0)
            amp.step()
    assert torch.equal(weight.detach(), torch.ones(3))


def test_a_task_config_without_amp_options_means_fp32():
    """A task config that cannot resolve ${common.amp} (built alone) or predates --amp-dtype (an older
    checkpoint's) runs in fp32 instead of failing."""
    from omegaconf import OmegaConf, open_dict
    from umst_plugin.tasks.multiscale_translation import MultiscaleTranslationConfig, MultiscaleTranslationTask

    cfg = OmegaConf.structured(MultiscaleTranslationConfig)
    with open_dict(cfg):
        del cfg["amp_dtype"]
    d = dev.make_dictionary()
    task = MultiscaleTranslationTask(cfg, d, d)
    assert task._amp() is False and task._amp_dtype() == "float16"


def test_task_amp_dtype_resolves_in_a_config_composed_before_the_plugin():
    """fairseq-hydra-train composes its config before the plugin adds common.amp_dtype: the task's amp_dtype
    (which follows the common one) then resolves to None instead of failing (InterpolationKeyError in
    build_model, as CI once saw); where the common key exists, it follows it."""
    from omegaconf import OmegaConf
    from umst_plugin.tasks.multiscale_translation import MultiscaleTranslationConfig

    for common, expected in (({"amp": False}, None), ({"amp": True, "amp_dtype": "bfloat16"}, "bfloat16")):
        root = OmegaConf.create({"common": common})
        root.task = OmegaConf.structured(MultiscaleTranslationConfig)
        assert root.task.amp_dtype == expected


def test_inference_precision_follows_this_process_not_the_checkpoint():
    """A task config saying amp (a checkpoint trained with --amp) autocasts validation and decoding only when
    this process asks: from_pretrained's amp argument, or the command line (call_main)."""
    from omegaconf import OmegaConf, open_dict
    from umst_plugin.tasks.multiscale_translation import MultiscaleTranslationConfig, MultiscaleTranslationTask

    cfg = OmegaConf.structured(MultiscaleTranslationConfig)
    with open_dict(cfg):
        cfg.amp = True
    d = dev.make_dictionary()
    task = MultiscaleTranslationTask(cfg, d, d)
    saved = mixed_precision._process_amp
    try:
        mixed_precision._process_amp = None
        assert task._amp() is True  # fairseq-generate: its own command line resolved the task's amp
        mixed_precision.set_process_amp(False)
        assert task._amp() is False  # fairseq-validate / -interactive without --amp
        task.inference_amp = True
        assert task._amp() is True  # from_pretrained(..., amp=True)
    finally:
        mixed_precision._process_amp = saved


# ---- the CLIs ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def umst_runs(toy_databin, tmp_path_factory):
    """UMST at tiny width, 30 updates: fp32 and bf16 autocast (dir, log, loss of update 30)."""
    runs = {}
    for name, extra in (("fp32", ()), ("bf16", BF16)):
        save = str(tmp_path_factory.mktemp(f"umst-{name}"))
        log, loss = train_cpu(toy_databin, save, "umst_base", *extra)
        runs[name] = (save, log, loss)
    return runs


def assert_autocast_applied(fp32_loss, amp_loss, what, rtol=0.03):
    """Autocast really ran (the loss differs from fp32's) and did not hurt (by under ``rtol``)."""
    rel = abs(amp_loss - fp32_loss) / fp32_loss
    assert amp_loss != fp32_loss, f"{what}: same loss as fp32 ({fp32_loss}): autocast did not apply"
    assert rel < rtol, f"{what}: loss {amp_loss:.5f} vs fp32 {fp32_loss:.5f} ({100 * rel:.2f}%)"


@pytest.mark.slow
def test_umst_bf16_autocast_30_updates_within_3_percent_of_fp32(umst_runs):
    (_, _, fp32), (_, log, bf16) = umst_runs["fp32"], umst_runs["bf16"]
    assert "bfloat16 autocast on cpu, loss scale fixed at 1" in log
    assert_autocast_applied(fp32, bf16, "umst_base bf16 autocast after 30 updates")


@pytest.mark.slow
def test_prime_bf16_autocast_30_updates_within_3_percent_of_fp32(toy_databin, tmp_path):
    _, fp32 = train_cpu(toy_databin, str(tmp_path / "fp32"), "prime_base")
    log, bf16 = train_cpu(toy_databin, str(tmp_path / "bf16"), "prime_base", *BF16)
    assert "bfloat16 autocast on cpu, loss scale fixed at 1" in log
    assert_autocast_applied(fp32, bf16, "prime_base bf16 autocast after 30 updates")


@pytest.mark.slow
def test_fp16_autocast_on_cpu_scales_the_loss_like_cuda(toy_databin, tmp_path, umst_runs):
    """Plain --amp (float16, fairseq's default dtype) on a CPU: fp16 autocast with a grad scaler (fairseq's
    CUDA-only one turned itself off here and trained in fp32 at loss scale 1)."""
    log, fp16 = train_cpu(toy_databin, str(tmp_path / "fp16"), "umst_base", "--amp")
    assert "float16 autocast on cpu, grad scaler from 128" in log
    assert re.search(r"loss_scale=128\b", log), log[-2000:]  # --fp16-init-scale's default, not 1
    assert_autocast_applied(umst_runs["fp32"][2], fp16, "umst_base fp16 autocast after 30 updates")


def valid_loss(log):
    losses = re.findall(r"\| valid on 'valid' subset \| loss ([0-9.]+) \|", log)
    assert losses, log[-3000:]
    return float(losses[-1])


@pytest.mark.slow
def test_bf16_autocast_200_updates_validation_loss_within_2_percent_of_fp32(toy_databin, tmp_path):
    """Training and validation under bf16 autocast reach fp32's validation loss (200 updates, tiny UMST)."""
    common = ("--cpu", *TINIER, "--validate-interval", "1000", "--no-save")  # validate once, at the end
    fp32_log = e2e.train(toy_databin, str(tmp_path / "fp32"), "umst_base", *common, max_update=200, validate=True)
    bf16_log = e2e.train(toy_databin, str(tmp_path / "bf16"), "umst_base", *common, *BF16, max_update=200,
                         validate=True)
    assert "validation under bfloat16 autocast on cpu" in bf16_log, bf16_log[-3000:]
    assert "validation under" not in fp32_log
    fp32, bf16 = valid_loss(fp32_log), valid_loss(bf16_log)
    assert abs(bf16 - fp32) / fp32 < 0.02, f"valid loss after 200 updates: bf16 {bf16} vs fp32 {fp32}"


def scores(output):
    return [float(s) for s in re.findall(r"^H-\d+\t([-0-9.e]+)\t", output, flags=re.M)]


@pytest.mark.slow
def test_generate_and_interactive_decode_under_bf16_autocast(toy_raw, toy_databin, umst_runs):
    ckpt = os.path.join(umst_runs["bf16"][0], "checkpoint_last.pt")
    fp32 = e2e.generate(toy_databin, ckpt, "--cpu")
    bf16 = e2e.generate(toy_databin, ckpt, "--cpu", *BF16)
    assert "decoding under bfloat16 autocast on cpu" in bf16
    e2e.assert_translated_all(bf16, toy_raw)
    assert len(scores(bf16)) == len(scores(fp32))
    assert scores(bf16) != scores(fp32), "fairseq-generate --amp --amp-dtype bfloat16 decoded in fp32"
    with open(os.path.join(toy_raw, f"test.{e2e.SRC}"), encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(3)]
    out = e2e.interactive(toy_databin, ckpt, lines, "--cpu", *BF16)
    assert "decoding under bfloat16 autocast on cpu" in out
    assert len(e2e.hypotheses(out)) == 3, out[-3000:]


@pytest.mark.slow
def test_train_sh_amp_bf16_trains_a_row_under_bf16_autocast(toy_databin, tmp_path):
    """scripts/train.sh --amp-bf16: a table row's YAML through fairseq-hydra-train (python -m fairseq_cli.hydra_train)
    with common.amp=true +task.amp_dtype=bfloat16, here on the CPU."""
    tiny = ["model.encoder_layers=1", "model.decoder_layers=1", "model.encoder_embed_dim=32",
            "model.decoder_embed_dim=32", "model.encoder_ffn_embed_dim=64", "model.decoder_ffn_embed_dim=64",
            "model.encoder_attention_heads=2", "model.decoder_attention_heads=2"]
    env = {**e2e.cli_env(), "PYTHON": os.path.join(e2e.BIN, "python")}
    proc = subprocess.run(["bash", os.path.join(e2e.ROOT, "scripts", "train.sh"), "m30k-umst", "--data", toy_databin,
                           "--save-dir", str(tmp_path), "--gpus", "0", "--amp-bf16", "--", "task.source_lang=kel",
                           "task.target_lang=mor", "optimization.max_update=3", "dataset.max_tokens=1000",
                           "dataset.num_workers=0", "dataset.disable_validation=true", "checkpoint.no_save=true",
                           "common.log_interval=1", *tiny], env=env, cwd=e2e.ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "bfloat16 autocast on cpu, loss scale fixed at 1" in log, log[-3000:]
    assert re.search(r"num_updates=3\b|num_updates 3\b", log), log[-3000:]


@pytest.mark.slow
def test_plain_bf16_trains_on_a_cpu_instead_of_asking_for_a_tpu(toy_databin, tmp_path):
    """fairseq's --bf16 implies --tpu (options.py); without torch_xla the plugin makes it pure bf16 on the CPU."""
    log = e2e.train(toy_databin, str(tmp_path), "umst_base", "--cpu", "--bf16", *TINIER, "--no-save", max_update=3)
    assert "--bf16 without torch_xla: bf16 weights on CPU" in log, log[-3000:]
    assert re.search(r"num_updates 3\b", log), log[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("dtype_args", [BF16, ("--amp",)], ids=["bf16", "fp16"])
def test_an_overflowing_batch_is_retried_skipped_and_training_goes_on(toy_databin, tmp_path, dtype_args):
    """fairseq-train --amp meets a batch whose gradients are not finite (the test criterion multiplies the loss
    of training calls 5-7 by inf: the batch and its two retries): it logs the overflow, skips the batch and
    reaches --max-update with finite weights; bf16 included (it used to die with an AttributeError)."""
    log = e2e.train(toy_databin, str(tmp_path), "umst_base", "--cpu", *TINIER, *dtype_args,
                    "--poison-calls", "5,6,7", "--log-interval", "1", max_update=8,
                    user_dir=os.path.join(e2e.ROOT, "tests", "overflow_plugin"),
                    criterion="label_smoothed_cross_entropy_poisoned")
    assert "AMP: overflow detected" in log, log[-3000:]
    assert "AMP: skipping this batch" in log, log[-3000:]
    assert "AttributeError" not in log and "Traceback" not in log, log[-3000:]
    assert re.search(r"num_updates 8\b", log), log[-3000:]
    state = torch.load(os.path.join(tmp_path, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


@pytest.mark.slow
def test_plain_translation_task_gets_the_same_amp_fixes(toy_databin, tmp_path):
    """The AMP fixes are installed on fairseq's classes, not the plugin's task: Prime-simple under fairseq's
    plain --task translation trains under fp16 autocast on the CPU with a grad scaler at 128 (fairseq alone
    trained in fp32 at scale 1)."""
    _, fp32 = train_cpu(toy_databin, str(tmp_path / "fp32"), "prime_simple_base", "--task", "translation")
    log, fp16 = train_cpu(toy_databin, str(tmp_path / "fp16"), "prime_simple_base", "--task", "translation", "--amp")
    assert "float16 autocast on cpu, grad scaler from 128" in log, log[-3000:]
    assert re.search(r"loss_scale=128\b", log), log[-2000:]
    assert_autocast_applied(fp32, fp16, "prime_simple_base under --task translation, fp16 autocast")


@pytest.mark.slow
def test_a_checkpoint_trained_with_amp_decodes_in_fp32_unless_asked(toy_raw, toy_databin, umst_runs):
    """The bf16 --amp checkpoint: fairseq-validate and from_pretrained decode in fp32 (the checkpoint's task
    config says amp; the command line / call does not); asked with --amp / amp=True, under autocast."""
    ckpt = os.path.join(umst_runs["bf16"][0], "checkpoint_last.pt")
    plain = e2e.fairseq("validate", toy_databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation",
                        "--path", ckpt, "--cpu", "--valid-subset", "valid", "--max-tokens", "1000")
    assert "under bfloat16 autocast" not in plain.stdout + plain.stderr
    asked = e2e.fairseq("validate", toy_databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation",
                        "--path", ckpt, "--cpu", "--valid-subset", "valid", "--max-tokens", "1000", "--amp")
    assert "validation under bfloat16 autocast on cpu" in asked.stdout + asked.stderr
    code = ("import logging, sys\nlogging.basicConfig(level=logging.INFO)\n"
            "from umst_plugin.models.umst import UMSTModel\n"
            "m = UMSTModel.from_pretrained(sys.argv[1], checkpoint_file=sys.argv[2], data_name_or_path=sys.argv[3],"
            " amp=sys.argv[4] == 'amp', cpu=True)\n"
            "print('HYP', m.translate('a', beam=2))\n")
    for mode in ("fp32", "amp"):
        proc = e2e.run([sys.executable, "-c", code, os.path.dirname(ckpt), os.path.basename(ckpt), toy_databin,
                        mode])
        out = proc.stdout + proc.stderr
        assert "HYP" in out
        assert ("decoding under bfloat16 autocast" in out) == (mode == "amp"), out[-3000:]
