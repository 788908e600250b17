"""Tests of the MSC model (umst_plugin/models/msc/, umst_plugin/modules/msc/layer.py)."""

import copy
import json
import os
import sys

import pytest
import torch

from fairseq import options
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
)
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel
from fairseq.tasks.translation import TranslationTask

import umst_plugin  # noqa: F401  (registers the models)
from umst_plugin.models.msc.encoder import MSCEncoder
from umst_plugin.models.msc.model import MSCModel


TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--encoder-blocks", "3", "--encoder-layers-per-block", "2"]
ABLATIONS = {
    "full": [],
    "add": ["--msc-fusion", "add"],
    "ffn_cell": ["--context-cell", "ffn"],
    "no_ctx_attn": ["--no-context-attention"],
    "no_ctx_collab": ["--no-contextual-collaboration"],
    "no_block_collab": ["--no-block-collaboration"],
    "plain": ["--no-block-collaboration", "--no-contextual-collaboration"],
}


def make_dictionary(size):
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


def build(arch, flags=(), vocab=40, seed=0, share=True):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/nonexistent", "--task", "translation", "--arch", arch, "-s", "src", "-t", "tgt",
                 *(["--share-all-embeddings"] if share else []), *flags])
    d = make_dictionary(vocab)
    task = TranslationTask(args, d, d)
    torch.manual_seed(seed)
    return task.build_model(args), task, args


# fairseq's transformer_iwslt_de_en sizes spelled out: building the dataclass-based
# `transformer` from a Namespace re-applies the dataclass defaults (512) over the arch's.
IWSLT_TRANSFORMER = ["--arch", "transformer", "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
                     "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
                     "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def random_batch(bsz=3, src_len=7, tgt_len=5, vocab=40, seed=0, left_pad=True):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (bsz, src_len), generator=g)
    lengths = torch.tensor([src_len - (i % 3) for i in range(bsz)])
    for i, n in enumerate(lengths.tolist()):
        src[i, n - 1] = 2  # </s>
        if n < src_len:
            if left_pad:
                src[i] = torch.cat([torch.ones(src_len - n, dtype=torch.long), src[i, :n]])
            else:
                src[i, n:] = 1
    prev = torch.randint(4, vocab, (bsz, tgt_len), generator=g)
    prev[:, 0] = 2
    target = torch.cat([prev[:, 1:], torch.full((bsz, 1), 2)], dim=1)
    return src, lengths, prev, target


# ---------------------------------------------------------------------------
# Architectures and parameter counts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch,dim,ffn,heads", [
    ("msc_iwslt_de_en", 256, 512, 4), ("msc_base", 512, 2048, 8), ("msc_big", 1024, 4096, 16)])
def test_arch_defaults(arch, dim, ffn, heads):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["/x", "--task", "translation", "--arch", arch])
    from umst_plugin.models.msc.model import msc_base_architecture
    msc_base_architecture(args)
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads) == (dim, ffn, heads)
    assert (args.decoder_embed_dim, args.decoder_ffn_embed_dim, args.decoder_attention_heads) == (dim, ffn, heads)
    assert args.encoder_blocks == 6 and args.encoder_layers_per_block == 1
    assert args.encoder_layers == 6 and args.decoder_layers == 6
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert args.msc_fusion == "gate" and args.context_cell == "gru"


def test_depth_flags_and_errors():
    model, _, args = build("msc_iwslt_de_en", TINY)
    assert args.encoder_layers == 6 and len(model.encoder.layers) == 6
    assert len(model.decoder.layers) == 3
    with pytest.raises(ValueError, match="--encoder-layers"):
        build("msc_iwslt_de_en", TINY + ["--encoder-layers", "5"])
    with pytest.raises(ValueError, match="one layer per encoder block"):
        build("msc_iwslt_de_en", TINY + ["--decoder-layers", "4"])


def test_plain_ablation_matches_prenorm_transformer_size():
    """--no-block-collaboration --no-contextual-collaboration is a plain pre-norm Transformer."""
    plain, _, _ = build("msc_iwslt_de_en", ABLATIONS["plain"])
    ref, _, _ = build("transformer", IWSLT_TRANSFORMER + ["--encoder-normalize-before", "--decoder-normalize-before"])
    assert n_params(plain) == n_params(ref)
    full, _, _ = build("msc_iwslt_de_en")
    add, _, _ = build("msc_iwslt_de_en", ABLATIONS["add"])
    gate_params = 12 * (2 * 256 * 256 + 256)  # one Linear(2C, C) per fused layer, 6 enc + 6 dec
    assert n_params(full) - n_params(add) == gate_params


def test_param_count_table2_small_6_layers():
    """Table 2 rows 1-2: 10.5M -> 15.6M with a 10k joint BPE vocabulary, shared embeddings."""
    ref, _, _ = build("transformer", IWSLT_TRANSFORMER, vocab=10000)
    msc, _, _ = build("msc_iwslt_de_en", vocab=10000)
    assert abs(n_params(ref) / 1e6 - 10.5) < 0.05
    assert abs(n_params(msc) / 1e6 - 15.6) < 0.05


# ---------------------------------------------------------------------------
# Encoder output, reordering, decoding
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["full", "no_ctx_collab", "no_block_collab"])
def test_encoder_out_carries_blocks_and_contexts_and_reorders(name):
    model, _, _ = build("msc_iwslt_de_en", TINY + ABLATIONS[name])
    model.eval()
    src, lengths, _, _ = random_batch()
    out = model.encoder(src, lengths)  # no side inputs: the task hands MSC none (test_trains_through_multiscale_translation_task_with_side_inputs)
    n_blocks = 1 if name == "no_block_collab" else 3
    n_ctx = 0 if name == "no_ctx_collab" else 3
    assert len(out["msc_block_out"]) == n_blocks and len(out["msc_context"]) == n_ctx
    for t in out["msc_block_out"] + out["msc_context"]:
        assert t.shape == (7, 3, 16)
    assert torch.equal(out["encoder_out"][0], out["msc_block_out"][-1])
    assert out["encoder_padding_mask"][0].shape == (3, 7)
    order = torch.tensor([2, 0, 0, 1])
    re = model.encoder.reorder_encoder_out(out, order)
    for key in ("encoder_out", "msc_block_out", "msc_context"):
        for a, b in zip(out[key], re[key]):
            assert torch.equal(a[:, order], b)
    assert torch.equal(re["encoder_padding_mask"][0], out["encoder_padding_mask"][0][order])
    assert torch.equal(re["src_lengths"][0], lengths[order])


def test_context_recurrence_and_gate_formulas():
    """C^n = GRU(C^{n-1}, B^n) (Eq. 9) and the gate of Eqs. 12-13."""
    from umst_plugin.modules.msc.layer import FeatureFusion
    model, _, _ = build("msc_iwslt_de_en", TINY)
    model.eval()
    src, lengths, _, _ = random_batch()
    with torch.no_grad():
        out = model.encoder(src, lengths)
        b, c = out["msc_block_out"], out["msc_context"]
        gru = model.encoder.context_cell.gru
        for n in (1, 2):
            expected = gru(b[n].reshape(-1, 16), c[n - 1].reshape(-1, 16)).view_as(c[n])
            torch.testing.assert_close(c[n], expected)
        fusion = FeatureFusion(16, "gate")
        a_h, a_c = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
        w1, w2 = fusion.gate_proj.weight[:, :16], fusion.gate_proj.weight[:, 16:]
        g = torch.sigmoid(a_h @ w1.T + a_c @ w2.T + fusion.gate_proj.bias)
        torch.testing.assert_close(fusion(a_h, a_c), g * a_h + (1 - g) * a_c)
        torch.testing.assert_close(FeatureFusion(16, "add")(a_h, a_c), a_h + a_c)


def test_blocks_differ_and_decoder_reads_each_block():
    """Block collaboration: decoder layer 1 reads block 1, so changing only block 1's output changes the output."""
    model, _, _ = build("msc_iwslt_de_en", TINY)
    model.eval()
    src, lengths, prev, _ = random_batch()
    out = model.encoder(src, lengths)
    b = out["msc_block_out"]
    assert not torch.allclose(b[0], b[1]) and not torch.allclose(b[1], b[2])
    # Zeroing block 1 only must change the decoder output.
    base = model.decoder(prev, encoder_out=out)[0]
    out2 = dict(out)
    out2["msc_block_out"] = [torch.zeros_like(b[0])] + b[1:]
    assert not torch.allclose(base, model.decoder(prev, encoder_out=out2)[0])


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_incremental_decoding_matches_full(name):
    model, _, _ = build("msc_iwslt_de_en", TINY + ABLATIONS[name])
    model.eval()
    src, lengths, prev, _ = random_batch()
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full = model.decoder(prev, encoder_out=enc)[0]
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                 for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_incremental_decoding_with_beam_reorder():
    """Reordering encoder out + incremental state (what beam search does) equals decoding the reordered batch."""
    model, _, _ = build("msc_iwslt_de_en", TINY)
    model.eval()
    src, lengths, prev, _ = random_batch()
    order = torch.tensor([1, 1, 0, 2])
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        state = {}
        model.decoder(prev[:, :1], encoder_out=enc, incremental_state=state)
        model.decoder(prev[:, :2], encoder_out=enc, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        enc_r = model.encoder.reorder_encoder_out(enc, order)
        step = model.decoder(prev[order][:, :3], encoder_out=enc_r, incremental_state=state)[0]
        ref = model.decoder(prev[order][:, :3], encoder_out=model.encoder(src[order], lengths[order]))[0]
    torch.testing.assert_close(step[:, -1], ref[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("left_pad", [True, False])
def test_batch_and_padding_invariance(left_pad):
    model, _, _ = build("msc_iwslt_de_en", TINY)
    model.eval()
    src, lengths, prev, _ = random_batch(bsz=3, src_len=9, left_pad=left_pad)
    with torch.no_grad():
        batched = model(src, lengths, prev)[0]
        for i in range(3):
            n = int(lengths[i])
            alone_src = src[i, -n:] if left_pad else src[i, :n]
            alone = model(alone_src[None], lengths[i:i + 1], prev[i:i + 1])[0]
            torch.testing.assert_close(batched[i], alone[0], rtol=1e-5, atol=1e-5)


def test_dropout_off_in_eval_and_on_in_train():
    model, _, _ = build("msc_iwslt_de_en", TINY + ["--dropout", "0.3"])
    src, lengths, prev, _ = random_batch()
    model.eval()
    with torch.no_grad():
        a, b = model(src, lengths, prev)[0], model(src, lengths, prev)[0]
    assert torch.equal(a, b)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(src, lengths, prev)[0], model(src, lengths, prev)[0])


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_every_parameter_gets_gradient(name):
    model, _, _ = build("msc_iwslt_de_en", TINY + ABLATIONS[name])
    model.train()
    src, lengths, prev, _ = random_batch()
    model(src, lengths, prev)[0].float().pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing


def test_ablations_change_structure():
    count = {name: n_params(build("msc_iwslt_de_en", TINY + flags)[0]) for name, flags in ABLATIONS.items()}
    assert len({count["full"], count["add"], count["ffn_cell"], count["no_ctx_attn"], count["no_ctx_collab"]}) == 5
    model, _, _ = build("msc_iwslt_de_en", TINY + ABLATIONS["no_ctx_attn"])
    assert all(layer.context_attn is None for layer in model.encoder.layers)
    assert all(layer.context_attn is not None for layer in model.decoder.layers)
    # the FFN cell (table 5; no formula in the paper): the encoder's FFN width inside, as docs/msc.md says
    cell = build("msc_iwslt_de_en", TINY + ABLATIONS["ffn_cell"])[0].encoder.context_cell
    assert cell.fc1.out_features == cell.fc2.in_features == 32 != 4 * 16  # --encoder-ffn-embed-dim, not 4 x C


def test_bf16_padded_rows_finite():
    model, _, _ = build("msc_iwslt_de_en", TINY)
    model.eval().to(torch.bfloat16)
    src, lengths, prev, _ = random_batch(bsz=3, src_len=9)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        out = model.decoder(prev, encoder_out=enc)[0]
    for t in enc["msc_block_out"] + enc["msc_context"] + [out]:
        assert torch.isfinite(t.float()).all()


# ---------------------------------------------------------------------------
# Encoder L2 and gradient-norm logging through the real criterion
# ---------------------------------------------------------------------------


def _criterion_backward(model, task, sample):
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    model.zero_grad()
    loss, sample_size, _ = criterion(model, sample)
    loss.backward()
    return loss.detach(), sample_size, {n: p.grad.clone() for n, p in model.named_parameters()}


def _sample():
    src, lengths, prev, target = random_batch(bsz=4, src_len=8, tgt_len=6)
    return {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(1).sum()), "nsentences": 4}


def test_encoder_l2_touches_only_encoder_weights():
    lam = 1e-2
    plain, task, _ = build("msc_iwslt_de_en", TINY + ["--dropout", "0", "--attention-dropout", "0"])
    reg, _, _ = build("msc_iwslt_de_en", TINY + ["--dropout", "0", "--attention-dropout", "0", "--encoder-l2", str(lam)])
    reg.load_state_dict(plain.state_dict())
    plain.train(), reg.train()
    sample = _sample()
    loss0, size0, g0 = _criterion_backward(plain, task, sample)
    loss1, size1, g1 = _criterion_backward(reg, task, sample)
    assert torch.allclose(loss0, loss1)  # reported loss unchanged; the penalty is logged apart
    params = dict(reg.named_parameters())
    regularised = {n for n, p in params.items() if any(p is q for q in reg.encoder_l2_params)}
    assert regularised and all(n.startswith("encoder.") for n in regularised)
    assert not any("embed_tokens" in n for n in regularised)
    assert any("context_cell" in n for n in regularised) and any("gate_proj" in n for n in regularised)
    for name, p in params.items():
        if name in regularised:
            # fairseq divides by sample_size afterwards: the per-token objective gains LAMBDA*||W||^2
            torch.testing.assert_close((g1[name] - g0[name]) / size1, 2 * lam * p.detach(),
                                       rtol=1e-4, atol=1e-7)
        else:
            torch.testing.assert_close(g1[name], g0[name], rtol=1e-6, atol=1e-8)


def test_grad_norm_logger_writes_per_layer_norms(tmp_path):
    path = tmp_path / "norms.jsonl"
    model, task, _ = build("msc_iwslt_de_en", TINY + ["--dropout", "0", "--attention-dropout", "0", "--log-encoder-grad-norms",
                                                       "--encoder-grad-norms-file", str(path)])
    model.train()
    sample = _sample()
    model.set_num_updates(0)
    _, sample_size, grads = _criterion_backward(model, task, sample)
    model.set_num_updates(1)  # flushes update 1
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 1 and records[0]["update"] == 1
    assert records[0]["loss_weight"] == pytest.approx(sample_size)
    norms = records[0]["grad_norms"]
    assert len(norms) == 6
    for i in range(6):
        prefix = f"encoder.layers.{i}."
        expected = torch.sqrt(sum(g.pow(2).sum() for n, g in grads.items() if n.startswith(prefix))) / sample_size
        assert norms[i] == pytest.approx(float(expected), rel=1e-4)


def test_grad_norm_logger_numbers_its_updates_keeps_its_interval_and_records_only_when_told(tmp_path):
    """The logger alone, on two linear layers: nothing recorded before it is told to record (the model tells it at
    each forward, training or not); each record numbers the update its gradient is for; ``interval`` keeps every
    n-th; a loss weight of 0 (no target token) leaves the norms unscaled, not infinite."""
    from umst_plugin.modules.msc.grad_norms import EncoderGradNormLogger

    torch.manual_seed(0)
    x = torch.randn(3, 2)

    def backward(layers, logger, weight):
        layers.zero_grad()
        layers[1](layers[0](x)).sum().backward()
        logger.add_loss_weight(torch.tensor(weight))
        return [float(torch.sqrt(sum(p.grad.pow(2).sum() for p in layer.parameters()))) for layer in layers]

    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
    idle = EncoderGradNormLogger(layers, str(tmp_path / "idle.jsonl"))  # every update written
    backward(layers, idle, 4.0)  # not told to record yet
    idle.set_update(0)
    idle.recording = False  # e.g. a validation step's model
    backward(layers, idle, 4.0)
    idle.set_update(1)
    assert not (tmp_path / "idle.jsonl").exists()

    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
    path = tmp_path / "norms.jsonl"
    logger = EncoderGradNormLogger(layers, str(path), interval=2)
    logger.recording = True
    for update in range(4):
        logger.set_update(update)
        raw = backward(layers, logger, 0.0 if update == 3 else 4.0)  # the gradient of update number update + 1
        if update == 1:
            expected_2 = [n / 4.0 for n in raw]
    logger.set_update(4)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["update"] for r in records] == [2, 4]
    # the logger sums each parameter's squares in float64, the test all of a layer's in float32: measured 2.0e-8 apart
    assert records[0]["grad_norms"] == pytest.approx(expected_2, rel=1e-6)
    assert records[1]["loss_weight"] == 0.0 and records[1]["grad_norms"] == pytest.approx(raw, rel=1e-6)


# ---------------------------------------------------------------------------
# End to end: fairseq-preprocess -> fairseq-train -> generate -> interactive
# ---------------------------------------------------------------------------


def _loss_term_hooked(lprobs):
    """Whether ``get_normalized_probs`` put PerTokenLossTerm (the L2 penalty and the gradient-norm logger's hook)
    on these log-probabilities."""
    return type(lprobs.grad_fn).__name__ == "PerTokenLossTermBackward"


def test_the_loss_is_hooked_only_in_training_with_a_penalty_or_a_logger(tmp_path):
    """The decoder's log-probabilities are its own (so fairseq-train --compile compiles the loss:
    ``plain_normalized_probs``) except in training, with grad, under --encoder-l2 or --log-encoder-grad-norms; there
    PerTokenLossTerm carries the penalty and the hook, on log-probabilities only, and a net output without its extra
    dict (as fairseq's sequence generator hands one) takes a zero penalty."""
    src, lengths, prev, _ = random_batch()
    quiet = ["--dropout", "0", "--attention-dropout", "0"]
    for flags, hooks in (([], False), (["--encoder-l2", "1e-3"], True),
                         (["--log-encoder-grad-norms", "--encoder-grad-norms-file", str(tmp_path / "n.jsonl")], True)):
        model, _, _ = build("msc_iwslt_de_en", TINY + quiet + flags)
        for training in (True, False):
            model.train(training)
            net_output = model(src, lengths, prev)
            hooked = hooks and training
            assert model.plain_normalized_probs() is not hooked, (flags, training)
            assert _loss_term_hooked(model.get_normalized_probs(net_output, log_probs=True)) is hooked, (flags, training)
            assert not _loss_term_hooked(model.get_normalized_probs(net_output, log_probs=False)), (flags, training)
        model.train()
        no_extra = model.get_normalized_probs((net_output[0], None), log_probs=True)
        assert _loss_term_hooked(no_extra) is hooks
        torch.testing.assert_close(no_extra, model.get_normalized_probs((net_output[0], {}), log_probs=False).log(),
                                   rtol=1e-5, atol=1e-5)


def test_the_grad_norms_file_defaults_to_the_save_dir(tmp_path):
    """``--log-encoder-grad-norms`` without ``--encoder-grad-norms-file`` writes SAVE_DIR/encoder_grad_norms.jsonl
    (the working directory where args carry no save dir)."""
    model, _, _ = build("msc_iwslt_de_en", TINY + ["--log-encoder-grad-norms", "--save-dir", str(tmp_path)])
    assert model.grad_norm_logger.path == os.path.join(str(tmp_path), "encoder_grad_norms.jsonl")
    args = copy.copy(model.args)
    args.save_dir = None
    assert MSCModel(args, model.encoder, model.decoder).grad_norm_logger.path == os.path.join(
        ".", "encoder_grad_norms.jsonl")


def test_the_model_keeps_the_tasks_max_positions_and_asks_no_encoder_states(tmp_path):
    """The source and target lengths are the task's (--max-source/target-positions), 1024 where args carry none;
    and the model's forward asks the encoder for no per-layer states unless told (they would be kept in memory)."""
    model, task, args = build("msc_iwslt_de_en", TINY + ["--max-source-positions", "40", "--max-target-positions", "30"])
    assert model.max_positions() == (40, 30)
    args.max_source_positions = args.max_target_positions = None
    assert MSCModel.build_model(args, task).max_positions() == (1024, 1024)
    seen = []
    model.encoder.register_forward_hook(lambda module, inputs, out: seen.append(len(out["encoder_states"])))
    src, lengths, prev, _ = random_batch()
    model(src, lengths, prev)
    model(src, lengths, prev, return_all_hiddens=True)
    assert seen == [0, 6]


def test_shared_embeddings_take_one_pretrained_file(tmp_path):
    """``--share-all-embeddings`` with ``--encoder-embed-path``: the decoder shares the loaded table, with no
    decoder path or the same one; another decoder path is refused."""
    vectors, other = tmp_path / "vectors.txt", tmp_path / "other.txt"
    vectors.write_text("1 16\nw0 " + " ".join(["0.5"] * 16) + "\n")
    other.write_text(vectors.read_text())
    for decoder_path in ([], ["--decoder-embed-path", str(vectors)]):
        model, task, _ = build("msc_iwslt_de_en", TINY + ["--encoder-embed-path", str(vectors)] + decoder_path)
        assert model.decoder.embed_tokens is model.encoder.embed_tokens
        row = model.encoder.embed_tokens.weight[task.source_dictionary.index("w0")]
        assert torch.equal(row, torch.full((16,), 0.5))
    with pytest.raises(ValueError, match="--share-all-embeddings not compatible with --decoder-embed-path"):
        build("msc_iwslt_de_en", TINY + ["--encoder-embed-path", str(vectors), "--decoder-embed-path", str(other)])


def _grad_norm_records(save_dir):
    with open(os.path.join(save_dir, "encoder_grad_norms.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_end_to_end_translation_task(toy_raw, toy_databin, tmp_path):
    """Plain fairseq `translation` task: train (with --encoder-l2 and grad-norm logging) -> generate -> interactive."""
    import e2e
    save = str(tmp_path / "ckpt")
    lang = ["--source-lang", e2e.SRC, "--target-lang", e2e.TGT]
    log = e2e.train(toy_databin, save, "msc_iwslt_de_en", *TINY, *lang, "--share-all-embeddings",
                    "--encoder-l2", "1e-5", "--log-encoder-grad-norms", task="translation", max_update=40)
    losses = e2e.train_losses(log)
    assert len(losses) >= 5 and all(v == v for v in losses), log[-3000:]
    assert losses[-1] < losses[0] - 0.5, losses
    assert "encoder_l2" in log
    records = _grad_norm_records(save)
    assert [r["update"] for r in records] == list(range(1, 41))  # the 40th is written at exit
    assert all(len(r["grad_norms"]) == 6 and all(n > 0 for n in r["grad_norms"]) for r in records)
    ckpt = os.path.join(save, "checkpoint_last.pt")
    out = e2e.generate(toy_databin, ckpt, *lang, "--max-len-b", "40", task="translation")
    assert "BLEU" in e2e.bleu_line(out)
    e2e.assert_translated_all(out, toy_raw)
    e2e.interactive_on_raw_test_lines(toy_raw, toy_databin, ckpt, task="translation")


@pytest.mark.slow
def test_72_layer_model_trains_and_plot(toy_databin, tmp_path):
    """6 x 12 = 72 encoder layers, toy width: finite loss, gradients reach layer 1, figure-5 PNG."""
    import e2e
    save = tmp_path / "deep"
    deep = ["--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-ffn-embed-dim", "16",
            "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2", "--encoder-blocks", "6", "--encoder-layers-per-block", "12",
            "--log-encoder-grad-norms", "--encoder-l2", "1e-5"]
    log = e2e.train(toy_databin, str(save), "msc_iwslt_de_en", *deep, "--share-all-embeddings",
                    "--log-interval", "1", max_update=4)
    losses = e2e.train_losses(log)
    assert len(losses) >= 3 and all(torch.isfinite(torch.tensor(losses))), log[-3000:]
    records = _grad_norm_records(save)
    assert len(records) >= 3
    for r in records:
        assert len(r["grad_norms"]) == 72
        assert all(n is not None and n > 0 for n in r["grad_norms"])  # layer 1 included
    png = tmp_path / "fig5.png"
    e2e.run([sys.executable, "scripts/plot_grad_norms.py", str(save / "encoder_grad_norms.jsonl"),
             "-o", str(png), "--heatmap"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trains_through_multiscale_translation_task_with_side_inputs():
    """The multiscale_translation task's batches carry src_word_ids/src_word_heads; the task hands an encoder only
    the side inputs its forward names (data/side_inputs.py), so MSC gets none."""
    from umst_dev import dev
    model, task = dev.build_model("msc_iwslt_de_en", dict(encoder_blocks=2, encoder_layers_per_block=2,
                                                          encoder_embed_dim=16, decoder_embed_dim=16,
                                                          encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
                                                          encoder_attention_heads=2, decoder_attention_heads=2,
                                                          encoder_l2=1e-4))
    sample = dev.random_sample(task, bsz=4, src_len=7, tgt_len=6)
    assert "src_word_ids" in sample["net_input"]
    sample = task._strip_side_inputs(sample, [model])
    assert "src_word_ids" not in sample["net_input"] and "src_word_heads" not in sample["net_input"]
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    model.train()
    loss, _, _ = criterion(model, sample)
    loss.backward()
    assert torch.isfinite(loss) and model.encoder.layers[0].self_attn.q_proj.weight.grad is not None
    model.eval()
    with torch.no_grad():
        a = model(**sample["net_input"])[0]
        b = model(**{k: v for k, v in sample["net_input"].items() if not k.startswith("src_word")})[0]
    assert torch.equal(a, b)


@pytest.mark.slow
def test_end_to_end_multiscale_translation_task(toy_raw, toy_databin, tmp_path):
    """toy corpus -> umst/fairseq-preprocess -> fairseq-train (multiscale_translation) -> generate."""
    import e2e
    save = str(tmp_path / "ckpt")
    log = e2e.train(toy_databin, save, "msc_iwslt_de_en", *TINY, "--share-all-embeddings", max_update=20)
    losses = e2e.train_losses(log)
    assert len(losses) >= 3 and all(v == v for v in losses) and losses[-1] < losses[0], log[-3000:]
    ckpt = os.path.join(save, "checkpoint_last.pt")
    out = e2e.generate(toy_databin, ckpt, "--max-len-b", "40")
    assert "BLEU" in e2e.bleu_line(out)
    e2e.assert_translated_all(out, toy_raw)
    # fairseq-interactive through multiscale_translation is covered by the translation-task test above
    # and by tests/test_end_to_end.py; MSC ignores the side inputs it would rebuild.


def test_plain_ablation_computes_fairseqs_prenorm_transformer(float64_softmax):
    """--no-block-collaboration --no-contextual-collaboration is fairseq's pre-norm Transformer in values too, not
    only in size: with the same weights (renamed: the top block's layer norm is fairseq's final encoder layer
    norm), the same output and attention for a padded batch in float64 (also with fairseq's alignment options),
    and the same incremental decoding."""
    import copy

    from umst_plugin.modules.common.lean_ops import use_reference_path

    plain, _, _ = build("msc_iwslt_de_en", TINY + ABLATIONS["plain"])
    n_enc, n_dec = len(plain.encoder.layers), len(plain.decoder.layers)
    ref, _, _ = build("transformer", ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
                                      "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                                      "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
                                      "--encoder-layers", str(n_enc), "--decoder-layers", str(n_dec),
                                      "--encoder-normalize-before", "--decoder-normalize-before"])
    top = f"encoder.block_layer_norms.{plain.encoder.num_blocks - 1}."
    state = {(k.replace(top, "encoder.layer_norm.") if k.startswith(top) else k): v
             for k, v in plain.state_dict().items()}
    assert set(state) - {"encoder.version", "decoder.version"} == set(ref.state_dict()) - {
        "encoder.version", "decoder.version"}
    ref.load_state_dict(state, strict=False)
    plain, ref = plain.double().eval(), ref.double().eval()
    src, lengths, prev, _ = random_batch(bsz=4, src_len=8, tgt_len=6)
    with torch.no_grad():
        out, extra = plain(src, lengths, prev)
        ref_out, ref_extra = ref(src, lengths, prev)
        torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(extra["attn"][0], ref_extra["attn"][0], atol=1e-10, rtol=1e-9)
        ref_enc = ref.encoder(src, lengths)
        for model in (plain, use_reference_path(copy.deepcopy(plain))):  # the lean path and the reference form
            enc = model.encoder(src, lengths)
            for options_ in (dict(alignment_layer=0, alignment_heads=1), dict(full_context_alignment=True)):
                got, got_extra = model.decoder(prev, encoder_out=enc, **options_)
                want, want_extra = ref.decoder(prev, encoder_out=ref_enc, **options_)
                torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)
                torch.testing.assert_close(got_extra["attn"][0], want_extra["attn"][0], atol=1e-10, rtol=1e-9)
        enc = plain.encoder(src, lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(plain.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)[0][:, -1])
        torch.testing.assert_close(torch.stack(steps, 1), ref_out, atol=1e-10, rtol=1e-9)


def test_the_decoder_needs_msc_encoder_out():
    model, _, _ = build("msc_iwslt_de_en", TINY)
    src, lengths, prev, _ = random_batch()
    for encoder_out in (None, {"encoder_out": [torch.zeros(7, 3, 16)]}):
        with pytest.raises(ValueError, match="needs the encoder-out dict of MSCEncoder"):
            model.decoder(prev, encoder_out=encoder_out)
