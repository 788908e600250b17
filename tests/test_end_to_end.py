"""toy corpus -> umst-preprocess -> fairseq-preprocess -> fairseq-train (multiscale_translation)
-> fairseq-generate --scoring sacrebleu -> fairseq-interactive, through the real CLIs."""
import glob
import os
import re
import sys

import pytest

import e2e


@pytest.fixture(scope="module")
def transformer_checkpoint(toy_databin, tmp_path_factory):
    """15 updates (stops mid-epoch, fairseq's default prefetch buffer), with validation and TensorBoard
    logging into SAVE_DIR/tb."""
    save_dir = str(tmp_path_factory.mktemp("ckpt_transformer"))
    log = e2e.train(toy_databin, save_dir, "transformer", *e2e.TINY, "--share-all-embeddings", "--tensorboard-logdir",
                    os.path.join(save_dir, "tb"), max_update=15, validate=True)
    losses = e2e.train_losses(log)
    assert losses and all(loss == loss for loss in losses), log[-3000:]
    assert "Please install tensorboardX" not in log, log[-3000:]
    return os.path.join(save_dir, "checkpoint_last.pt")


def test_tensorboard_event_files_written(transformer_checkpoint):
    tb = os.path.join(os.path.dirname(transformer_checkpoint), "tb")
    for sub in ("train", "valid"):
        events = glob.glob(os.path.join(tb, sub, "events.out.tfevents.*"))
        assert events and all(os.path.getsize(f) > 0 for f in events), (sub, os.listdir(tb) if os.path.isdir(tb) else tb)


# A fairseq-train whose prefetch thread (BufferedIterator, default --data-buffer-size) spends its time in a
# torch call that releases the GIL, as collating a big batch does: training stops mid-epoch (--max-update)
# while the thread is busy, so the interpreter finalizes under it. Without umst_plugin.patches.prefetch_thread_exit this
# aborts ("terminate called without an active exception", SIGABRT) after a successful run.
SLOW_PREFETCH_TRAIN = """
import sys, threading, torch
from fairseq_cli.train import cli_main
import umst_plugin
from umst_plugin.data.side_data_dataset import SideDataLanguagePairDataset as D
collater = D.collater
def slow_collater(self, samples, pad_to_length=None):
    if threading.current_thread() is not threading.main_thread():
        a = torch.randn(1200, 1200)
        for _ in range(4):
            a @ a
    return collater(self, samples, pad_to_length=pad_to_length)
D.collater = slow_collater
sys.argv = ["fairseq-train"] + sys.argv[1:]
sys.exit(cli_main())
"""


def test_train_stopping_mid_epoch_exits_cleanly_with_prefetch_thread_busy(toy_databin, tmp_path):
    args = [toy_databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--arch", "transformer",
            *e2e.TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "3",
            "--save-dir", str(tmp_path), "--no-save", "--disable-validation", "--num-workers", "0",
            "--no-progress-bar", "--log-format", "simple"]
    for attempt in range(2):
        proc = e2e.run([sys.executable, "-c", SLOW_PREFETCH_TRAIN, *args], check=False)
        assert proc.returncode == 0 and "terminate called" not in proc.stderr, \
            f"attempt {attempt}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        assert "done training" in proc.stdout + proc.stderr


def test_num_workers_with_side_data(toy_raw, toy_databin, tmp_path):
    """Side data batches come through DataLoader worker processes (--num-workers 2) in train and generate."""
    save_dir = str(tmp_path)
    log = e2e.train(toy_databin, save_dir, "umst_base", *e2e.TINY, "--share-all-embeddings", max_update=2,
                    num_workers=2)
    # the epoch summary's update count (fairseq prints "done training" whatever happened)
    assert re.search(r"\| num_updates 2 \|", log), log[-3000:]
    out = e2e.generate(toy_databin, os.path.join(save_dir, "checkpoint_last.pt"), "--num-workers", "2")
    assert "BLEU" in e2e.bleu_line(out)
    e2e.assert_translated_all(out, toy_raw)


def test_generate_prints_sacrebleu(toy_raw, toy_databin, transformer_checkpoint):
    out = e2e.generate(toy_databin, transformer_checkpoint)
    line = e2e.bleu_line(out)
    assert "BLEU" in line
    assert e2e.n_sentences(toy_raw) % 8  # a test set fairseq-fixed's batching would cut short
    e2e.assert_translated_all(out, toy_raw)


def test_interactive_on_raw_lines(toy_raw, toy_databin, transformer_checkpoint):
    e2e.interactive_on_raw_test_lines(toy_raw, toy_databin, transformer_checkpoint)


def test_validate_loads_checkpoint(toy_databin, transformer_checkpoint):
    proc = e2e.fairseq("validate", toy_databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation",
                       "--path", transformer_checkpoint, "--valid-subset", "valid", "--max-tokens", "1000")
    out = proc.stdout + proc.stderr
    assert "valid on 'valid' subset" in out, out[-3000:]


def test_generate_fails_clearly_without_plugin_classes_allowed(toy_databin, transformer_checkpoint):
    """The allow-list is what makes loading work: without --user-dir, torch refuses the checkpoint."""
    proc = e2e.fairseq("generate", toy_databin, "--task", "translation", "--path", transformer_checkpoint,
                       "--source-lang", e2e.SRC, "--target-lang", e2e.TGT, "--max-sentences", "8", check=False)
    assert proc.returncode != 0
    assert "weights_only" in proc.stderr or "Unsupported global" in proc.stderr
