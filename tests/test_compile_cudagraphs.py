"""``--compile-cudagraphs`` (``compilation/flags.py``): the compiled layers replayed as CUDA graphs in fairseq-train
(torch.compile's ``reduce-overhead`` mode, inductor's CUDA graph trees), one graph per batch shape, the shapes
bounded by ``--num-batch-buckets`` (tests/test_length_buckets.py: the padding leaves the loss as it was).

On a CPU: the flag needs ``--compile`` (a clear error), says that a CPU has no CUDA graphs and trains as ``--compile``
does, and warns where nothing bounds the batch shapes. On a GPU (``-m cuda``, the GPU check): the same losses as
``--compile`` alone on the same bucketed batches, and no layer graph that inductor skips."""
import re
import subprocess
import types

import pytest
import torch

import e2e
from umst_plugin.compilation import CompileUnavailable, flags

TINY = (*e2e.TINY, "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0")


def _cfg(compile_=True, cudagraphs=True, buckets=0, multiple=1):
    return types.SimpleNamespace(common=types.SimpleNamespace(compile=compile_, compile_cudagraphs=cudagraphs),
                                 task=types.SimpleNamespace(num_batch_buckets=buckets,
                                                            required_seq_len_multiple=multiple))


def test_cudagraphs_need_compile_a_cuda_device_and_warn_where_the_shapes_are_unbounded(caplog):
    assert flags._cudagraphs(_cfg(cudagraphs=False), "cuda") is False
    with pytest.raises(CompileUnavailable, match="give --compile too"):
        flags._cudagraphs(_cfg(compile_=False), "cuda")
    with caplog.at_level("WARNING", logger=flags.__name__):
        assert flags._cudagraphs(_cfg(buckets=8), "cpu") is False
        assert "CUDA graphs need a CUDA device; the layers run compiled on cpu without them" in caplog.text
        caplog.clear()
        assert flags._cudagraphs(_cfg(buckets=8), "cuda:0") is True and not caplog.text
        assert flags._cudagraphs(_cfg(multiple=8), "cuda") is True and not caplog.text
        assert flags._cudagraphs(_cfg(), "cuda") is True
        assert "bound the shapes with --num-batch-buckets N" in caplog.text


def test_fairseq_train_without_compile_stops_with_a_clear_error(toy_databin, tmp_path):
    proc = e2e.fairseq("train", toy_databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--arch",
                       "transformer", *e2e.TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000",
                       "--max-update", "1", "--save-dir", tmp_path, "--compile-cudagraphs", check=False)
    assert proc.returncode != 0
    assert "--compile-cudagraphs replays the compiled layers: give --compile too" in proc.stdout + proc.stderr


def _train(databin, save_dir, *extra):
    log = e2e.train(databin, str(save_dir), "transformer", *TINY, "--compile", "--num-batch-buckets", "4",
                    "--log-interval", "2", *extra, max_update=10)
    assert re.search(r"\| num_updates 10 \|", log), log[-3000:]
    return log


@pytest.mark.cuda
def test_cudagraph_replays_give_the_compiled_losses_on_a_gpu(toy_databin, tmp_path):
    """The tiny transformer, 10 updates of the bucketed toy batches on the GPU, with and without CUDA graphs: the
    same logged losses (dropout off: the replayed and the launched kernels are the same kernels), and inductor
    skipped no layer graph."""
    assert torch.cuda.is_available()
    compiled = _train(toy_databin, tmp_path / "compiled")
    replayed = _train(toy_databin, tmp_path / "replayed", "--compile-cudagraphs")
    assert "skipping cudagraphs" not in replayed, replayed[-3000:]
    assert e2e.train_losses(replayed) == e2e.train_losses(compiled) != []


def _train_sh(*args):
    from test_train_sh_plan import TRAIN_SH, env

    return subprocess.run(["bash", TRAIN_SH, *map(str, args)], env=env(), cwd=e2e.ROOT, capture_output=True, text=True)


def test_train_sh_cudagraphs_adds_compile_the_graphs_and_eight_buckets_and_refuses_two_bucket_counts():
    from test_train_sh_plan import plan

    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--cudagraphs")
    assert " +common.compile=true" in command and " +common.compile_cudagraphs=true" in command
    assert " ++task.num_batch_buckets=8" in command
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--cudagraphs", "--batch-buckets", "16")
    assert " ++task.num_batch_buckets=16" in command and "num_batch_buckets=8" not in command
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--batch-buckets", "4")  # buckets alone: no compiling
    assert " ++task.num_batch_buckets=4" in command and "common.compile" not in command
    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--compile")
    assert "num_batch_buckets" not in command and "compile_cudagraphs" not in command
    for args, expected in [(("--batch-buckets", "0"), "--batch-buckets 0: expected a number of buckets"),
                           (("--cudagraphs", "--", "++task.num_batch_buckets=4"),
                            "++task.num_batch_buckets=4 and --batch-buckets/--cudagraphs both set the buckets")]:
        proc = _train_sh("umst-t2-umst-base", "--data", "/data/bin", "--dry-run", *args)
        assert proc.returncode == 2 and expected in proc.stderr, (args, proc.stderr)


def test_train_sh_cudagraphs_trains_a_row_compiled_on_bucketed_batches_on_a_cpu(toy_databin, tmp_path):
    """The real fairseq-hydra-train under train.sh --cudagraphs on the toy corpus (a Multi30k row's config, tiny):
    the plugin's keys reach the Trainer through hydra (the CPU's warning, the layers compiled), and fairseq buckets
    the sentences (its log of the 4 bucket lengths)."""
    save = tmp_path / "save"
    proc = _train_sh("m30k-transformer", "--data", toy_databin, "--save-dir", save, "--gpus", "0", "--cudagraphs",
                     "--batch-buckets", "4", "--", f"task.source_lang={e2e.SRC}", f"task.target_lang={e2e.TGT}",
                     "optimization.max_update=2", "dataset.max_tokens=1000", "dataset.data_buffer_size=0",
                     "dataset.disable_validation=true", "checkpoint.no_epoch_checkpoints=true",
                     "model.encoder_layers=1", "model.decoder_layers=1", "model.encoder_embed_dim=16",
                     "model.decoder_embed_dim=16", "model.encoder_ffn_embed_dim=32", "model.decoder_ffn_embed_dim=32",
                     "model.encoder_attention_heads=2", "model.decoder_attention_heads=2")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "--compile-cudagraphs: CUDA graphs need a CUDA device; the layers run compiled on cpu" in log, log[-4000:]
    assert re.search(r"--compile: \d+ layers compiled on cpu", log), log[-4000:]
    [buckets] = re.findall(r"bucketing source lengths: \[([0-9, ]+)\]", log)[:1]
    assert len(buckets.split(",")) == 4, buckets
    assert (save / "checkpoint_last.pt").is_file()
