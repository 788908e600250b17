"""umst-inspect: pictures of one toy sentence at its scales, with and without tiny checkpoints of every
architecture family; clear errors; the record hooks leave outputs unchanged.

Kept small for a shared CPU: a 60-sentence toy corpus and untrained tiny models saved in fairseq's
checkpoint format (what fairseq-train writes: cfg, model state, optimizer history)."""
import os
import shutil

import pytest
import torch

import e2e
from umst_dev import dev
from umst_plugin import inspect as umst_inspect
from umst_plugin.inspect.capture import InspectError

pytest.importorskip("matplotlib")

TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16,
            encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
            decoder_attention_heads=2, share_all_embeddings=True, dropout=0.1)
NO_LAYERS = {k: v for k, v in TINY.items() if k not in ("encoder_layers", "decoder_layers")}

# family -> (arch, overrides, number of model panels with default --layer/--head)
FAMILIES = {
    "umst": ("umst_base", TINY, 4),
    "transformer_sf": ("transformer_sf_base", {**TINY, "fast_embed_dim": 8, "fast_ffn_embed_dim": 16,
                                               "fast_attention_heads": 2}, 1),  # last layer: slow reads fast only
    "msmsa": ("msmsa_base", {**TINY, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                             "msmsa_scales": "1,3,N/4,N/2", "msmsa_min_block": 2}, 4),
    "msc": ("msc_iwslt_de_en", dict(encoder_blocks=2, encoder_layers_per_block=2, **NO_LAYERS), 2),
    "prime": ("prime_base", {**TINY, "prime_kernels": "3,7"}, 4),
    "transformer": ("transformer", TINY, 1),
}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """e2e.binarize's fairseq-preprocess + umst-preprocess, run in this process (no CLI start-up)."""
    from fairseq import options
    from fairseq_cli import preprocess as fairseq_preprocess

    from umst_plugin.preprocess import cli as umst_preprocess

    root = tmp_path_factory.mktemp("inspect_toy")
    raw = e2e.make_toy_corpus(str(root / "raw"), n_train=60, n_valid=5, n_test=7, merges=150)
    databin = str(root / "data-bin")
    prefs = ["--source-lang", e2e.SRC, "--target-lang", e2e.TGT, "--trainpref", os.path.join(raw, "train"),
             "--validpref", os.path.join(raw, "valid"), "--testpref", os.path.join(raw, "test"), "--destdir", databin]
    fairseq_preprocess.main(options.get_preprocessing_parser().parse_args(prefs + ["--joined-dictionary",
                                                                                   "--workers", "1"]))
    assert umst_preprocess.main(prefs) == 0
    return raw, databin


DPI = 40


def run(argv):
    return umst_inspect.run(argv + ["--dpi", str(DPI)])  # small PNGs: the drawing is the same, saving is faster


def save_tiny_checkpoint(databin, arch, overrides, path, seed=1):
    """A freshly initialised model in fairseq's checkpoint format (as Trainer.save_checkpoint writes it)."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    args = dev.parse_args(arch, {**overrides, "source_lang": e2e.SRC, "target_lang": e2e.TGT}, data=databin)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    state = {
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "args": None,
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True}},
        "last_optimizer_state": None,
    }
    torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def checkpoints(toy, tmp_path_factory):
    _, databin = toy
    root = tmp_path_factory.mktemp("inspect_ckpt")
    return {family: save_tiny_checkpoint(databin, arch, overrides, str(root / f"{family}.pt"))
            for family, (arch, overrides, _) in FAMILIES.items()}


def _check_png(result, n_axes_min):
    import matplotlib.image

    assert os.path.getsize(result.output) > 5_000
    image = matplotlib.image.imread(result.output)
    width, height = (result.figure.get_size_inches() * DPI).astype(int)  # Agg truncates
    assert image.shape[:2] == (height, width)
    heatmaps = [ax for ax in result.figure.axes if ax.get_images()]
    assert len(heatmaps) >= n_axes_min
    return heatmaps


def test_scales_only(toy, tmp_path, capsys):
    _, databin = toy
    out = str(tmp_path / "scales.png")
    result = run([databin, "--subset", "test", "--index", "2", "--output", out])
    heatmaps = _check_png(result, 2)
    assert [ax.get_title().split("\n")[0] for ax in heatmaps] == ["subword -> word map G_b->w",
                                                                   "phrase graph D^-1/2 (A_p + I) D^-1/2"]
    src = result.source
    assert src.pieces[-1] == "</s>" and src.words[-1] == "</s>"
    assert len(src.heads) == len(src.words) == src.phrase_adj.shape[0]
    assert max(src.token_word) == len(src.words) - 1
    with open(os.path.join(toy[0], "test.tok.kel"), encoding="utf-8") as f:
        assert src.words[:-1] == f.readlines()[2].split()  # words rebuilt from the BPE pieces and word ids
    assert "wrote " + out in capsys.readouterr().out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_with_checkpoint(family, toy, checkpoints, tmp_path):
    _, databin = toy
    out = str(tmp_path / f"{family}.png")
    result = run([databin, "--index", "0", "--path", checkpoints[family], "--output", out])
    assert result.family == family
    n_model_panels = FAMILIES[family][2]
    heatmaps = _check_png(result, 2 + n_model_panels)
    assert len(heatmaps) == 2 + n_model_panels, [ax.get_title() for ax in heatmaps]
    for panel in result.panels[2:]:  # rows of attention maps / per-position kernels are distributions
        if family == "msc" or "softmax(alpha)" in panel.title:
            continue
        sums = torch.tensor(panel.matrix).sum(-1)
        if family == "prime":  # taps that fall outside the sentence read zero padding: their weight is not drawn
            assert sums.max() <= 1 + 1e-4 and abs(float(sums[len(sums) // 2]) - 1) < 1e-4, panel.title
        else:
            torch.testing.assert_close(sums, torch.ones(len(panel.rows)), atol=1e-4, rtol=0, msg=panel.title)


def test_parse_args_names_the_plugin_unless_told_otherwise():
    """umst-inspect records the plugin as its --user-dir (run() imports it, as fairseq's CLIs import theirs) and
    defaults to the plugin's task; what the command line names wins."""
    args = umst_inspect.parse_args(["DATA", "--path", "m.pt"])
    assert args.user_dir == umst_inspect.PLUGIN_DIR and args.task == "multiscale_translation"
    args = umst_inspect.parse_args(["DATA", f"--user-dir={umst_inspect.PLUGIN_DIR}/", "--task=translation"])
    assert args.user_dir == umst_inspect.PLUGIN_DIR + "/" and args.task == "translation"


def test_word_strings_join_pieces_and_undo_moses_escapes():
    """The picture's word labels: a word's pieces joined (subword-nmt's @@, sentencepiece's \u2581), the Moses
    escapes of the tokenized text undone, the end-of-sentence kept as it is."""
    pieces = ["R&amp;@@", "D", "is", "&quot;big&quot;", "</s>"]
    assert umst_inspect._word_strings(pieces, [0, 0, 1, 2, 3], 4, "subword-nmt") == ["R&D", "is", '"big"', "</s>"]
    pieces = ["\u2581R&amp;", "D", "\u2581is", "</s>"]
    assert umst_inspect._word_strings(pieces, [0, 0, 1, 2], 3, "sentencepiece") == ["R&D", "is", "</s>"]


def test_heading_names_the_model_how_it_trained_and_where(toy, checkpoints, tmp_path):
    """The picture travels without its command line: its heading names the command and sentence, the
    checkpoint, how it was trained as the checkpoint records it (updates done, tokens per update, lr,
    warm-up, seed, precision, the checkpoints an average holds) and the hardware --hardware names."""
    from umst_plugin.average_checkpoints import average_checkpoints

    _, databin = toy
    arch, overrides, _ = FAMILIES["umst"]
    trained = dict(overrides, max_tokens=1024, update_freq=2, lr=0.0025, lr_scheduler="inverse_sqrt",
                   warmup_updates=250, seed=3, bf16=True)
    paths = []
    for updates in (900, 1000):  # two checkpoints of one run, then their average as the runner makes it
        path = save_tiny_checkpoint(databin, arch, trained, str(tmp_path / f"checkpoint_1_{updates}.pt"), seed=3)
        state = torch.load(path, weights_only=False)
        state["optimizer_history"][-1]["num_updates"] = updates
        torch.save(state, path)
        paths.append(path)
    torch.save(average_checkpoints(paths), tmp_path / "avg.pt")  # oldest first, as the runner lists them
    result = run([databin, "--index", "0", "--path", str(tmp_path / "avg.pt"), "--output", str(tmp_path / "h.png"),
                  "--hardware", "2-core test CPU"])
    lines = result.figure.get_suptitle().split("\n")
    assert lines[0] == f"umst-inspect test[0] of {databin}" and lines[1].startswith("source: ")
    assert lines[3:] == [f"model: umst_base ({tmp_path / 'avg.pt'})",
                         "trained: 1000 updates of 2048 tokens, lr 0.0025, warm-up 250, seed 3, bf16, "
                         "average of 2 checkpoints (checkpoint_1_900.pt, checkpoint_1_1000.pt)",
                         "hardware: 2-core test CPU"]
    plain = run([databin, "--index", "0", "--path", checkpoints["transformer"], "--output", str(tmp_path / "p.png")])
    assert plain.figure.get_suptitle().split("\n")[-2:] == [
        "trained: 0 updates of ? tokens, lr 0.25, warm-up 0, seed 1, fp32",  # fairseq defaults: nothing averaged
        "hardware: not recorded (umst-inspect --hardware names it)"]
    from omegaconf import OmegaConf  # the runner's average of 5 epoch checkpoints: first and last named

    cfg = OmegaConf.create({"dataset": {"max_tokens": 2048}, "optimization": {"lr": [0.0025]}, "common": {"seed": 2}})
    five = {"optimizer_history": [{"num_updates": 9600}], "averaged_from": [f"checkpoint{e}.pt" for e in range(36, 41)]}
    assert umst_inspect.training_of(five, cfg) == ("9600 updates of 2048 tokens, lr 0.0025, seed 2, fp32, "
                                                   "average of 5 checkpoints (checkpoint36.pt, ..., checkpoint40.pt)")
    cfg.common.memory_efficient_bf16 = True
    assert ", seed 2, bf16, average of 5" in umst_inspect.training_of(five, cfg)
    cfg.common.fp16 = True  # either fp16 flag alone says fp16
    assert ", seed 2, fp16, average of 5" in umst_inspect.training_of(five, cfg)
    # a heading line of 160 characters is kept whole; a longer one is cut to 159 and an ellipsis
    for hardware, line in (("x" * 150, "hardware: " + "x" * 150), ("y" * 151, "hardware: " + "y" * 149 + "\u2026")):
        cut = run([databin, "--index", "0", "--path", checkpoints["transformer"], "--output", str(tmp_path / "c.png"),
                   "--hardware", hardware])
        assert cut.figure.get_suptitle().split("\n")[-1] == line
    scales = run([databin, "--index", "0", "--output", str(tmp_path / "s.png")])  # no model: no model lines
    assert [line.split(":")[0] for line in scales.figure.get_suptitle().split("\n")[1:]] == ["source", "target"]


def test_layer_and_head(toy, checkpoints, tmp_path):
    _, databin = toy
    result = run([databin, "--index", "1", "--path", checkpoints["umst"], "--layer", "1", "--head", "2",
                  "--output", str(tmp_path / "u.png")])
    assert len(result.panels) == 6 and all("layer 1/2, head 2/2" in p.title for p in result.panels[2:])
    with pytest.raises(InspectError, match="--layer 3 is out of range: the model has 2 encoder layers"):
        run([databin, "--index", "1", "--path", checkpoints["msmsa"], "--layer", "3", "--output", str(tmp_path / "x.png")])
    with pytest.raises(InspectError, match="--head 5 is out of range: this attention has 4 heads"):
        run([databin, "--index", "1", "--path", checkpoints["msmsa"], "--head", "5", "--output", str(tmp_path / "x.png")])


def test_umst_maps_are_the_modules_own(toy, checkpoints):
    """The drawn fused map times V (and the output projection) is what RSAN returned in the forward."""
    from fairseq import checkpoint_utils

    from umst_plugin.modules.umst.graphs import upsample_attention_map

    _, databin = toy
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoints["umst"]],
                                                                     arg_overrides={"data": databin})
    model = models[0].eval()
    task.load_dataset("test")
    sample = task.dataset("test").collater([task.dataset("test")[0]])
    rsan = model.encoder.layers[-1].self_attn
    seen = {}
    rsan.register_forward_hook(lambda m, args, out: seen.update(args=args, out=out))
    with torch.no_grad():
        model.encoder(**dev.encoder_inputs(model, sample))
        x, x_word, graphs = seen["args"]
        a1, a2, fused = rsan.attention_maps(x, x_word, graphs)
        torch.testing.assert_close(fused, 0.5 * (a1 + upsample_attention_map(a2, graphs, normalize=True)))
        v = rsan._heads(rsan.in_proj.project(x, 2))
        again = rsan.out_proj(rsan._merge(fused @ v))
    torch.testing.assert_close(again, seen["out"], atol=1e-5, rtol=1e-4)


def test_record_hooks_do_not_change_outputs():
    from umst_plugin.modules.msc.layer import FeatureFusion
    from umst_plugin.modules.transformer_sf.fusion import WidthChangingAttention

    torch.manual_seed(0)
    for module, inputs in ((WidthChangingAttention(16, 4, 2).eval(),
                            (torch.randn(5, 2, 16), torch.randn(9, 2, 4), torch.zeros(2, 9, dtype=torch.bool))),
                           (FeatureFusion(8).eval(), (torch.randn(5, 2, 8), torch.randn(5, 2, 8)))):
        assert module.record is None
        off = module(*inputs)
        module.record = []
        on = module(*inputs)
        # recording takes the explicit path that returns the weights (WidthChangingAttention's fused path,
        # without them, equals it to rounding: tests/test_attention.py, in float64)
        torch.testing.assert_close(off, on, rtol=1e-5, atol=1e-6)
        assert len(module.record) == 1 and not module.record[0].requires_grad
        module.record = None


def test_sentence_without_parser(toy, tmp_path):
    raw, databin = toy
    with open(os.path.join(raw, "test.tok.kel"), encoding="utf-8") as f:
        line = f.readline().strip()
    result = run([databin, "--sentence", line + " zzzunknown", "--source-parser", "none",
                               "--bpe", "subword_nmt", "--bpe-codes", os.path.join(raw, "bpe.codes"),
                               "--output", str(tmp_path / "s.png")])
    n = len(line.split())
    assert result.source.words[:n] == line.split()
    assert "<unk>" in "".join(result.source.words[n:-1])  # the unknown word's BPE pieces map to <unk>
    assert result.source.heads == [0] * len(result.source.words)  # the no-edge fallback graph
    _check_png(result, 2)


def test_sentence_with_spacy(toy, tmp_path):
    e2e.skip_without_spacy_model()
    raw, databin = toy
    with open(os.path.join(raw, "test.tok.kel"), encoding="utf-8") as f:
        line = f.readline().strip()
    result = run([databin, "--sentence", line, "--source-parser", "spacy", "--source-parser-model",
                  "en_core_web_md", "--bpe", "subword_nmt", "--bpe-codes", os.path.join(raw, "bpe.codes"),
                  "--output", str(tmp_path / "sp.png")])
    heads = result.source.heads[:-1]
    assert result.source.words[:-1] == line.split() and len(heads) == len(line.split())
    assert 0 in heads and any(h > 0 for h in heads)  # spaCy's tree, not the no-edge fallback


def test_errors(toy, checkpoints, tmp_path, capsys):
    raw, databin = toy
    out = str(tmp_path / "e.png")
    with pytest.raises(InspectError, match=r"--index 7 is out of range: subset 'test' of .* has 7 sentences"):
        run([databin, "--index", "7", "--output", out])
    assert umst_inspect.main([databin, "--index", "99", "--output", out]) == 2
    assert "out of range" in capsys.readouterr().err

    broken = str(tmp_path / "broken-bin")
    shutil.copytree(databin, broken)
    missing = os.path.join(broken, f"test.{e2e.SRC}-{e2e.TGT}.{e2e.SRC}.wordids.bin")
    assert os.path.exists(missing)
    os.remove(missing)
    with pytest.raises(ValueError, match="wordids.bin: side data not found"):
        run([broken, "--index", "0", "--output", out])

    lstm = save_tiny_checkpoint(databin, "lstm", dict(encoder_embed_dim=8, decoder_embed_dim=8,
                                                      encoder_hidden_size=8, decoder_hidden_size=8,
                                                      decoder_out_embed_dim=8), str(tmp_path / "lstm.pt"))
    with pytest.raises(InspectError, match="don't know how to inspect a checkpoint of arch 'lstm'"):
        run([databin, "--index", "0", "--path", lstm, "--output", out])
    with pytest.raises(InspectError, match="exactly one of --index"):
        run([databin, "--output", out])


def test_python_dash_m(toy, tmp_path, monkeypatch, capsys):
    """``python -m umst_plugin.inspect`` (run in this process: the module's __main__, exit status 2 on errors)."""
    import runpy

    _, databin = toy
    monkeypatch.setattr("sys.argv", ["umst-inspect", databin, "--index", "70", "--output", str(tmp_path / "m.png")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("umst_plugin.inspect", run_name="__main__")
    assert exit_info.value.code == 2 and "subset 'test' of" in capsys.readouterr().err


def test_layer_and_head_numbers_run_from_one_to_the_count():
    from umst_plugin.inspect.capture import resolve_head, resolve_layer

    assert [resolve_layer(n, 3) for n in (1, 2, 3, None)] == [0, 1, 2, 2]
    assert [resolve_head(n, 4) for n in (1, 4)] == [0, 3]
    for bad in (0, 4):
        with pytest.raises(InspectError, match=rf"--layer {bad} is out of range: the model has 3 encoder layers \(1\.\.3\)"):
            resolve_layer(bad, 3)
    for bad in (0, 5):
        with pytest.raises(InspectError, match=rf"--head {bad} is out of range: this attention has 4 heads \(1\.\.4\)"):
            resolve_head(bad, 4)


def test_heatmap_cells_carry_their_values_only_where_asked_and_readable():
    """A panel writes its values in its cells only with annotate (Prime's kernel-size panel) and up to 400 cells;
    each finite value to two decimals, white on a dark cell, black on a light one; a NaN cell stays empty."""
    import numpy as np
    from matplotlib.figure import Figure

    from umst_plugin.inspect.capture import Panel
    from umst_plugin.inspect.draw import draw_heatmap

    matrix = np.array([[0.0, 0.25], [1.0, np.nan]])

    def drawn(panel):
        fig = Figure()
        ax = fig.add_subplot()
        draw_heatmap(fig, ax, panel)
        return ax

    def cell_texts(panel):
        return [(t.get_text(), t.get_color()) for t in drawn(panel).texts]

    def colour_range(panel):
        return drawn(panel).get_images()[0].get_clim()

    # the colours span 0 to the panel's vmax where it names one (Prime's kernel sizes: 1), else to the largest value
    assert colour_range(Panel("t", matrix * 0.5, ["a", "b"], ["c", "d"], vmax=1.0)) == (0.0, 1.0)
    assert colour_range(Panel("t", matrix * 0.5, ["a", "b"], ["c", "d"])) == (0.0, 0.5)

    assert cell_texts(Panel("t", matrix, ["a", "b"], ["c", "d"])) == []  # not annotated by default
    # viridis: dark at 0, light at 1
    assert cell_texts(Panel("t", matrix, ["a", "b"], ["c", "d"], annotate=True)) == [
        ("0.00", "white"), ("0.25", "white"), ("1.00", "black")]
    big = np.full((20, 21), 0.5)
    assert cell_texts(Panel("t", big, list("abcdefghijklmnopqrst"), [str(i) for i in range(21)], annotate=True)) == []
    square = np.full((20, 20), 0.5)
    assert len(cell_texts(Panel("t", square, list("abcdefghijklmnopqrst"), [str(i) for i in range(20)],
                                annotate=True))) == 400


def test_fairseqs_transformer_is_drawn_per_head(toy, checkpoints, tmp_path):
    """fairseq's attention is asked for its weights per head: --head picks one (no "--head ignored" note), and
    the default is their mean. A module that averaged the heads itself gives one map, marked not per head."""
    from umst_plugin.inspect.capture import fairseq_mha_per_head, known_families

    _, databin = toy
    head2 = run([databin, "--index", "0", "--path", checkpoints["transformer"], "--head", "2",
                 "--output", str(tmp_path / "t.png")])
    assert head2.panels[2].title.endswith("layer 2/2, head 2/2") and not head2.notes
    mean = run([databin, "--index", "0", "--path", checkpoints["transformer"], "--output", str(tmp_path / "m.png")])
    assert mean.panels[2].title.endswith("layer 2/2, mean of 2 heads")
    per_head = torch.arange(2 * 3 * 4 * 5, dtype=torch.float).view(2, 3, 4, 5)  # H x B x T x S
    maps, is_per_head = fairseq_mha_per_head(per_head, 2)
    assert is_per_head and torch.equal(maps, per_head[:, 0])
    maps, is_per_head = fairseq_mha_per_head(per_head[0], 2)  # B x T x S: averaged already
    assert not is_per_head and torch.equal(maps, per_head[0, :1])
    assert sorted(known_families()) == sorted(FAMILIES) and known_families()[-1] == "transformer"


def test_asking_fairseqs_attention_for_its_weights_changes_no_output():
    """While asked, fairseq's MultiheadAttention runs its own path instead of torch's fast one: the same output
    (to float32 rounding), weights per head whose mean is what the fast path returns, the switch put back after."""
    from fairseq.modules import MultiheadAttention

    from umst_plugin.inspect.capture import ask_for_weights

    torch.manual_seed(0)
    attn = MultiheadAttention(16, 4, self_attention=True).eval()
    x, mask = torch.randn(7, 2, 16), torch.zeros(2, 7, dtype=torch.bool)
    mask[1, 5:] = True
    fast, fast_weights = attn(query=x, key=x, value=x, key_padding_mask=mask, need_weights=True)
    store = []
    handles = ask_for_weights(attn, store)
    asked, _ = attn(query=x, key=x, value=x, key_padding_mask=mask, need_weights=False)
    for h in handles:
        h.remove()
    assert attn.skip_embed_dim_check is False and store[0].shape == (4, 2, 7, 7)
    # both equal to the bit on an Intel Xeon (torch 2.13, CPU); 1e-6: a few float32 ulps of values near 1, for
    # a machine whose kernels sum in another order
    torch.testing.assert_close(asked, fast, rtol=0, atol=1e-6)
    torch.testing.assert_close(store[0].mean(0), fast_weights, rtol=0, atol=1e-6)


def test_transformer_sf_linear_attention_fusion_is_drawn_per_head(toy, tmp_path):
    """--sf-fusion linear-attention (fairseq's attention between the branches) draws both directions, a head where
    --head names one; each row a distribution over the other branch."""
    _, databin = toy
    arch, overrides, _ = FAMILIES["transformer_sf"]
    path = save_tiny_checkpoint(databin, arch, {**overrides, "sf_fusion": "linear-attention"}, str(tmp_path / "l.pt"))
    # layer 1: both directions (in the last layer only the subwords read the characters)
    result = run([databin, "--index", "0", "--path", path, "--layer", "1", "--head", "2",
                  "--output", str(tmp_path / "l.png")])
    model_panels = result.panels[2:]
    assert [p.title.split(": ")[1].split("\n")[0] for p in model_panels] == ["subword -> character",
                                                                           "character -> subword"]
    for panel in model_panels:
        assert panel.title.endswith(", head 2/2"), panel.title
        torch.testing.assert_close(torch.tensor(panel.matrix).sum(-1), torch.ones(len(panel.rows)), atol=1e-4, rtol=0)


def _scales_axes(pieces, words, token_word, heads):
    import numpy as np
    from matplotlib.figure import Figure

    from umst_plugin.inspect.draw import draw_scales

    source = umst_inspect.Source(pieces, words, token_word, heads, np.eye(len(words)),
                                 np.eye(len(pieces), len(words)), "test")
    ax = Figure().add_subplot()
    draw_scales(ax, source)
    return ax


def test_scales_diagram_places_words_over_their_pieces_and_draws_the_parse():
    """Each word sits over the mean of its pieces; one arc per dependent from its head's word, one "root" arrow;
    the </s> word (head 0 by construction, not a parse) gets neither; labels longer than their box are cut."""
    pieces = ["the", "gre@@", "at", "supercalifragilistic", "cat", "</s>"]
    words = ["the", "great", "supercalifragilistic", "cat", "</s>"]
    ax = _scales_axes(pieces, words, [0, 1, 1, 2, 3, 4], [4, 4, 4, 0, 0])
    boxes = {t.get_text(): t.get_position() for t in ax.texts if t.get_bbox_patch() is not None}
    assert boxes["great"] == (1.5, 1.3) and boxes["cat"] == (4.0, 1.3) and boxes["gre@@"] == (1.0, 0.0)
    assert boxes["supercalifr\u2026"] == (3.0, 0.0)  # a piece: 12 characters at most
    assert boxes["supercalifragil\u2026"] == (3.0, 1.3)  # a word: 16
    assert [t.get_text() for t in ax.texts if t.get_text() == "root"] == ["root"]
    (root,) = [t for t in ax.texts if t.get_text() == "root"]
    assert root.xy[0] == 4.0
    arcs = [line.get_xdata() for line in ax.lines if len(line.get_xdata()) == 40]
    assert sorted((x[0], x[-1]) for x in arcs) == [(4.0, 0.0), (4.0, 1.5), (4.0, 3.0)]  # head -> dependent


def test_scales_diagram_turns_piece_labels_past_24_pieces():
    for n, rotation in ((24, 0.0), (25, 90.0)):
        pieces = [f"p{i}" for i in range(n - 1)] + ["</s>"]
        ax = _scales_axes(pieces, pieces, list(range(n)), [0] * n)
        assert [t.get_rotation() for t in ax.texts if t.get_text() == "p0" and t.get_position()[1] == 0.0] == [rotation]
        assert ax.get_ylim()[0] == (-0.5 if rotation == 0 else -0.9)  # room below for the turned labels


def test_short_labels_keep_their_width_whole():
    from umst_plugin.inspect.draw import _short

    assert _short("x" * 12) == "x" * 12 and _short("x" * 13) == "x" * 11 + "\u2026"
    assert _short("y" * 16, 16) == "y" * 16 and _short("y" * 17, 16) == "y" * 15 + "\u2026"


def _loaded(path, toy):
    """(model in eval mode, the test set's first sample, its Source) of the checkpoint at ``path``, as umst-inspect
    loads them."""
    from fairseq import checkpoint_utils

    _, databin = toy
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": databin})
    task.load_dataset("test")
    sample = task.dataset("test").collater([task.dataset("test")[0]])
    return models[0].eval(), sample, umst_inspect.source_from_sample(task, sample, "test[0]")


def test_prime_panels_are_each_layers_kernel_shares_and_the_chosen_layers_kernels(toy, checkpoints):
    """Prime (found by a flip sweep of models/prime/capture.py): the first panel is softmax(alpha) of every layer,
    annotated (Eq. 7; alpha set apart from its uniform start here); each kernel size's panel is the per-position
    kernel laid on the positions it weighs, each full row summing to 1 (softmax over the taps, Eq. 6); the last
    is their mixture by the shares."""
    import numpy as np

    from umst_plugin.models.prime.capture import _band, capture_prime

    model, sample, source = _loaded(checkpoints["prime"], toy)
    torch.manual_seed(0)
    for layer in model.encoder.layers:
        layer.conv.gate_logits.data.normal_()
    capture = capture_prime(model, sample, source, layer=1, head=2)
    shares = capture.panels[0]
    want = np.stack([layer.conv.gate_weights().detach().numpy() for layer in model.encoder.layers])
    np.testing.assert_allclose(shares.matrix, want, rtol=1e-6)
    assert shares.annotate and shares.cols == ["k=3", "k=7"] and shares.vmax == 1.0
    k3, k7, mixed = capture.panels[1:]
    n = len(source.pieces)
    for panel, k in ((k3, 3), (k7, 7)):
        assert panel.matrix.shape == (n, n) and "head 2/2" in panel.title and f"k={k}" in panel.title
        full = [i for i in range(n) if i - k // 2 >= 0 and i + k // 2 < n]  # every tap on a position
        np.testing.assert_allclose(panel.matrix[full].sum(1), 1.0, rtol=1e-5)
    gate = model.encoder.layers[0].conv.gate_weights().detach().numpy()
    np.testing.assert_allclose(mixed.matrix, gate[0] * k3.matrix + gate[1] * k7.matrix, rtol=1e-5, atol=1e-7)
    # a tap on position 0 lands in column 0; taps before the sentence or past its end on none
    kernel = np.arange(1, 10, dtype=np.float32).reshape(3, 3)
    assert _band(kernel, 1, 3).tolist() == [[2, 3, 0], [4, 5, 6], [0, 7, 8]]


def test_msc_panels_are_each_fused_layers_gates_by_position_and_the_errors_say_why_there_are_none(toy, checkpoints):
    """MSC (found by a flip sweep of models/msc/capture.py): one row per encoder layer with a context attention,
    named by its block and layer, the gates g of Eq. 12 its forward computed, averaged over channels, one column
    per source piece; the decoder's Eq. 13 gates over the target's real tokens; no target, no decoder panel but a
    note; cells annotated up to 24 pieces; the records switched off after; a model without gates refused, saying
    why."""
    import re
    from types import SimpleNamespace

    import numpy as np

    from umst_plugin.models.msc.capture import capture_msc

    model, sample, source = _loaded(checkpoints["msc"], toy)
    encoder_fusions = [layer.fusion for layer in model.encoder.layers]
    decoder_fusions = [layer.fusion for layer in model.decoder.layers]
    kept = {}
    for f in encoder_fusions + decoder_fusions:
        if f is not None:
            f.record = kept.setdefault(id(f), [])
    with torch.no_grad():
        model(**dev.model_inputs(model, sample))
    for f in encoder_fusions + decoder_fusions:
        if f is not None:
            f.record = None

    capture = capture_msc(model, sample, source)
    encoder_panel, decoder_panel = capture.panels
    m = model.encoder.layers_per_block
    fused = [i for i, f in enumerate(encoder_fusions) if f is not None]
    assert fused and encoder_panel.rows == [f"block {i // m + 1} layer {i % m + 1}" for i in fused]
    assert encoder_panel.cols == source.pieces
    want = np.stack([kept[id(encoder_fusions[i])][0][:, 0].mean(-1).numpy() for i in fused])
    assert encoder_panel.matrix.shape == (len(fused), len(source.pieces))
    np.testing.assert_allclose(encoder_panel.matrix, want, rtol=1e-6)
    pad = model.decoder.dictionary.pad()
    n_tgt = int(sample["target"][0].ne(pad).sum())
    assert decoder_panel.rows == [f"layer {n + 1} (block {n + 1})" for n in range(len(decoder_fusions))]
    want = np.stack([kept[id(f)][0][:n_tgt, 0].mean(-1).numpy() for f in decoder_fusions])
    np.testing.assert_allclose(decoder_panel.matrix, want, rtol=1e-6)
    assert decoder_panel.cols == [model.decoder.dictionary[int(t)]
                                  for t in sample["net_input"]["prev_output_tokens"][0][:n_tgt]]
    assert all(f.record is None for f in encoder_fusions + decoder_fusions if f is not None)

    no_target = dict(sample, net_input={k: v for k, v in sample["net_input"].items() if k != "prev_output_tokens"})
    alone = capture_msc(model, no_target, source)
    assert len(alone.panels) == 1 and alone.notes == [
        "no target (--sentence): decoder block-collaboration gates not drawn"]
    for n, annotated in ((24, True), (25, False)):
        assert capture_msc(model, no_target, SimpleNamespace(pieces=["p"] * n)).panels[0].annotate is annotated
    eos = model.decoder.dictionary.eos()
    for n, annotated in ((24, True), (25, False)):  # the decoder's: by the target's length
        target = torch.cat([sample["target"][0][:1].repeat(n - 1), torch.tensor([eos])]).unsqueeze(0)
        prev = torch.cat([torch.tensor([[eos]]), target[:, :-1]], 1)
        longer = dict(sample, target=target, net_input=dict(sample["net_input"], prev_output_tokens=prev))
        assert capture_msc(model, longer, source).panels[1].annotate is annotated

    for overrides, why in ((dict(msc_fusion="add"), "--msc-fusion add"),
                           (dict(no_contextual_collaboration=True), "no context attention")):
        gateless, _ = dev.build_model("msc_iwslt_de_en", dict(FAMILIES["msc"][1], **overrides))
        with pytest.raises(InspectError, match=re.escape(f"this MSC model has no gates to draw ({why})")):
            capture_msc(gateless.eval(), sample, source)


def test_transformer_sf_draws_the_last_fusion_layer_by_default_its_weights_and_names_the_layers_that_have_one(
        toy, tmp_path):
    """TranSFormer (found by a flip sweep of models/transformer_sf/capture.py), cga fusion: without --layer the last
    layer with a fusion (of three with one: the third; of layers 1 and 2 of three: the second); a layer without
    one is refused naming those that have one; the map is the mean over heads of the weights the fusion's attention
    computed; the characters' labels show a space as "␣"."""
    from umst_plugin.inspect.capture import run_encoder
    from umst_plugin.models.transformer_sf.capture import capture_transformer_sf

    _, databin = toy
    arch, overrides, _ = FAMILIES["transformer_sf"]
    for spec, last in (("all", 3), ("1,2", 2)):
        path = save_tiny_checkpoint(databin, arch, {**overrides, "encoder_layers": 3, "sf_interaction_layers": spec},
                                    str(tmp_path / "sf.pt"))
        model, sample, source = _loaded(path, toy)
        capture = capture_transformer_sf(model, sample, source)
        assert all(f"layer {last}/3, mean of 2 heads" in p.title for p in capture.panels), capture.panels[0].title
        layer = model.encoder.stack.layers[last - 1]
        kept = []
        layer.slow_fusion.attn.record = kept
        try:
            run_encoder(model, sample)
        finally:
            layer.slow_fusion.attn.record = None
        slow = next(p for p in capture.panels if p.title.split(": ")[1].startswith("subword ->"))
        torch.testing.assert_close(torch.tensor(slow.matrix), kept[0][0].float().mean(0))
        assert " " not in slow.cols and slow.cols.count("␣") >= len(source.words) - 2  # (words: their </s> too)
    with pytest.raises(InspectError, match="layer 3 has no cross-granularity fusion; layers with fusion: 1, 2"):
        capture_transformer_sf(model, sample, source, layer=3)


def test_umst_notes_the_relative_value_term_only_with_relative_positions(toy, checkpoints, tmp_path):
    from umst_plugin.models.umst.capture import capture_umst

    _, databin = toy
    model, sample, source = _loaded(checkpoints["umst"], toy)
    assert capture_umst(model, sample, source).notes == []
    arch, overrides, _ = FAMILIES["umst"]
    rpr, _, _ = _loaded(save_tiny_checkpoint(databin, "umst_base_rpr", overrides, str(tmp_path / "rpr.pt")), toy)
    notes = capture_umst(rpr, sample, source).notes
    assert len(notes) == 1 and notes[0].startswith("relative positions: ATTN1 includes the relative key term")


def test_msmsa_titles_each_head_with_its_scale_s_window_on_this_sentence(toy, checkpoints):
    """MSMSA (found by a flip sweep of models/msmsa/capture.py), scales 1, 3, N/4, N/2: a fixed scale's window is
    its width; a relative one's N/k is 2 (n // 2k) + 1 on a sentence of n pieces; the width-1 head attends each
    piece alone."""
    import numpy as np

    from umst_plugin.models.msmsa.capture import capture_msmsa

    model, sample, source = _loaded(checkpoints["msmsa"], toy)
    n = len(source.pieces)
    capture = capture_msmsa(model, sample, source)
    widths = [p.title.split("\n")[0].split(", ")[-1] for p in capture.panels]
    assert widths == ["width 1", "width 3", f"width {2 * (n // 8) + 1}", f"width {2 * (n // 4) + 1}"], widths
    np.testing.assert_allclose(capture.panels[0].matrix, np.eye(n), atol=1e-6)
