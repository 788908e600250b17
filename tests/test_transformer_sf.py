"""TranSFormer (transformer_sf): character table, branch modules, model invariances, ablation flags."""

import argparse
import math

import pytest
import torch

import umst_plugin  # noqa: F401  (registers the architectures)
from umst_dev import dev
from fairseq import options
from fairseq.data import Dictionary
from fairseq.tasks.translation import TranslationTask

from umst_plugin.modules.transformer_sf.char_table import CHAR_PAD, CHAR_SEP, CharTable
from umst_plugin.modules.transformer_sf.fast_attention import BoundaryRelativeSelfAttention, boundary_band
from umst_plugin.models.transformer_sf.config import (SlowFastConfig, parse_interaction_layers, slowfast_config_from_args,
                                                      slowfast_defaults)
from umst_plugin.modules.transformer_sf.layer import SlowFastEncoderStack, _num_groups
from umst_plugin.modules.transformer_sf.fusion import chars_to_tokens, tokens_to_chars

TINY = {
    "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32, "encoder_attention_heads": 2, "encoder_layers": 2,
    "decoder_embed_dim": 16, "decoder_ffn_embed_dim": 32, "decoder_attention_heads": 2, "decoder_layers": 2,
    "fast_embed_dim": 8, "fast_ffn_embed_dim": 16, "fast_attention_heads": 2,
}
BPE_SYMBOLS = ["the", "new@@", "est", "car", "ca@@", "r@@", "s", "über", "stra@@", "ße", "é@@", "t", "naïve",
               "日本@@", "語", "a", "b@@", "c"]
SPM_SYMBOLS = ["\u2581the", "\u2581new", "est", "\u2581car", "s", "\u2581über", "\u2581stra", "ße", "\u2581",
               "\u2581日本", "語", "\u2581naïve", "é"]


def make_dict(symbols):
    d = Dictionary()
    for s in symbols:
        d.add_symbol(s)
    d.finalize(padding_factor=8)
    return d


def build(arch="transformer_sf_base", overrides=None, dictionary=None, tiny=True):
    """Build a registered arch through fairseq's real argument parsing."""
    dictionary = dictionary or make_dict(BPE_SYMBOLS)
    settings = dict(TINY if tiny else {})
    settings.update(overrides or {})
    argv = ["/dev/null", "--task", "translation", "--arch", arch, "-s", "src", "-t", "tgt"]
    argv += dev.overrides_to_argv(settings)
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(0)
    model = TranslationTask(args, dictionary, dictionary).build_model(args)
    return model, dictionary


def encode(d, sentence):
    return [d.index(s) for s in sentence.split()] + [d.eos()]


def batch_of(d, sentences, left_pad=True):
    rows = [encode(d, s) for s in sentences]
    width = max(map(len, rows))
    out = torch.full((len(rows), width), d.pad(), dtype=torch.long)
    for i, r in enumerate(rows):
        if left_pad:
            out[i, width - len(r):] = torch.tensor(r)
        else:
            out[i, : len(r)] = torch.tensor(r)
    return out


SENTENCES = ["the new@@ est car", "über stra@@ ße naïve", "ca@@ r@@ s é@@ t the 日本@@ 語 a b@@ c"]


# ----------------------------------------------------------------------------- character table
@pytest.mark.parametrize("left_pad", [True, False])
def test_char_table_subword_nmt_round_trip(left_pad):
    d = make_dict(BPE_SYMBOLS)
    table = CharTable.from_dictionary(d)
    assert table.style == "subword-nmt"
    tokens = batch_of(d, SENTENCES, left_pad=left_pad)
    cb = table(tokens)
    for row, sentence in enumerate(SENTENCES):
        words = sentence.replace("@@ ", "").split() + ["</s>"]
        assert table.decode_words(cb.chars[row].tolist()) == words  # chars -> words
        assert table.resegment(cb, row) == sentence.split() + ["</s>"]  # chars -> subwords
    # word ids follow the task's definition: 1-based words, </s> its own word, 0 at padding
    expected = [1, 2, 2, 3, 4]
    got = cb.token_word_ids[0][tokens[0] != d.pad()].tolist()
    assert got == expected


def test_char_table_sentencepiece_round_trip_non_ascii():
    d = make_dict(SPM_SYMBOLS)
    table = CharTable.from_dictionary(d)
    assert table.style == "sentencepiece"
    sentences = ["\u2581the \u2581new est \u2581car s", "\u2581über \u2581stra ße \u2581日本 語 \u2581naïve é"]
    cb = table(batch_of(d, sentences))
    assert table.decode_chars(cb.chars[0].tolist()) == "the newest cars </s>"
    assert table.decode_chars(cb.chars[1].tolist()) == "über straße 日本語 naïveé </s>"
    for row, sentence in enumerate(sentences):
        assert table.resegment(cb, row) == sentence.split() + ["</s>"]
    # a bare "▁" starts a new word but carries no characters
    cb = table(batch_of(d, ["\u2581the \u2581 é"]))
    assert table.decode_chars(cb.chars[0].tolist()) == "the é </s>"


def test_char_table_plain_words_and_marker_like_symbols():
    """A vocabulary without markers is read as plain words, one word per token (as the task reads it: subword-nmt,
    where nothing continues); a long number is characters, not one of fairseq's ``madeupwordNNNN`` fillers; a bare
    ``@@`` joins the next token as the task's word boundaries read it, so the table's word ids are the task's."""
    from umst_plugin.data.word_boundaries import SUBWORD_NMT, word_ids_from_pieces

    d = make_dict(["the", "car", "12345678901", "madeupword0007"])
    table = CharTable.from_dictionary(d)
    assert table.style == "subword-nmt"
    cb = table(batch_of(d, ["the 12345678901 car the"]))
    assert table.decode_words(cb.chars[0].tolist()) == ["the", "12345678901", "car", "the", "</s>"]
    assert cb.token_word_ids[0].tolist() == [1, 2, 3, 4, 5]
    assert int(table.token_num_chars[d.index("12345678901")]) == 11
    assert int(table.token_num_chars[d.index("madeupword0007")]) == 1  # a filler is one opaque character
    d = make_dict(BPE_SYMBOLS + ["@@"])
    table = CharTable.from_dictionary(d)
    for sentence in ("the @@ car", "ca@@ @@ r@@ s a"):
        task_ids = word_ids_from_pieces(sentence.split(), SUBWORD_NMT)
        assert table(batch_of(d, [sentence])).token_word_ids[0].tolist() == task_ids + [task_ids[-1] + 1]  # </s>
    assert table.decode_words(table(batch_of(d, ["the @@ car"])).chars[0].tolist()) == ["the", "car", "</s>"]


def test_char_table_groups_and_alignment():
    d = make_dict(BPE_SYMBOLS)
    table = CharTable.from_dictionary(d)
    tokens = batch_of(d, ["the ca@@ r@@ s"], left_pad=True)
    cb = table(tokens)
    chars = cb.chars[0].tolist()
    assert chars.count(CHAR_SEP) == 2 and CHAR_PAD not in chars
    # characters of word w share group 2w; each separator is a singleton 2w-1
    assert cb.char_groups[0].tolist() == [2, 2, 2, 3, 4, 4, 4, 4, 5, 6]
    # each character points at its subword's column in src_tokens (1-based)
    assert cb.char_token_index[0].tolist() == [1, 1, 1, 2, 2, 2, 3, 4, 5, 5]
    with_pad = table(batch_of(d, ["the ca@@ r@@ s", "the new@@ est car the car a"]))
    assert torch.equal(with_pad.chars[0, : len(chars)], cb.chars[0])
    assert torch.all(with_pad.chars[0, len(chars):] == CHAR_PAD)


def test_char_table_is_saved_in_state_dict():
    model, d = build()
    state = model.state_dict()
    for name in ("token_chars", "token_num_chars", "token_joins_prev", "token_joins_next", "char_codepoints"):
        assert f"encoder.char_table.{name}" in state
    # Same shapes, different content (one filler swapped for "zz"): the checkpoint's table wins.
    other_model, _ = build(dictionary=make_dict(BPE_SYMBOLS + ["zz"]))
    assert not torch.equal(other_model.encoder.char_table.char_codepoints, model.encoder.char_table.char_codepoints)
    other_model.load_state_dict(state)
    assert torch.equal(other_model.encoder.char_table.char_codepoints, model.encoder.char_table.char_codepoints)
    assert torch.equal(other_model.encoder.char_table.token_chars, model.encoder.char_table.token_chars)
    # A character vocabulary of another size cannot be loaded silently.
    bigger, _ = build(dictionary=make_dict(BPE_SYMBOLS + ["zq"]))
    with pytest.raises(RuntimeError, match="char_codepoints"):
        bigger.load_state_dict(state)


def test_checkpoints_hold_parameters_and_the_char_table_only():
    """Working buffers (the reassociated cross-attention's column of ones) stay out of the state dict, so that a
    checkpoint holds the parameters, the character table and fairseq's version entry, and nothing a model built
    by another version of the code might lack."""
    model, _ = build()
    assert any(m.reassociate for m in model.modules() if hasattr(m, "reassociate"))  # the buffer is there
    parameters = dict(model.named_parameters())
    extra = sorted(k for k in model.state_dict() if k not in parameters)
    assert extra == ["decoder.version"] + [f"encoder.char_table.{name}" for name in (
        "char_codepoints", "token_chars", "token_joins_next", "token_joins_prev", "token_num_chars")]


# ----------------------------------------------------------------------------- modules
def dense_boundary_attention(attn, x, mask, groups):
    """Reference: explicit L x L relative index matrix, from the definition."""
    length, batch, dim = x.shape
    h, hd, k = attn.num_heads, attn.head_dim, attn.max_distance
    q = attn.q_proj(x).view(length, batch, h, hd).permute(1, 2, 0, 3) * attn.scaling
    kk = attn.k_proj(x).view(length, batch, h, hd).permute(1, 2, 0, 3)
    v = attn.v_proj(x).view(length, batch, h, hd).permute(1, 2, 0, 3)
    out = torch.zeros(batch, h, length, hd, dtype=x.dtype)
    for b in range(batch):
        for i in range(length):
            logits = []
            for j in range(length):
                e = (q[b, :, i] * kk[b, :, j]).sum(-1)  # per head
                rel = None
                if groups[b, i] > 0 and groups[b, i] == groups[b, j] and abs(j - i) <= k:
                    rel = j - i + k
                    e = e + (q[b, :, i] * attn.rel_keys[rel]).sum(-1)
                logits.append((e, rel, j))
            scores = torch.stack([e for e, _, _ in logits], -1).masked_fill(mask[b].view(1, -1), float("-inf"))
            w = scores.softmax(-1)
            for (e, rel, j) in logits:
                val = v[b, :, j] + (attn.rel_values[rel] if rel is not None else 0)
                out[b, :, i] += w[:, j : j + 1] * val
    return attn.out_proj(out.permute(2, 0, 1, 3).reshape(length, batch, dim))


def test_boundary_relative_attention_matches_dense_reference():
    torch.manual_seed(0)
    attn = BoundaryRelativeSelfAttention(8, 2, max_distance=3).double().eval()
    groups = torch.tensor([[2, 2, 2, 2, 2, 3, 4, 4, 0], [2, 2, 3, 4, 4, 4, 4, 4, 4]])
    mask = groups.eq(0)
    x = torch.randn(9, 2, 8, dtype=torch.float64)
    torch.testing.assert_close(attn(x, mask, groups), dense_boundary_attention(attn, x, mask, groups))


def test_boundary_band_masks_cross_word_and_far_pairs():
    groups = torch.tensor([[2, 2, 2, 2, 2, 3, 4]])
    cols, valid = boundary_band(groups, 3)
    # position 0: offsets -3..3 -> only 0..3 in range and same word
    assert valid[0, 0].tolist() == [False, False, False, True, True, True, True]
    # separator (singleton group 3) only relates to itself
    assert valid[0, 5].tolist() == [False, False, False, True, False, False, False]
    assert boundary_band(groups, 3, use_boundary=False)[1][0, 5].sum() == 5  # columns 2..6 (7, 8 are out of range)


@pytest.mark.parametrize("use_boundary", [True, False])
def test_boundary_band_gives_no_pair_with_padding(use_boundary):
    """Group 0 is padding: neither a padded query nor a padded key gets a relative term, whatever the words."""
    groups = torch.tensor([[0, 0, 2, 2, 3], [2, 2, 3, 0, 0]])
    cols, valid = boundary_band(groups, 2, use_boundary)
    key_groups = torch.gather(groups, 1, cols.reshape(2, -1)).view_as(cols)
    assert not valid[groups.eq(0)].any()  # padded queries
    assert not valid[key_groups.eq(0)].any()  # padded keys
    assert valid[0, 2].tolist() == [False, False, True, True, use_boundary is False]  # real pairs in range stay


def test_the_group_count_is_the_encoders_bound_without_reading_the_ids():
    """``_num_groups``: the static bound the encoder passes, without reading the ids (on a GPU that read is a
    host-device sync in every layer: meta tensors here, which cannot be read); a direct caller's ids give max + 1."""
    meta_ids = torch.empty(2, 5, dtype=torch.long, device="meta")
    assert _num_groups({"ids": meta_ids, "bound": 7}, "ids", "bound") == 7
    assert _num_groups({"ids": torch.tensor([[0, 3, 1]])}, "ids", "bound") == 4
    assert _num_groups({"ids": torch.tensor([[0, 3, 1]]), "bound": None}, "ids", "bound") == 4
    assert _num_groups({"ids": torch.zeros(0, 3, dtype=torch.long)}, "ids", "bound") == 1


def test_resampling_between_granularities():
    x = torch.arange(12.0).view(6, 1, 2)  # 6 characters
    index = torch.tensor([[1, 1, 2, 2, 2, 0]])
    down = chars_to_tokens(x, index, num_tokens=3)
    torch.testing.assert_close(down[:, 0], torch.tensor([[1.0, 2.0], [6.0, 7.0], [0.0, 0.0]]))
    up = tokens_to_chars(down, index)
    torch.testing.assert_close(up[:, 0, 0], torch.tensor([1.0, 1.0, 6.0, 6.0, 6.0, 0.0]))


def test_interaction_layer_specs():
    assert parse_interaction_layers("all", 6) == frozenset(range(1, 7))
    assert parse_interaction_layers("last", 6) == {6}
    assert parse_interaction_layers("bottom3", 6) == {1, 2, 3}
    assert parse_interaction_layers("top3", 6) == {4, 5, 6}
    assert parse_interaction_layers("every2", 6) == {1, 3, 5}
    assert parse_interaction_layers("2,4", 6) == {2, 4}
    assert parse_interaction_layers("none", 6) == frozenset()
    assert parse_interaction_layers("1,6", 6) == {1, 6}  # both ends of 1..N
    assert parse_interaction_layers("2, 3,", 6) == {2, 3}
    assert parse_interaction_layers("bottom3", 2) == parse_interaction_layers("top3", 2) == {1, 2}
    for spec in ("0,7", "0", "7", ","):
        with pytest.raises(ValueError, match="1..6"):
            parse_interaction_layers(spec, 6)
    with pytest.raises(ValueError, match="comma list"):
        parse_interaction_layers("middle", 6)


def test_the_stack_config_defaults_are_the_base_archs():
    """``SlowFastConfig()`` (what a stack built directly gets) is transformer_sf_base's configuration, both from
    fairseq's parser and from bare args that name no TranSFormer option (older checkpoints, tools); those archs'
    decoders are pre-norm, as their encoders."""
    parsed = options.parse_args_and_arch(options.get_training_parser(), [
        "/nonexistent", "--task", "translation", "--arch", "transformer_sf_base", "-s", "src", "-t", "tgt"])
    bare = argparse.Namespace()
    slowfast_defaults(bare)
    for args in (parsed, bare):
        assert slowfast_config_from_args(args) == SlowFastConfig()
        assert args.encoder_normalize_before and args.decoder_normalize_before


def test_unread_fast_sublayers_are_not_built():
    stack = SlowFastEncoderStack(SlowFastConfig(slow_dim=16, slow_ffn_dim=32, slow_heads=2, fast_dim=8,
                                                fast_ffn_dim=16, fast_heads=2, layers=4,
                                                interaction_layers=frozenset({2})))
    assert stack.layers[0].fast_fusion is None and stack.layers[0].fast_ffn is not None  # no interaction at 1
    assert stack.layers[1].fast_attn is not None and stack.layers[1].fast_ffn is None  # read by slow CGA only
    assert all(layer.fast_attn is None for layer in stack.layers[2:])
    assert stack.layers[1].slow_fusion is not None and stack.layers[0].slow_fusion is None


def _fig3_block(layer, x_s, x_f, side):
    """One block as the paper writes it (section 3, fig. 3; pre-norm throughout), from the layer's own sub-modules:

        x_f = GCN_f(x_f; A_f);  x_f = x_f + SAN_rel(LN(x_f))      x_s = x_s + SAN(LN(x_s))
        x_s' = x_s + CGA_s(LN(x_s), LN(x_f));  x_f' = x_f + CGA_f(LN(x_f), LN(x_s))   (both read the post-SAN states)
        x_b = x_b + FFN(LN(x_b)) for each branch, FFN(h) = W_2 ReLU(W_1 h + b_1) + b_2

    (the cross-granularity modules take the two states and norm them themselves: ``self_layer_norm``,
    ``other_layer_norm``). With ``--sf-slow-gcn every-layer`` each block first runs x_s = GCN_s(x_s; A_s)."""
    if layer.slow_gcn is not None:
        x_s = layer.slow_gcn(x_s, side["slow_groups"], time_first=True)
    x_f = layer.fast_gcn(x_f, side["fast_gcn_groups"], time_first=True)
    x_f = x_f + layer.fast_attn(layer.fast_attn_norm(x_f), side["fast_padding_mask"], side["fast_pe_groups"],
                                use_boundary=side["fast_pe_boundary"])
    h = layer.slow_attn_norm(x_s)
    x_s = x_s + layer.slow_attn(query=h, key=h, value=h, key_padding_mask=side["slow_padding_mask"])[0]
    slow_after_san, fast_after_san = x_s, x_f
    if layer.slow_fusion is not None:
        x_s = x_s + layer.slow_fusion(slow_after_san, fast_after_san, side["fast_padding_mask"],
                                      side["char_token_index"])
    if layer.fast_fusion is not None:
        x_f = x_f + layer.fast_fusion(fast_after_san, slow_after_san, side["slow_padding_mask"],
                                      side["char_token_index"])

    def ffn(f, x):
        return x + f.fc2(torch.relu(f.fc1(f.layer_norm(x))))
    return ffn(layer.slow_ffn, x_s), (ffn(layer.fast_ffn, x_f) if layer.fast_ffn is not None else x_f)


@pytest.mark.parametrize("slow_gcn", ["input", "every-layer", "none"])
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "reference"])
def test_every_block_computes_fig_3s_equations(lean, slow_gcn):
    """Each block of the encoder (float64, evaluation), on the states and side inputs the stack gives it, against
    the paper's equations written out above (the last block's fast branch stops after its SAN: nothing reads its
    fusion or FFN). Both implementations, so a change made to both alike (which their equivalence tests cannot see)
    is caught here. ``--sf-slow-gcn``: the subword GCN over A_s runs once on the embedded input (the default), in
    every block, or nowhere; the first block's input is checked against the stack's ``prepare`` input."""
    model, d = build(overrides={"encoder_layers": 3, "sf_slow_gcn": slow_gcn})
    model.double().eval()
    stack = model.encoder.stack
    stack.cfg.lean = lean
    for layer in stack.layers:
        layer.lean = lean
    assert (stack.slow_input_gcn is not None) == (slow_gcn == "input")
    assert all((layer.slow_gcn is not None) == (slow_gcn == "every-layer") for layer in stack.layers)
    prepared = []

    def prepare(x_slow, x_fast, side, _prepare=stack.prepare):
        prepared.append(x_slow)
        return _prepare(x_slow, x_fast, side)
    stack.prepare = prepare  # the encoder calls its stack's prepare (SlowFastInput)
    seen = []
    hooks = [layer.register_forward_hook(lambda m, args, out: seen.append((m, args, out)))
             for layer in stack.layers]
    tokens = batch_of(d, SENTENCES)
    with torch.no_grad():
        model.encoder(tokens, src_lengths=tokens.ne(d.pad()).sum(1))
        assert [m for m, _, _ in seen] == list(stack.layers) and len(prepared) == 1
        first_x_s, side = seen[0][1][0], seen[0][1][2]
        want = (stack.slow_input_gcn(prepared[0], side["slow_groups"], time_first=True) if slow_gcn == "input"
                else prepared[0])
        torch.testing.assert_close(first_x_s, want, atol=1e-13, rtol=0)  # measured at most 4.4e-16 apart
        assert not torch.equal(first_x_s, prepared[0]) or slow_gcn != "input"
        for i, (layer, (x_s, x_f, side), (out_s, out_f)) in enumerate(seen):
            want_s, want_f = _fig3_block(layer, x_s, x_f, side)
            # the same float64 operations in another grouping: measured at most 1.8e-15 apart (states up to 6.3)
            torch.testing.assert_close(out_s, want_s, atol=1e-13, rtol=0, msg=lambda m: f"block {i + 1}: {m}")
            torch.testing.assert_close(out_f, want_f, atol=1e-13, rtol=0, msg=lambda m: f"block {i + 1}: {m}")
    for hook in hooks:
        hook.remove()
    assert seen[-1][0].fast_fusion is None and seen[0][0].fast_fusion is not None


# ----------------------------------------------------------------------------- model checks
ABLATIONS = [
    pytest.param({}, id="default"),
    pytest.param({"sf_fusion": "linear-attention"}, id="linear-attention"),
    pytest.param({"sf_fusion": "ds-concat"}, id="ds-concat"),
    pytest.param({"sf_fusion": "ds-sum", "unidirectional_cga": True}, id="ds-sum-uni"),
    pytest.param({"sf_encoder_output": "fast"}, id="out-fast"),
    pytest.param({"sf_encoder_output": "both", "sf_slow_gcn": "every-layer"}, id="out-both"),
    pytest.param({"fast_input": "subword"}, id="fast-subword"),
    pytest.param({"no_char_boundary": True, "no_boundary_pe": True}, id="no-boundary"),
    pytest.param({"random_char_boundary": True, "sf_interaction_layers": "last"}, id="random-boundary-last"),
    pytest.param({"sf_interaction_layers": "1", "encoder_layers": 3}, id="bottom-only"),
    pytest.param({"sf_encoder_output": "fast", "sf_interaction_layers": "none"}, id="fast-only"),
]


def encoder_states(model, tokens):
    enc = model.encoder(tokens, src_lengths=tokens.ne(1).sum(1))
    return enc["encoder_out"][0], enc["encoder_padding_mask"][0]


def real_rows(out, mask, row):
    return out[:, row][~mask[row]]


def test_random_boundaries_hash_each_characters_place_in_its_sentence():
    """--random-char-boundary (table 5 #4): a character starts a pseudo-word where the fixed table says so at
    (31 x its place in the sentence + its id) mod the table's size, and the first character of a sentence always
    does; group ids count the starts from 1, padding 0 (left and right padding alike)."""
    model, _ = build(overrides={"random_char_boundary": True})
    table = model.encoder.random_boundary_table
    rows = [[(7 * j + 3 * i) % 50 + 5 for j in range(40 - 9 * i)] for i in range(3)]

    def expected(row):
        starts = [j == 0 or bool(table[(31 * j + c) % len(table)]) for j, c in enumerate(row)]
        return torch.tensor(starts).long().cumsum(0)

    for left_pad in (True, False):
        chars = torch.full((3, 40), CHAR_PAD)
        for i, row in enumerate(rows):
            start = 40 - len(row) if left_pad else 0
            chars[i, start:start + len(row)] = torch.tensor(row)
        groups = model.encoder._random_groups(chars, chars.eq(CHAR_PAD))
        for i, row in enumerate(rows):
            real = chars[i].ne(CHAR_PAD)
            assert torch.equal(groups[i][real], expected(row)) and not groups[i][~real].any()
    assert expected(rows[0])[-1] > 3  # the table starts words inside the sentence too


def test_the_character_branch_reads_scaled_embeddings_plus_sinusoidal_positions():
    """What the character branch starts from (eval): sqrt(H_f) x its embedding + fairseq's sinusoidal positions,
    zero on padding, time first; without positions with --no-token-positional-embeddings."""
    for overrides in ({}, {"no_token_positional_embeddings": True}):
        model, d = build(overrides=overrides)
        encoder = model.encoder.eval()
        seen = []
        prepare = encoder.stack.prepare
        encoder.stack.prepare = lambda x_slow, x_fast, side: seen.append(x_fast) or prepare(x_slow, x_fast, side)
        tokens = batch_of(d, SENTENCES)
        encoder(tokens, src_lengths=tokens.ne(1).sum(1))
        chars = encoder.char_table(tokens).chars
        expected = math.sqrt(TINY["fast_embed_dim"]) * encoder.embed_fast(chars)
        if not overrides:
            expected = expected + encoder.embed_fast_positions(chars)
        expected = expected.masked_fill(chars.eq(CHAR_PAD).unsqueeze(-1), 0.0).transpose(0, 1)
        torch.testing.assert_close(seen[0], expected, rtol=0, atol=0)


def test_the_encoder_out_carries_the_source_lengths_and_its_max_positions():
    """fairseq's encoder-out dict holds the source lengths it was given (none where none were); the longest
    source is --max-source-positions, with or without positional embeddings."""
    for overrides in ({}, {"no_token_positional_embeddings": True}, {"encoder_learned_pos": True}):
        model, d = build(overrides={**overrides, "max_source_positions": 300})
        assert model.encoder.max_positions() == 300
    tokens = batch_of(d, SENTENCES)
    lengths = tokens.ne(1).sum(1)
    assert model.encoder(tokens, src_lengths=lengths)["src_lengths"] == [lengths]
    assert model.encoder(tokens)["src_lengths"] == []


def test_the_host_reads_the_character_length_only_for_compiled_inputs_not_told_it(monkeypatch):
    """The longest character sequence is a size a compiled program cannot read off the device: the encoder reads it
    on the host before compiled inputs only where the task's collater did not give it (``src_char_len``); eager
    inputs leave it to CharTable.forward, and subword fast input needs none."""
    for fast_input in ("char", "subword"):
        model, d = build(overrides={"fast_input": fast_input})
        encoder = model.encoder.eval()
        calls = []
        real = encoder.char_table.max_char_length
        monkeypatch.setattr(encoder.char_table, "max_char_length", lambda t: calls.append(1) or real(t))
        tokens = batch_of(d, SENTENCES)
        char_len = real(tokens)
        eager = encoder(tokens)["encoder_out"][0]
        monkeypatch.setitem(encoder.inputs.__dict__, "_umst_compiled", "marked compiled")  # (its forward unchanged)
        marked = [encoder(tokens)["encoder_out"][0], encoder(tokens, src_char_len=char_len)["encoder_out"][0]]
        assert calls == ([1] if fast_input == "char" else []), fast_input
        for out in marked:
            torch.testing.assert_close(out, eager, rtol=0, atol=0)


@pytest.mark.parametrize("overrides", ABLATIONS)
def test_batch_and_padding_invariance(overrides):
    model, d = build(overrides=overrides)
    model.eval()
    for left_pad in (True, False):
        batched = batch_of(d, SENTENCES, left_pad=left_pad)
        out, mask = encoder_states(model, batched)
        for row, sentence in enumerate(SENTENCES):
            alone_out, alone_mask = encoder_states(model, batch_of(d, [sentence]))
            torch.testing.assert_close(real_rows(out, mask, row), real_rows(alone_out, alone_mask, 0),
                                       atol=1e-5, rtol=1e-4)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("overrides", ABLATIONS)
def test_every_parameter_gets_a_gradient(overrides):
    model, d = build(overrides=overrides)
    model.train()
    tokens = batch_of(d, SENTENCES)
    prev = batch_of(d, ["the car", "a b@@ c", "über"])
    logits, _ = model(tokens, tokens.ne(d.pad()).sum(1), prev)
    logits.float().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None)]
    assert not missing, missing


def test_dropout_off_in_eval_and_on_in_train():
    model, d = build(overrides={"dropout": 0.3})
    tokens = batch_of(d, SENTENCES)
    model.eval()
    a, _ = encoder_states(model, tokens)
    b, _ = encoder_states(model, tokens)
    assert torch.equal(a, b)
    model.train()
    c, _ = encoder_states(model, tokens)
    assert not torch.allclose(a, c)


def test_incremental_decoding_matches_full():
    model, d = build()
    model.eval()
    tokens = batch_of(d, SENTENCES)
    prev = batch_of(d, ["the car über a", "a b@@ c the", "über naïve é@@ t"], left_pad=False)
    enc = model.encoder(tokens, src_lengths=tokens.ne(d.pad()).sum(1))
    full, _ = model.decoder(prev, encoder_out=enc)
    state = {}
    steps = []
    for t in range(prev.size(1)):
        out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    # beam reordering of the encoder output
    order = torch.tensor([2, 0, 1])
    reordered = model.encoder.reorder_encoder_out(enc, order)
    torch.testing.assert_close(reordered["encoder_out"][0], enc["encoder_out"][0][:, order])


def test_half_precision_padding_rows_finite():
    model, d = build()
    model.eval()
    tokens = batch_of(d, SENTENCES)
    dtype = torch.bfloat16
    out, _ = encoder_states(model.to(dtype), tokens)
    assert torch.isfinite(out.float()).all()


def test_bad_flags_give_clear_errors():
    with pytest.raises(ValueError, match="unidirectional"):
        build(overrides={"sf_encoder_output": "fast", "unidirectional_cga": True})
    with pytest.raises(ValueError, match="divisible"):
        build(overrides={"fast_embed_dim": 6, "fast_attention_heads": 4})
    with pytest.raises(ValueError, match="never reaches the slow output"):
        build(overrides={"sf_interaction_layers": "none"})


def test_fast_only_arch_is_the_fast_branch_alone():
    """transformer_sf_fast_only_base = transformer_sf_base with the decoder on the fast branch and no
    interaction: no slow sub-layer, no encoder subword embedding; characters only reach the decoder."""
    fast_only, d = build("transformer_sf_fast_only_base")
    flags, _ = build(overrides={"sf_encoder_output": "fast", "sf_interaction_layers": "none"})
    assert fast_only.state_dict().keys() == flags.state_dict().keys()
    enc = fast_only.encoder
    assert enc.embed_tokens is None and enc.embed_positions is None and enc.stack.slow_input_gcn is None
    assert not any(".slow_" in n or n.startswith("embed_tokens") for n, _ in enc.named_parameters())
    assert enc.fast_output_proj.weight.shape == (TINY["decoder_embed_dim"], TINY["fast_embed_dim"])
    fast_only.eval()
    tokens = batch_of(d, SENTENCES)
    out, mask = encoder_states(fast_only, tokens)
    chars = enc.char_table(tokens).chars
    assert out.shape[:2] == (chars.size(1), len(SENTENCES)) and torch.equal(mask, chars.eq(CHAR_PAD))


def test_fast_only_parameters_against_the_paper_at_40k_vocab():
    """Table 1: Fast Only (Hidden=512, L=6) has 64M parameters vs 63M for Slow Only (ratio 1.016). The
    Hidden=32 row (42M, ratio 0.667) is 0.709 here: see docs/transformer_sf.md (decoder reads the fast branch through a
    32 -> 512 projection; a decoder whose cross-attention keys/values are 32 wide would be ~3M smaller)."""
    d = make_dict(["w%d" % i for i in range(40000 - 4)])
    sizes = {}
    for name, arch, extra in [("slow", "transformer_wmt_en_de", {}),
                              ("h32", "transformer_sf_fast_only_base", {}),
                              ("h512", "transformer_sf_fast_only_base",
                               {"fast_embed_dim": 512, "fast_ffn_embed_dim": 2048, "fast_attention_heads": 8})]:
        model, _ = build(arch, {"share_all_embeddings": True, **extra}, dictionary=d, tiny=False)
        sizes[name] = sum(p.numel() for p in model.parameters())
        del model
    assert abs(sizes["h512"] / sizes["slow"] / (64.0 / 63.0) - 1) < 0.02, sizes
    assert abs(sizes["h32"] / sizes["slow"] / (42.0 / 63.0) - 1) < 0.07, sizes


def test_parameter_counts_match_paper_ratio_at_40k_vocab():
    """transformer_sf_base vs its slow-only baseline (fairseq transformer_wmt_en_de) at a 40K shared
    vocabulary: the paper reports 66M vs 63M (table 1; table 4a: 66.9M vs 63.1M at width 32)."""
    d = make_dict(["w%d" % i for i in range(40000 - 4)])
    sf, _ = build("transformer_sf_base", {"share_all_embeddings": True}, dictionary=d, tiny=False)
    n_sf = sum(p.numel() for p in sf.parameters())
    del sf
    base, _ = build("transformer_wmt_en_de", {"share_all_embeddings": True}, dictionary=d, tiny=False)
    n_base = sum(p.numel() for p in base.parameters())
    ratio = n_sf / n_base
    assert abs(ratio / (66.0 / 63.0) - 1) < 0.02, (n_sf, n_base, ratio)


# ----------------------------------------------------------------------------- toy corpus and CLIs
import os  # noqa: E402

import e2e  # noqa: E402  (tests/e2e.py: the shared CLI helpers)
from umst_plugin import toy  # noqa: E402
from umst_plugin.data.word_boundaries import word_ids_from_pieces  # noqa: E402

SF_TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
           "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4",
           "--decoder-attention-heads", "4", "--fast-embed-dim", "16", "--share-all-embeddings", "--dropout", "0.1"]


def test_char_table_round_trips_on_toy_corpus(toy_raw, toy_databin):
    d = Dictionary.load(os.path.join(toy_databin, f"dict.{toy.SRC}.txt"))
    table = CharTable.from_dictionary(d)
    assert table.style == "subword-nmt"
    with open(os.path.join(toy_raw, f"valid.{toy.SRC}"), encoding="utf-8") as f:
        lines = [line.split() for line in f][:40]
    tokens = torch.full((len(lines), max(map(len, lines)) + 1), d.pad(), dtype=torch.long)
    for i, pieces in enumerate(lines):  # left-padded like LanguagePairDataset
        ids = [d.index(p) for p in pieces] + [d.eos()]
        tokens[i, tokens.size(1) - len(ids):] = torch.tensor(ids)
    cb = table(tokens)
    assert sum(p.endswith("@@") for line in lines for p in line) > 0  # multi-piece words are exercised
    for i, pieces in enumerate(lines):
        words = " ".join(pieces).replace("@@ ", "").split()
        assert table.decode_words(cb.chars[i].tolist()) == words + ["</s>"]  # chars -> words
        assert table.resegment(cb, i) == pieces + ["</s>"]  # chars -> subwords
        # A_s groups equal the task's src_word_ids rule on text
        real = cb.token_word_ids[i][tokens[i] != d.pad()].tolist()
        assert real == word_ids_from_pieces(pieces) + [len(words) + 1]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer_sf_base", "transformer_sf_fast_only_base"])
def test_trains_generates_interacts_on_toy_corpus(toy_raw, toy_databin, tmp_path, arch):
    """Train (loss falls) -> generate (both tasks) -> interactive; also table 1's Fast Only system
    (characters -> fast branch -> subword decoder)."""
    save = str(tmp_path / "ckpt")
    log = e2e.train(toy_databin, save, arch, *SF_TINY, "--adam-betas", "(0.9, 0.997)",
                    max_update=40, lr="3e-3")
    losses = e2e.train_losses(log)
    assert len(losses) >= 3 and losses[-1] < losses[0] - 1.0, losses
    ckpt = os.path.join(save, "checkpoint_last.pt")
    # the checkpoint is self-contained: both the side-data task and plain translation can decode with it
    for task in ("multiscale_translation", "translation"):
        out = e2e.generate(toy_databin, ckpt, task=task)
        e2e.bleu_line(out)
        e2e.assert_translated_all(out, toy_raw)
    with open(os.path.join(toy_raw, f"test.{toy.SRC}"), encoding="utf-8") as f:
        lines = [line.strip() for line in f][:3]
    out = e2e.interactive(toy_databin, ckpt, lines, task="translation")
    assert len(e2e.hypotheses(out)) == 3, out[-2000:]


@pytest.mark.parametrize("kv_dim,heads", [(8, 2), (64, 4)])
def test_width_changing_attention_equals_standard_attention(kv_dim, heads):
    """Both contraction orders compute fairseq's cross-attention with kdim = vdim = kv_dim."""
    from fairseq.modules import MultiheadAttention

    from umst_plugin.modules.transformer_sf.fusion import WidthChangingAttention

    torch.manual_seed(0)
    attn = WidthChangingAttention(32, kv_dim, heads, dropout=0.2).double()
    assert attn.reassociate == (heads * kv_dim <= 32)
    ref = MultiheadAttention(32, heads, kdim=kv_dim, vdim=kv_dim, encoder_decoder_attention=True).double().eval()
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(ref, name).load_state_dict(getattr(attn, name).state_dict())
    query, kv = torch.randn(5, 3, 32, dtype=torch.float64), torch.randn(11, 3, kv_dim, dtype=torch.float64)
    mask = torch.zeros(3, 11, dtype=torch.bool)
    mask[0, :4] = True
    attn.eval()
    expected, _ = ref(query, kv, kv, key_padding_mask=mask, need_weights=False)
    torch.testing.assert_close(attn(query, kv, mask), expected)
    # with dropout on, the other contraction order gives the same output for the same mask
    attn.train()
    torch.manual_seed(5)
    a = attn(query, kv, mask)
    attn.reassociate = not attn.reassociate
    torch.manual_seed(5)
    torch.testing.assert_close(attn(query, kv, mask), a)
    # every parameter is on the gradient path in both orders (DDP with find_unused_parameters=False)
    for order in (True, False):
        attn.reassociate = order
        attn.zero_grad(set_to_none=True)
        attn(query, kv, mask).sum().backward()
        assert all(p.grad is not None for p in attn.parameters())
