"""``--compile-cudagraphs`` (``compilation/flags.py``): the compiled layers replayed as CUDA graphs in fairseq-train
(torch.compile's ``reduce-overhead`` mode, inductor's CUDA graph trees), one graph per batch shape, the shapes
bounded by ``--num-batch-buckets`` (tests/test_length_buckets.py: the padding leaves the loss as it was).

On a CPU: the flag needs ``--compile`` (a clear error), says that a CPU has no CUDA graphs and trains as ``--compile``
does, and warns where nothing bounds the batch shapes. The cap on the shapes recorded per layer class
(``--compile-cudagraph-shapes``, ``compilation/graph_shapes.py``): the dispatch on the CPU, the refusals. On a GPU
(``-m cuda``, the GPU check): the same losses as ``--compile`` alone on the same bucketed batches, with and without
the cap, and no layer graph that inductor skips."""
import copy
import re
import subprocess
import types

import pytest
import torch

import e2e
from umst_plugin.compilation import CompileUnavailable, compile_layers, compiled_graphs, flags, graph_shapes
from umst_plugin.compilation.state import STATE

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


@pytest.mark.parametrize("flags_given,error", [
    (("--compile-cudagraphs",), "--compile-cudagraphs replays the compiled layers: give --compile too"),
    (("--compile", "--compile-cudagraphs", "--compile-cudagraph-shapes", "-1"),
     "--compile-cudagraph-shapes must be 0 (no cap) or more, not -1"),
], ids=["without-compile", "negative-cap"])
def test_fairseq_train_stops_with_a_clear_error(toy_databin, tmp_path, flags_given, error):
    proc = e2e.fairseq("train", toy_databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--arch",
                       "transformer", *e2e.TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000",
                       "--max-update", "1", "--save-dir", tmp_path, *flags_given, check=False)
    assert proc.returncode != 0
    assert error in proc.stdout + proc.stderr


class _Block(torch.nn.Module):
    compile_region = True  # (compile_layers compiles every module that says so)

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, padding_mask=None):
        y = torch.relu(self.linear(x))
        return y if padding_mask is None else y.masked_fill(padding_mask.unsqueeze(-1), 0)


def test_the_shape_cap_records_the_first_shapes_and_runs_the_rest_compiled_without_graphs(monkeypatch, caplog):
    """``--compile-cudagraph-shapes 2`` (``compilation/graph_shapes.py``) on a one-layer model, on the CPU, where the
    dispatch is the GPU's (inductor itself leaves CPU graphs unrecorded): the first two shapes go through the
    reduce-overhead function, a shape seen before stays there, the first shape beyond the cap compiles the class's
    graph-less variant once (with the warning) and every new shape after it runs that variant, without compiling
    again. Each output equals the eager layer's exactly (the matmul is ATen's in both)."""
    monkeypatch.setattr(STATE, "graph_caps", {})
    model = torch.nn.Sequential(_Block()).eval()
    eager = copy.deepcopy(model)
    compile_layers(model, mode="reduce-overhead", graph_shapes_cap=2, check=False)
    (cap,) = STATE.graph_caps.values()
    assert cap.limit == 2 and not cap.recorded
    torch.manual_seed(0)
    steps = []
    with torch.no_grad(), caplog.at_level("INFO", logger="umst_plugin.compilation"):
        for length in (5, 7, 5, 9, 11, 9, 7):
            x = torch.randn(length, 3, 8)
            graphs = compiled_graphs()
            out = model(x)
            assert torch.equal(out, eager(x))  # (inductor calls ATen's addmm as eager does: 0.0 apart, measured)
            steps.append((len(cap.recorded), cap.beyond, compiled_graphs() - graphs))
    # (recorded, calls beyond the cap, graphs compiled by the call)
    assert steps == [(1, 0, 1), (2, 0, 0), (2, 0, 0), (2, 1, 1), (2, 2, 0), (2, 3, 0), (2, 3, 0)], steps
    assert caplog.text.count("beyond the 2 it records as CUDA graphs (9x3x8 float32)") == 1, caplog.text
    recorded = re.findall(r"_Block.forward: batch shape (\d) of at most 2 recorded as CUDA graphs \((\S+) float32\)",
                          caplog.text)
    assert recorded == [("1", "5x3x8"), ("2", "7x3x8")], caplog.text
    assert graph_shapes.counts() == {"_Block.forward": (2, 3)}  # (what the speed table's CUDA graph rows record)
    # a shape: training mode, autograd, every tensor argument's sizes
    layer, x = model[0], torch.zeros(5, 3, 8)
    with torch.no_grad():
        assert graph_shapes.shape_key(layer, (x,), {}) in cap.recorded
        assert graph_shapes.shape_key(layer, (x,), {"padding_mask": torch.zeros(3, 5)}) not in cap.recorded
    assert graph_shapes.shape_key(layer, (x,), {}) not in cap.recorded
    layer.train()
    with torch.no_grad():
        assert graph_shapes.shape_key(layer, (x,), {}) not in cap.recorded


def test_a_shape_key_holds_tensor_sizes_plain_values_and_the_types_of_other_arguments():
    """What a recorded graph is keyed on, per argument: a tensor's sizes (not its values), a plain value (None, a
    number, a string) itself, a list's or dict's items each so, and any other object its type alone (another
    object of the type meets the same graph)."""
    layer, x = _Block().eval(), torch.zeros(5, 3, 8)
    key = lambda *args, **kwargs: graph_shapes.shape_key(layer, args, kwargs)  # noqa: E731
    assert key(x, object()) == key(torch.ones(5, 3, 8), object())
    assert len({key(x, None), key(x, 3), key(x, 4), key(x, "3"), key(x, object())}) == 5
    assert key(x, [x, None]) == key(x, [torch.ones(5, 3, 8), None]) != key(x, [x[:2], None])
    assert key(x, mask={"a": x}) != key(x, mask={"a": x[:1]})


def _padded_sample(task, bsz, src_len, tgt_len):
    """A batch of exactly (bsz, src_len) source and (bsz, tgt_len) target tokens, the last sentence of each one
    token shorter (so every batch has padding, and the layers get the same arguments in every call)."""
    from umst_dev import dev

    dataset = dev.dataset_of_lengths(task, [src_len] * (bsz - 1) + [src_len - 1],
                                     [tgt_len] * (bsz - 1) + [tgt_len - 1])
    return dev.collate(dataset, range(bsz))


# the compiled model's loss and gradients against the eager model's, through aot_eager, whose decompositions can
# sum in another order: measured 0.0 for the loss and at most 1.3e-9 for a gradient (UMST's; the transformer's
# 0.0) on the Intel Xeon; 1e-8 leaves a margin of about 8x
AOT_EAGER_ATOL = 1e-8


@pytest.mark.parametrize("arch", ["transformer", "umst_base"])
def test_the_shape_cap_on_a_model_s_encoder_and_decoder_layers(arch, monkeypatch, caplog):
    """The cap on a real model's layers (the transformer's fairseq layers; UMST's, whose encoder layers get the
    side inputs as lists), traced by dynamo and AOTAutograd without inductor's code generation (``aot_eager``:
    seconds, not minutes): a training update per batch, six batches in five shapes, a cap of 3. Each layer class
    records its first 3 shapes and runs the other 2 through its graph-less variant; the loss and the gradients
    equal the eager model's."""
    from umst_dev import dev

    monkeypatch.setattr(STATE, "graph_caps", {})
    tiny = dict(encoder_layers=2, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16,
                encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
                decoder_attention_heads=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model, task = dev.build_model(arch, tiny)
    eager = copy.deepcopy(model)
    compile_layers(model, backend="aot_eager", mode="reduce-overhead", graph_shapes_cap=3, check=False)
    layers = {type(model.encoder.layers[0]).forward.__qualname__: len(model.encoder.layers),
              type(model.decoder.layers[0]).forward.__qualname__: len(model.decoder.layers)}
    worst = [0.0, 0.0]
    with caplog.at_level("WARNING", logger="umst_plugin.compilation"):
        # every batch a new source and target shape, but the third (the first's again)
        for bsz, src_len, tgt_len in ((3, 7, 6), (2, 9, 5), (3, 7, 6), (4, 5, 8), (2, 11, 4), (3, 6, 9)):
            sample = _padded_sample(task, bsz, src_len, tgt_len)
            losses = []
            for m in (model, eager):
                m.zero_grad()
                out = m(**dev.model_inputs(m, sample))
                loss = torch.nn.functional.cross_entropy(out[0].transpose(1, 2), sample["target"])
                loss.backward()
                losses.append(loss)
            worst[0] = max(worst[0], (losses[0] - losses[1]).abs().item())
            worst[1] = max([worst[1]] + [(p.grad - q.grad).abs().max().item()
                                         for p, q in zip(model.parameters(), eager.parameters())])
    assert max(worst) <= AOT_EAGER_ATOL, worst
    # 5 shapes: 3 recorded, then 2 beyond the cap, once per layer of the class
    assert graph_shapes.counts() == {name: (3, 2 * n) for name, n in layers.items()}, graph_shapes.counts()
    assert sum("beyond the 3 it records as CUDA graphs" in r.getMessage() for r in caplog.records) == len(layers)


def test_no_cap_without_cudagraphs_or_with_zero_and_a_negative_cap_is_refused(monkeypatch):
    monkeypatch.setattr(STATE, "graph_caps", {})
    compile_layers(torch.nn.Sequential(_Block()), graph_shapes_cap=2, check=False)  # (no CUDA graph mode)
    compile_layers(torch.nn.Sequential(_Block()), mode="reduce-overhead", graph_shapes_cap=0, check=False)
    assert STATE.graph_caps == {}
    with pytest.raises(ValueError, match="--compile-cudagraph-shapes must be 0 .no cap. or more, not -1"):
        compile_layers(torch.nn.Sequential(_Block()), mode="reduce-overhead", graph_shapes_cap=-1, check=False)
    cfg = _cfg(buckets=8)
    cfg.common.compile_cudagraph_shapes = -3
    with pytest.raises(CompileUnavailable, match="--compile-cudagraph-shapes must be 0 .no cap. or more, not -3"):
        flags._cudagraphs(cfg, "cpu")  # (on any device)


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


@pytest.mark.cuda
def test_capped_cudagraph_shapes_give_the_compiled_losses_on_a_gpu(toy_databin, tmp_path):
    """``--compile-cudagraph-shapes 2``: the toy corpus's 4 buckets give more shapes than 2, the rest run compiled
    without graphs, with the warning; the losses are those of ``--compile`` alone (a test of its own: the GPU
    check runs its tests side by side)."""
    assert torch.cuda.is_available()
    compiled = _train(toy_databin, tmp_path / "compiled")
    capped = _train(toy_databin, tmp_path / "capped", "--compile-cudagraphs", "--compile-cudagraph-shapes", "2")
    assert "beyond the 2 it records as CUDA graphs" in capped, capped[-3000:]
    assert "skipping cudagraphs" not in capped, capped[-3000:]
    assert e2e.train_losses(capped) == e2e.train_losses(compiled) != []


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
    the plugin's keys reach the Trainer through hydra (the CPU's warning, the layers compiled, the shape cap in the
    config), and fairseq buckets the sentences (its log of the 4 bucket lengths)."""
    save = tmp_path / "save"
    proc = _train_sh("m30k-transformer", "--data", toy_databin, "--save-dir", save, "--gpus", "0", "--cudagraphs",
                     "--batch-buckets", "4", "--", f"task.source_lang={e2e.SRC}", f"task.target_lang={e2e.TGT}",
                     "optimization.max_update=2", "dataset.max_tokens=1000", "dataset.data_buffer_size=0",
                     "dataset.disable_validation=true", "checkpoint.no_epoch_checkpoints=true",
                     "model.encoder_layers=1", "model.decoder_layers=1", "model.encoder_embed_dim=16",
                     "model.decoder_embed_dim=16", "model.encoder_ffn_embed_dim=32", "model.decoder_ffn_embed_dim=32",
                     "model.encoder_attention_heads=2", "model.decoder_attention_heads=2",
                     "+common.compile_cudagraph_shapes=16")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "'compile_cudagraph_shapes': 16" in log, log[-4000:]  # the cap, as a hydra key of the plugin's
    assert "--compile-cudagraphs: CUDA graphs need a CUDA device; the layers run compiled on cpu" in log, log[-4000:]
    assert re.search(r"--compile: \d+ layers compiled on cpu", log), log[-4000:]
    [buckets] = re.findall(r"bucketing source lengths: \[([0-9, ]+)\]", log)[:1]
    assert len(buckets.split(",")) == 4, buckets
    assert (save / "checkpoint_last.pt").is_file()
