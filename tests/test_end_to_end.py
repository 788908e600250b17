"""toy corpus -> umst-preprocess -> fairseq-preprocess -> fairseq-train (multiscale_translation)
-> fairseq-generate --scoring sacrebleu -> fairseq-interactive, through the real CLIs."""
import os

import pytest

import e2e


@pytest.fixture(scope="module")
def transformer_checkpoint(toy_databin, tmp_path_factory):
    save_dir = str(tmp_path_factory.mktemp("ckpt_transformer"))
    log = e2e.train(toy_databin, save_dir, "transformer", *e2e.TINY, "--share-all-embeddings", max_update=15)
    losses = e2e.train_losses(log)
    assert losses and all(loss == loss for loss in losses), log[-3000:]
    return os.path.join(save_dir, "checkpoint_last.pt")


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
