"""MSMSA (issue 8): scales and windows, head allocation (Eq. 11-12), banded cost, fairseq model, CLIs."""
import os

import pytest
import torch

import e2e
import model_checks as checks
from umst_dev import dev
from umst_plugin.modules.msmsa.windowed_attention import (
    MultiScaleSelfAttention,
    Scale,
    alpha_head_allocation,
    cumulative_ceil_round,
    heads_from_counts,
    parse_head_allocation,
    parse_scale,
    parse_scales,
    windowed_attention,
)

TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
            decoder_ffn_embed_dim=32, encoder_attention_heads=4, decoder_attention_heads=4)
# scales whose windows are smaller than the test sentences, small blocks: the banded path is exercised
TINY_WINDOWS = dict(TINY, msmsa_scales="1,3,N/4,N/2", msmsa_min_block=2)


# ---------------------------------------------------------------- scales


def test_scale_parsing_and_odd_sizes():
    assert parse_scales("1,3,N/16,N/8,N/4") == [Scale("fixed", 1), Scale("fixed", 3), Scale("relative", 16),
                                                 Scale("relative", 8), Scale("relative", 4)]
    assert parse_scale("N") == Scale("relative", 1) and parse_scale("global") == Scale("global")
    # a scale's name (the module's summary, the head maps' titles) is the spelling it parses from
    names = ["1", "3", "N/16", "N", "global"]
    assert [str(scale) for scale in parse_scales(",".join(names))] == names
    with pytest.raises(ValueError, match="odd"):
        parse_scale("4")
    with pytest.raises(ValueError, match="cannot parse"):
        parse_scale("N/x")
    with pytest.raises(ValueError, match="duplicate"):
        parse_scales("3,3")


@pytest.mark.parametrize("spec,length,width", [
    ("N/16", 31, 1), ("N/16", 32, 3), ("N/16", 63, 3), ("N/16", 64, 5), ("N/8", 100, 13), ("N/4", 7, 1),
    ("N/4", 8, 3), ("5", 3, 5), ("1", 50, 1)])
def test_window_width_is_odd_and_follows_own_length(spec, length, width):
    half = parse_scale(spec).half_width(torch.tensor([length]))
    assert 2 * int(half) + 1 == width


# ---------------------------------------------------------------- head allocation


def test_paper_worked_example():
    """alpha = 0.5, 10 heads, 3 layers, five scales: {5,2,2,1,0}, {4,2,2,1,1}, {2,2,2,2,2}."""
    assert alpha_head_allocation(10, 5, 3, 0.5) == [[5, 2, 2, 1, 0], [4, 2, 2, 1, 1], [2, 2, 2, 2, 2]]


def test_rounding_rule_is_cumulative_ceiling():
    # the softmax shares of the example's first layer (step alpha / 1): 4.29, 2.60, 1.58, 0.96, 0.58 heads
    shares = [4.2857, 2.5994, 1.5766, 0.9563, 0.5800]
    assert cumulative_ceil_round(shares, 10) == [5, 2, 2, 1, 0]
    assert [round(s) for s in shares] == [4, 3, 2, 1, 1]  # plain rounding would not give the paper's numbers
    assert cumulative_ceil_round([2.0] * 5, 10) == [2] * 5  # exact shares are kept (no spurious ceil)


@pytest.mark.parametrize("heads,scales,layers,alpha", [(8, 5, 6, 0.5), (16, 5, 6, 1.0), (8, 3, 4, -0.5), (4, 5, 2, 0.0)])
def test_allocation_sums_and_trend(heads, scales, layers, alpha):
    allocation = alpha_head_allocation(heads, scales, layers, alpha)
    assert len(allocation) == layers and all(sum(c) == heads and min(c) >= 0 for c in allocation)
    assert max(allocation[-1]) - min(allocation[-1]) <= 1  # top layer uniform
    if alpha > 0:  # lower layers hold at least as many smallest-scale heads as the top
        assert allocation[0][0] >= allocation[-1][0]
    if alpha < 0:
        assert allocation[0][-1] >= allocation[-1][-1]


def test_explicit_allocation_and_errors():
    assert parse_head_allocation("2,1,1", 3, 4, 2) == [[2, 1, 1], [2, 1, 1]]
    assert parse_head_allocation("2,1,1;0,0,4", 3, 4, 2) == [[2, 1, 1], [0, 0, 4]]
    with pytest.raises(ValueError, match="summing to 4"):
        parse_head_allocation("2,1,2", 3, 4, 2)
    with pytest.raises(ValueError, match="3 layers"):
        parse_head_allocation("2,1,1;2,1,1;2,1,1", 3, 4, 2)


# ---------------------------------------------------------------- windows


def reference_window(scale, sentence_len, pos, causal):
    """Sentence positions the query at sentence position ``pos`` may see (written out from Eq. 6-7)."""
    if scale.kind == "fixed":
        half = (scale.value - 1) // 2
    elif scale.kind == "relative":
        half = ((pos + 1) if causal else sentence_len) // (2 * scale.value)
    else:
        half = sentence_len
    return {p for p in range(sentence_len) if -half <= p - pos <= (0 if causal else half)}


HEAD_SCALES = [parse_scale(s) for s in ("1", "3", "7", "N/8", "N/4", "global")]


def padded_batch(lengths, total, left):
    pad = torch.ones(len(lengths), total, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left:
            pad[b, total - n:] = False
        else:
            pad[b, :n] = False
    return pad


@pytest.mark.parametrize("dense_max_len", [256, 0], ids=["all-heads", "grouped"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("left", [True, False], ids=["left-pad", "right-pad"])
def test_each_head_attends_exactly_its_window(left, causal, dense_max_len):
    torch.manual_seed(0)
    lengths, total = [70, 45, 9], 76
    attn = MultiScaleSelfAttention(24, 6, HEAD_SCALES, causal=causal, min_block=4, dense_max_len=dense_max_len).eval()
    x = torch.randn(total, 3, 24)
    pad = padded_batch(lengths, total, left)
    out, weights = attn(x, key_padding_mask=pad, need_weights=True)
    assert torch.isfinite(out).all()
    for b, n in enumerate(lengths):
        real = (~pad[b]).nonzero().squeeze(1).tolist()
        for h, scale in enumerate(HEAD_SCALES):
            for pos, i in enumerate(real):
                row = weights[b, h, i]
                seen = {real.index(j) for j in row.nonzero().squeeze(1).tolist()}
                assert seen == reference_window(scale, n, pos, causal), (b, str(scale), pos)
                assert abs(float(row.sum()) - 1) < 1e-5


def naive_attention(q, k, v, scale, pad, causal):
    out = torch.zeros_like(q)
    for b in range(q.size(0)):
        real = (~pad[b]).nonzero().squeeze(1).tolist()
        for pos, i in enumerate(real):
            keys = [real[p] for p in sorted(reference_window(scale, len(real), pos, causal))]
            probs = (q[b, :, i:i + 1] @ k[b, :, keys].transpose(-1, -2)).softmax(-1)
            out[b, :, i] = (probs @ v[b, :, keys])[:, 0]
    return out


@pytest.mark.parametrize("spec", ["1", "3", "9", "N/16", "N/4", "N/2", "N", "global"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_banded_and_dense_paths_match_naive_attention(spec, causal):
    torch.manual_seed(1)
    lengths, total = [100, 61, 33, 5], 100
    pad = padded_batch(lengths, total, left=True)
    q, k, v = (torch.randn(4, 2, total, 8, dtype=torch.float64) for _ in range(3))
    expected = naive_attention(q, k, v, parse_scale(spec), pad, causal)
    for need_weights in (False, True):
        out, _ = windowed_attention(q, k, v, parse_scale(spec), pad, causal, need_weights=need_weights, min_block=4)
        out = out.permute(1, 2, 0, 3)
        for b in range(4):
            real = ~pad[b]
            torch.testing.assert_close(out[b][:, real], expected[b][:, real])


@pytest.mark.parametrize("dense_max_len", [256, 0], ids=["all-heads", "grouped"])
def test_padding_side_and_batch_do_not_change_a_sentence(dense_max_len):
    torch.manual_seed(2)
    attn = MultiScaleSelfAttention(24, 6, HEAD_SCALES, min_block=4, dense_max_len=dense_max_len).eval()
    sentence = torch.randn(40, 1, 24)
    alone, _ = attn(sentence)
    for left in (True, False):
        x = torch.randn(64, 3, 24)
        pad = padded_batch([64, 40, 12], 64, left)
        x[~pad[1], 1] = sentence[:, 0]
        out, _ = attn(x, key_padding_mask=pad)
        torch.testing.assert_close(out[~pad[1], 1], alone[:, 0], atol=1e-5, rtol=1e-4)


def test_incremental_decoding_matches_full_module():
    torch.manual_seed(3)
    attn = MultiScaleSelfAttention(24, 6, HEAD_SCALES, causal=True, min_block=4).eval()
    x = torch.randn(50, 2, 24)
    full, _ = attn(x)
    cache, steps = {}, []
    for t in range(50):
        steps.append(attn(x[t:t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-4)
    assert cache["prev_key"].shape == (2, 6, 50, 4)


def test_incremental_decoding_of_a_left_padded_batch_matches_full_module():
    """Step by step with each step's key padding mask (a left-padded prefix): the cache keeps the padding of
    the steps before, so relative windows count the sentence's own positions as in full decoding."""
    torch.manual_seed(4)
    attn = MultiScaleSelfAttention(24, 6, HEAD_SCALES, causal=True, min_block=4).eval()
    x = torch.randn(40, 2, 24)
    pad = torch.zeros(2, 40, dtype=torch.bool)
    pad[1, :9] = True
    full, _ = attn(x, key_padding_mask=pad)
    cache, steps = {}, []
    for t in range(40):
        steps.append(attn(x[t:t + 1], key_padding_mask=pad[:, t:t + 1], cache=cache)[0])
    steps = torch.cat(steps)
    torch.testing.assert_close(steps[:, 0], full[:, 0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(steps[9:, 1], full[9:, 1], atol=1e-5, rtol=1e-4)
    assert torch.equal(cache["prev_key_padding_mask"], pad)


def _peak_bytes(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for event in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def test_small_windows_cost_grows_with_window_not_sentence():
    """Forward + backward memory of fixed-window heads is linear in N (no N x N score or mask)."""
    torch.manual_seed(4)
    attn = MultiScaleSelfAttention(16, 2, [parse_scale("3"), parse_scale("9")]).train()

    def step(length):
        x = torch.randn(length, 1, 16, requires_grad=True)
        return lambda: attn(x)[0].sum().backward()

    small, large = _peak_bytes(step(1024)), _peak_bytes(step(4096))
    dense_scores = 2 * 4096 * 4096 * 4  # what one fp32 N x N score matrix per head would take
    assert large < dense_scores / 20, large
    assert large / small < 4.6, (small, large)  # ~4x tokens -> ~4x memory, not 16x


# ---------------------------------------------------------------- fairseq model


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_parameter_count_equals_transformer():
    msmsa, _ = dev.build_model("msmsa_base")
    transformer, _ = dev.build_model("transformer", {"encoder_normalize_before": True, "decoder_normalize_before": True})
    assert n_params(msmsa) == n_params(transformer)
    with_decoder, _ = dev.build_model("msmsa_base", {"msmsa_decoder": True})
    assert n_params(with_decoder) == n_params(transformer)
    # the heads' window rule is rebuilt from the arch's options: the state dict (a checkpoint) holds what the
    # transformer's holds, so checkpoints load whatever the rule's layout becomes
    assert with_decoder.state_dict().keys() - dict(with_decoder.named_parameters()).keys() == \
        transformer.state_dict().keys() - dict(transformer.named_parameters()).keys()
    # initialised as fairseq's MultiheadAttention: the output projection's bias at 0
    attn = with_decoder.encoder.layers[0].self_attn
    assert attn.out_proj.bias.abs().sum() == 0 and attn.q_proj.bias.abs().sum() > 0
    big_overrides = {"encoder_layers": 1, "decoder_layers": 1}  # big widths, fewer layers to keep the test light
    big, _ = dev.build_model("msmsa_big", big_overrides)
    big_transformer, _ = dev.build_model("transformer_vaswani_wmt_en_de_big", {
        **big_overrides, "encoder_normalize_before": True, "decoder_normalize_before": True})
    assert n_params(big) == n_params(big_transformer)
    assert big.encoder.layers[0].self_attn.num_heads == 16 and big.encoder.layers[0].embed_dim == 1024


def test_arch_defaults_and_layer_allocation():
    model, _ = dev.build_model("msmsa_base", {"msmsa_alpha": 0.5})
    assert model.encoder.layers[0].normalize_before and model.decoder.layers[0].normalize_before
    allocation = alpha_head_allocation(8, 5, 6, 0.5)
    scales = parse_scales("1,3,N/16,N/8,N/4")
    for layer, counts in zip(model.encoder.layers, allocation):
        assert layer.self_attn.head_scales == heads_from_counts(scales, counts)
    assert type(model.decoder.layers[0].self_attn).__name__ == "MultiheadAttention"  # standard decoder
    explicit, _ = dev.build_model("msmsa_base", {**TINY, "msmsa_head_allocation": "4,0,0,0,0;0,0,0,0,4"})
    assert [layer.self_attn.head_scales for layer in explicit.encoder.layers] == [
        [Scale("fixed", 1)] * 4, [Scale("relative", 4)] * 4]


def test_the_block_and_dense_length_options_reach_every_multiscale_attention():
    """--msmsa-min-block (default 16) and --msmsa-dense-max-len (default DEFAULT_DENSE_MAX_LEN; 0, always banded, kept)
    reach the encoder's attention and, with --msmsa-decoder, the decoder's."""
    from umst_plugin.modules.msmsa.windowed_attention import DEFAULT_DENSE_MAX_LEN

    def options(overrides):
        model, _ = dev.build_model("msmsa_base", {**TINY, "msmsa_decoder": True, **overrides})
        layers = list(model.encoder.layers) + list(model.decoder.layers)
        return {(layer.self_attn.min_block, layer.self_attn.dense_max_len) for layer in layers}

    assert options({}) == {(16, DEFAULT_DENSE_MAX_LEN)}
    assert options({"msmsa_min_block": 4, "msmsa_dense_max_len": 0}) == {(4, 0)}


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="odd"):
        dev.build_model("msmsa_base", {**TINY, "msmsa_scales": "1,2"})
    with pytest.raises(ValueError, match="summing to 4"):
        dev.build_model("msmsa_base", {**TINY, "msmsa_head_allocation": "1,1,1,0,0"})


def test_no_ffn_layer_is_eq_10():
    model, task = dev.build_model("msmsa_base", {**TINY, "msmsa_no_ffn": True})
    model.eval()
    layer = model.encoder.layers[0]
    assert layer.fc1 is None and layer.fc2 is None
    x = torch.randn(7, 2, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :3] = True
    attn, _ = layer.self_attn(query=layer.self_attn_layer_norm(x), key=None, value=None, key_padding_mask=pad)
    torch.testing.assert_close(layer(x, pad), x + torch.relu(attn))
    transformer, _ = dev.build_model("transformer", {**TINY, "encoder_normalize_before": True,
                                                     "decoder_normalize_before": True})
    ffn = sum(p.numel() for n, p in transformer.encoder.named_parameters() if ".fc" in n or "final_layer_norm" in n)
    assert n_params(model) == n_params(transformer) - ffn


@pytest.mark.parametrize("overrides", [TINY_WINDOWS, dict(TINY_WINDOWS, msmsa_decoder=True),
                                       dict(TINY_WINDOWS, msmsa_decoder=True, msmsa_dense_max_len=0)],
                         ids=["encoder", "encoder+decoder", "encoder+decoder-grouped"])
def test_model_invariance_and_incremental(overrides):
    for left in (True, False):
        checks.check_padding_invariance("msmsa_base", overrides, left_pad_source=left)
    checks.check_incremental_decoding("msmsa_base", overrides)
    checks.check_every_parameter_gets_gradient("msmsa_base", overrides)


def test_decoder_heads_are_causal_multiscale():
    model, task = dev.build_model("msmsa_base", dict(TINY_WINDOWS, msmsa_decoder=True,
                                                     msmsa_decoder_scales="1,N/2"))
    attn = model.decoder.layers[0].self_attn
    assert attn.causal and set(attn.head_scales) <= {Scale("fixed", 1), Scale("relative", 2)}
    model.eval()
    sample = dev.random_sample(task, 2, 6, 9)
    prev = sample["net_input"]["prev_output_tokens"]
    inputs = dev.model_inputs(model, sample)
    with torch.no_grad():
        full = model(**inputs)[0]
        changed = prev.clone()
        changed[:, -1] = 5  # a later token must not change earlier outputs
        inputs["prev_output_tokens"] = changed
        other = model(**inputs)[0]
    torch.testing.assert_close(full[:, :-1], other[:, :-1])


def test_the_attention_follows_fairseqs_call_signature():
    """Weights only when asked (the layers never ask), averaged over heads unless each head's are asked for; the
    arguments fairseq's MultiheadAttention takes and multi-scale self-attention cannot honour are refused."""
    model, _ = dev.build_model("msmsa_base", TINY_WINDOWS)
    model.double().eval()  # float64: the weighted path computes the outputs by another kernel
    attn = model.encoder.layers[0].self_attn
    x, other = torch.randn(7, 2, 16, dtype=torch.float64), torch.randn(7, 2, 16, dtype=torch.float64)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :3] = True
    with torch.no_grad():
        out, weights = attn(x, key_padding_mask=pad)
        assert weights is None
        out_averaged, averaged = attn(x, key_padding_mask=pad, need_weights=True)
        out_each, each = attn(x, key_padding_mask=pad, need_head_weights=True)
    assert averaged.shape == (2, 7, 7) and each.shape == (2, 4, 7, 7)
    torch.testing.assert_close(averaged, each.mean(dim=1), rtol=0, atol=0)
    # measured: 2.2e-16 (one float64 rounding) between the two kernels
    torch.testing.assert_close(out_averaged, out, rtol=0, atol=1e-14)
    torch.testing.assert_close(out_each, out, rtol=0, atol=1e-14)
    for bad in (dict(key=other), dict(value=other), dict(key=x, value=x, static_kv=True)):
        with pytest.raises(ValueError, match="self-attention only"):
            attn(x, **bad)
    with pytest.raises(ValueError, match="pre-softmax"):
        attn(x, before_softmax=True)
    with pytest.raises(ValueError, match="attn_mask"):
        attn(x, attn_mask=torch.zeros(7, 7, dtype=torch.float64))


def test_the_encoder_heads_look_both_ways():
    """The encoder's multi-scale heads are centred windows (the paper's encoder), not the decoder's causal ones: a
    later token changes an earlier position's output."""
    model, task = dev.build_model("msmsa_base", TINY_WINDOWS)
    model.eval()
    assert not any(layer.self_attn.causal for layer in model.encoder.layers)
    src = dev.random_sample(task, 2, 6, 5)["net_input"]["src_tokens"]
    lengths = torch.full((2,), src.size(1))
    changed = src.clone()
    changed[:, 1] = 5 if int(src[0, 1]) != 5 else 6
    with torch.no_grad():
        before = model.encoder(src, lengths)["encoder_out"][0]
        after = model.encoder(changed, lengths)["encoder_out"][0]
    assert (before[0] - after[0]).abs().max() > 1e-3


def test_layers_built_directly_take_the_papers_defaults():
    """Built without the options: the encoder layer keeps its FFN (Eq. 10's layer is the ``--msmsa-no-ffn``
    ablation), the decoder layer its encoder attention; the decoder's self-attention is causal, and refuses
    fairseq's bias_kv and zero_attn each alone."""
    from umst_plugin.models.msmsa.encoder import transformer_config
    from umst_plugin.modules.msmsa.layer import MSMSADecoderLayer, MSMSAEncoderLayer
    model, _ = dev.build_model("msmsa_base", dict(TINY_WINDOWS, msmsa_decoder=True))
    scales = model.encoder.layers[0].head_scales
    encoder_layer = MSMSAEncoderLayer(model.encoder.layers[0].cfg, scales)
    assert encoder_layer.fc1 is not None and not encoder_layer.no_ffn and not encoder_layer.self_attn.causal
    decoder_cfg = transformer_config(model.decoder.args)
    decoder_layer = MSMSADecoderLayer(decoder_cfg, scales)
    assert decoder_layer.encoder_attn is not None and decoder_layer.self_attn.causal
    assert decoder_layer.build_self_attention(16, decoder_cfg).causal
    for option in ("add_bias_kv", "add_zero_attn"):
        with pytest.raises(ValueError, match="bias_kv, zero_attn"):
            decoder_layer.build_self_attention(16, decoder_cfg, **{option: True})


def test_bf16_padded_rows_finite():
    checks.check_low_precision("msmsa_base", dict(TINY_WINDOWS, msmsa_decoder=True), torch.bfloat16, "cpu")


# ---------------------------------------------------------------- command line


@pytest.mark.slow
def test_train_generate_interactive(toy_raw, toy_databin, tmp_path):
    save_dir = str(tmp_path / "ckpt")
    log = e2e.train(toy_databin, save_dir, "msmsa_base", *e2e.TINY, "--share-all-embeddings", "--msmsa-decoder",
                    "--msmsa-scales", "1,3,N/4,N/2", max_update=30)
    losses = e2e.train_losses(log)
    assert len(losses) >= 4 and losses[-1] < losses[0] - 0.5, log[-3000:]
    ckpt = os.path.join(save_dir, "checkpoint_last.pt")
    out = e2e.generate(toy_databin, ckpt)
    assert "BLEU" in e2e.bleu_line(out)
    e2e.assert_translated_all(out, toy_raw)
    e2e.interactive_on_raw_test_lines(toy_raw, toy_databin, ckpt)


@pytest.mark.parametrize("dense_max_len", [256, 0], ids=["one fused call", "per scale"])
@pytest.mark.parametrize("specs", [("1", "N/4"), ("1", "1")])
def test_q_and_k_projections_always_get_a_gradient(specs, dense_max_len):
    """On a batch too short for any window to exceed 1 token, q/k still take part (DDP needs every parameter),
    in one fused call and per group of heads sharing a scale (longer batches, where a layer of scale-1 heads
    only must not skip attention)."""
    attn = MultiScaleSelfAttention(8, 2, [parse_scale(s) for s in specs], dense_max_len=dense_max_len).train()
    attn(torch.randn(5, 2, 8))[0].sum().backward()
    assert attn.q_proj.weight.grad is not None and attn.k_proj.weight.grad is not None


@pytest.mark.parametrize("need_weights", [False, True])
def test_scale_one_heads_drop_their_weight_in_training_only(need_weights):
    """A scale-1 head's output is its value (softmax over one key is 1): attention dropout drops that single
    weight in training (the output 0 or the value / (1 - p)), and never in evaluation."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 40, 4) for _ in range(3))
    value = v.permute(2, 0, 1, 3)
    out, weights = windowed_attention(q, k, v, parse_scale("1"), dropout_p=0.5, training=False,
                                      need_weights=need_weights)
    assert torch.equal(out, value)
    out, weights = windowed_attention(q, k, v, parse_scale("1"), dropout_p=0.5, training=True,
                                      need_weights=need_weights)
    kept = out.ne(0).all(-1)
    assert 0.3 < kept.float().mean() < 0.7 and out.eq(0).all(-1).logical_or(kept).all()
    torch.testing.assert_close(out[kept], 2 * value[kept], rtol=0, atol=0)
    if need_weights:  # B x G x T x T: the kept weight on the diagonal
        assert torch.equal(weights, torch.diag_embed(2.0 * kept.permute(1, 2, 0).float()))
