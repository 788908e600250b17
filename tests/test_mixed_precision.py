"""``--amp --amp-dtype {float16,bfloat16}`` through the real CLIs on a CPU (umst_plugin/mixed_precision.py):
training (fairseq-train, fairseq-hydra-train), validation and decoding (fairseq-generate,
fairseq-interactive) under torch.autocast, compared with fp32 runs of the same seed."""
import os
import re
import subprocess

import pytest
import torch

import e2e
from umst_plugin import dev, mixed_precision

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

def test_amp_optimizer_unscales_gradients_once():
    """fairseq's AMPOptimizer unscaled twice (clip_grad_norm through the torch optimizer, step through its
    wrapper: the grad scaler's state is per object), dividing every update by the loss scale."""
    from fairseq import optim
    from fairseq.optim.amp_optimizer import AMPOptimizer
    from omegaconf import OmegaConf

    weight = torch.nn.Parameter(torch.ones(3))
    cfg = OmegaConf.create({"optimizer": {"_name": "sgd", "lr": [1.0], "momentum": 0.0, "weight_decay": 0.0},
                            "common": {"fp16_init_scale": 128, "min_loss_scale": 1e-4}})
    amp = AMPOptimizer(cfg, [weight], optim.build_optimizer(cfg.optimizer, [weight]))
    mixed_precision.configure_grad_scaler(amp, "cpu", "float16", init_scale=128)
    amp.backward((2 * weight).sum())  # gradient 2, scaled by 128
    amp.clip_grad_norm(0.0)
    amp.step()
    torch.testing.assert_close(weight.detach(), torch.full((3,), -1.0))  # 1 - lr x 2, not 1 - 2 / 128


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
    assert "bfloat16 autocast on cpu, no loss scaling" in log
    assert_autocast_applied(fp32, bf16, "umst_base bf16 autocast after 30 updates")


@pytest.mark.slow
def test_prime_bf16_autocast_30_updates_within_3_percent_of_fp32(toy_databin, tmp_path):
    _, fp32 = train_cpu(toy_databin, str(tmp_path / "fp32"), "prime_base")
    log, bf16 = train_cpu(toy_databin, str(tmp_path / "bf16"), "prime_base", *BF16)
    assert "bfloat16 autocast on cpu, no loss scaling" in log
    assert_autocast_applied(fp32, bf16, "prime_base bf16 autocast after 30 updates")


@pytest.mark.slow
def test_fp16_autocast_on_cpu_scales_the_loss_like_cuda(toy_databin, tmp_path, umst_runs):
    """Plain --amp (float16, fairseq's default dtype) on a CPU: fp16 autocast with a grad scaler (fairseq's
    CUDA-only one turned itself off here and trained in fp32 at loss scale 1)."""
    log, fp16 = train_cpu(toy_databin, str(tmp_path / "fp16"), "umst_base", "--amp")
    assert "float16 autocast on cpu, grad scaler on" in log
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
    fp32 = valid_loss(e2e.train(toy_databin, str(tmp_path / "fp32"), "umst_base", *common, max_update=200,
                                validate=True))
    bf16 = valid_loss(e2e.train(toy_databin, str(tmp_path / "bf16"), "umst_base", *common, *BF16,
                                max_update=200, validate=True))
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
def test_train_sh_bf16_trains_a_row_under_bf16_autocast(toy_databin, tmp_path):
    """scripts/train.sh --bf16: a table row's YAML through fairseq-hydra-train (python -m fairseq_cli.hydra_train)
    with common.amp=true +task.amp_dtype=bfloat16, here on the CPU."""
    tiny = ["model.encoder_layers=1", "model.decoder_layers=1", "model.encoder_embed_dim=32",
            "model.decoder_embed_dim=32", "model.encoder_ffn_embed_dim=64", "model.decoder_ffn_embed_dim=64",
            "model.encoder_attention_heads=2", "model.decoder_attention_heads=2"]
    env = {**e2e.cli_env(), "PYTHON": os.path.join(e2e.BIN, "python")}
    proc = subprocess.run(["bash", os.path.join(e2e.ROOT, "scripts", "train.sh"), "m30k-umst", "--data", toy_databin,
                           "--save-dir", str(tmp_path), "--gpus", "0", "--bf16", "--", "task.source_lang=kel",
                           "task.target_lang=mor", "optimization.max_update=3", "dataset.max_tokens=1000",
                           "dataset.num_workers=0", "dataset.disable_validation=true", "checkpoint.no_save=true",
                           "common.log_interval=1", *tiny], env=env, cwd=e2e.ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "bfloat16 autocast on cpu, no loss scaling" in log, log[-3000:]
    assert re.search(r"num_updates=3\b|num_updates 3\b", log), log[-3000:]


@pytest.mark.slow
def test_plain_bf16_trains_on_a_cpu_instead_of_asking_for_a_tpu(toy_databin, tmp_path):
    """fairseq's --bf16 implies --tpu (options.py); without torch_xla the plugin makes it pure bf16 on the CPU."""
    log = e2e.train(toy_databin, str(tmp_path), "umst_base", "--cpu", "--bf16", *TINIER, "--no-save", max_update=3)
    assert "--bf16 without torch_xla: bf16 weights on CPU" in log, log[-3000:]
    assert re.search(r"num_updates 3\b", log), log[-3000:]
