"""scripts/train.sh over several machines, as two "machines" of one CPU process each on 127.0.0.1 (gloo,
fairseq's own tcp:// rendezvous): the same updates as one machine with the same effective batch."""
import os
import re
import socket
import subprocess

import pytest
import torch

import e2e

pytestmark = pytest.mark.slow

ROW = "m30k-umst"
TRAIN_SH = os.path.join(e2e.ROOT, "scripts", "train.sh")
# tiny width, no dropout (the two runs must compute the same function), 20 updates of 2 x 300 tokens
OVERRIDES = ["task.source_lang=kel", "task.target_lang=mor", "model.encoder_layers=1", "model.decoder_layers=1",
             "model.encoder_embed_dim=16", "model.decoder_embed_dim=16", "model.encoder_ffn_embed_dim=32",
             "model.decoder_ffn_embed_dim=32", "model.encoder_attention_heads=2", "model.decoder_attention_heads=2",
             "model.dropout=0.0", "lr_scheduler.warmup_updates=5", "optimization.max_update=20",
             "optimization.update_freq=[2]", "dataset.max_tokens=300", "dataset.num_workers=0",
             "dataset.disable_validation=true", "checkpoint.no_epoch_checkpoints=true", "common.log_interval=1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_sh(databin, save_dir, *args):
    env = {**e2e.cli_env(), "PYTHON": os.path.join(e2e.BIN, "python")}
    return subprocess.Popen(["bash", TRAIN_SH, ROW, "--data", databin, "--save-dir", save_dir, "--gpus", "0", *args,
                             "--", *OVERRIDES], env=env, cwd=e2e.ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=300):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-5000:]
    return out


def per_update_losses(log):
    return [float(x) for x in re.findall(r"train_inner\W.*? loss=([0-9.]+),", log)]


def state(save_dir):
    """(loss of the last update, unrounded, from the metrics fairseq stores in the checkpoint; model weights)."""
    ckpt = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    loss = next(float(m["val"]) for _, name, _, m in ckpt["extra_state"]["metrics"]["default"] if name == "loss")
    return loss, ckpt["model"], ckpt["optimizer_history"][-1]["num_updates"]


def test_two_machines_train_like_one_with_the_same_effective_batch(toy_databin, tmp_path):
    one = finish(train_sh(toy_databin, str(tmp_path / "one")))
    assert "1 process(es) x update_freq 2" in one, one[-3000:]
    port = str(free_port())
    machines = [train_sh(toy_databin, str(tmp_path / "two"), "--nnodes", "2", "--node-rank", str(rank),
                         "--master-addr", "127.0.0.1", "--master-port", port) for rank in (0, 1)]
    logs = [finish(p) for p in machines]
    assert "2 process(es) x update_freq 1" in logs[0] and "machine 1 of 2" in logs[1], logs[0][-3000:]
    assert "distributed init (rank 1): tcp://127.0.0.1:" + port in logs[1], logs[1][-3000:]

    loss_one, model_one, updates_one = state(str(tmp_path / "one"))
    loss_two, model_two, updates_two = state(str(tmp_path / "two"))
    print(f"\nloss of update 20: one process {loss_one:.6f}, two machines {loss_two:.6f}, "
          f"difference {abs(loss_one - loss_two):.2e}")
    assert updates_one == updates_two == 20
    assert len(per_update_losses(one)) == 20, one[-3000:]
    assert per_update_losses(logs[0]) == per_update_losses(one)  # every update, to the 3 decimals logged
    assert abs(loss_one - loss_two) <= 1e-4
    worst = max((model_one[k].float() - model_two[k].float()).abs().max().item() for k in model_one)
    assert worst <= 1e-4, f"weights after 20 updates differ by up to {worst}"
