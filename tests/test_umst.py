"""UMST: graphs vs a dense numpy reference from the paper's definitions, rectified attention vs a dense
reference, parameter counts vs the paper, batch/padding invariance, gradients, dtypes, ablation flags,
and (slow) toy-corpus training + fairseq-generate + fairseq-interactive."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import umst_plugin  # noqa: F401  (registers the model and task)
from umst_plugin.modules.common.group_gcn import group_mean
from umst_plugin.modules.umst.graphs import (
    build_graphs,
    downsample_words,
    project_to_words,
    upsample_tokens,
)
from umst_plugin.modules.umst.rectified_attention import RectifiedSelfAttention

PAD, EOS = 1, 2


# --------------------------------------------------------------------------------------------
# Random sentences following the task's side-data contract
# --------------------------------------------------------------------------------------------


def random_sentences(n, seed, tree=True, max_words=6, max_pieces=3):
    """Per sentence: (tokens, word_ids, heads) as python lists; the final </s> is its own word, head 0."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        n_real = rng.randint(1, max_words + 1)
        pieces = list(rng.randint(1, max_pieces + 1, size=n_real)) + [1]
        if tree:  # random dependency tree: attach words in random order to an already attached word
            order = rng.permutation(n_real)
            heads = [0] * n_real
            for k, w in enumerate(order[1:], start=1):
                heads[w] = int(order[rng.randint(k)]) + 1
        else:  # arbitrary heads: cycles, self heads, duplicate edges (must collapse to binary entries)
            heads = [int(h) for h in rng.randint(0, n_real + 1, size=n_real)]
        heads = heads + [0]
        word_ids = [w + 1 for w, p in enumerate(pieces) for _ in range(p)]
        tokens = list(rng.randint(4, 60, size=len(word_ids) - 1)) + [EOS]
        out.append((tokens, word_ids, heads))
    return out


def collate(sentences, left_pad=True, extra_pad=0):
    length = max(len(s[0]) for s in sentences) + extra_pad
    n_slots = max(len(s[2]) for s in sentences)
    src = torch.full((len(sentences), length), PAD, dtype=torch.long)
    wid = torch.zeros((len(sentences), length), dtype=torch.long)
    heads = torch.full((len(sentences), n_slots), -1, dtype=torch.long)
    for b, (tok, w, h) in enumerate(sentences):
        sl = slice(length - len(tok), length) if left_pad else slice(0, len(tok))
        src[b, sl] = torch.tensor(tok)
        wid[b, sl] = torch.tensor(w)
        heads[b, : len(h)] = torch.tensor(h)
    return src, wid, heads


def token_slice(sentence, length, left_pad):
    n = len(sentence[0])
    return slice(length - n, length) if left_pad else slice(0, n)


# Dense references straight from section 2.1 (Kipf convention: A has no self loops, Ã = A + I).


def ref_G(word_ids):
    n_words = max(word_ids)
    g = np.zeros((len(word_ids), n_words))
    for i, w in enumerate(word_ids):
        g[i, w - 1] = 1.0
    return g


def ref_normalize(a_tilde):
    deg = a_tilde.sum(1)
    inv = 1.0 / np.sqrt(deg)
    return inv[:, None] * a_tilde * inv[None, :]


def ref_word_adj(word_ids):
    n = len(word_ids)
    a = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j and word_ids[i] == word_ids[j]:
                a[i, j] = 1.0
    return ref_normalize(a + np.eye(n))


def ref_phrase_adj(heads):
    n = len(heads)
    a = np.zeros((n, n))
    for i, h in enumerate(heads):
        if h > 0:  # dependency edge i <-> h-1, undirected; root edges dropped
            a[i, h - 1] = a[h - 1, i] = 1.0
    a_tilde = np.maximum(a, np.eye(n))  # binary: a self head adds nothing to the self loop
    return ref_normalize(a_tilde)


@pytest.mark.parametrize("left_pad", [True, False])
@pytest.mark.parametrize("tree", [True, False])
def test_graphs_match_dense_reference(left_pad, tree):
    sents = random_sentences(12, seed=3 + tree, tree=tree)
    src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=1)
    g = build_graphs(src, wid, heads, PAD)
    x = torch.randn(src.size(0), src.size(1), 5, dtype=torch.float64)
    aw_x = group_mean(x, g.word_groups)
    ds = downsample_words(x, g, "mean")
    ds_scaled = downsample_words(x, g, "scaled-sum")
    length, n_slots = src.size(1), heads.size(1)
    for b, s in enumerate(sents):
        sl = token_slice(s, length, left_pad)
        n_words = len(s[2])
        G = ref_G(s[1])
        # A_p (with self loops, normalised); padding rows/cols exactly zero
        ap = g.phrase_adj[b].double().numpy()
        np.testing.assert_allclose(ap[:n_words, :n_words], ref_phrase_adj(s[2]), atol=1e-6)
        assert not ap[n_words:].any() and not ap[:, n_words:].any()
        # A_w applied to x (group_gcn's segment mean) == dense normalised A_w @ x
        np.testing.assert_allclose(aw_x[b, sl].numpy(), ref_word_adj(s[1]) @ x[b, sl].numpy(), atol=1e-12)
        assert not aw_x[b][torch.ones(length, dtype=torch.bool).index_fill_(0, torch.arange(length)[sl], False)].any()
        # G: token -> word; down-sampling = G^T x / n (mean) and G^T x / sqrt(n)
        n = G.sum(0)
        np.testing.assert_allclose(ds[b, :n_words].numpy(), (G.T @ x[b, sl].numpy()) / n[:, None], atol=1e-12)
        np.testing.assert_allclose(ds_scaled[b, :n_words].numpy(), (G.T @ x[b, sl].numpy()) / np.sqrt(n)[:, None],
                                   atol=1e-12)
        assert not ds[b, n_words:].any()
        # class embedding ids: 1 for pieces of multi-piece words, 0 for whole words and padding
        np.testing.assert_array_equal(g.class_ids[b, sl].numpy(), (G @ (n > 1)).astype(int))
        assert g.word_pad[b].tolist() == [False] * n_words + [True] * (n_slots - n_words)
        # up-sampling a word field back to tokens is G @ y
        y = torch.randn(src.size(0), n_slots, 3, dtype=torch.float64)
        np.testing.assert_allclose(upsample_tokens(y, g)[b, sl].numpy(), G @ y[b, :n_words].numpy(), atol=1e-12)


def test_side_input_errors_are_clear():
    sents = random_sentences(2, seed=0)
    src, wid, heads = collate(sents)
    for word_ids, word_heads in ((None, None), (wid, None), (None, heads)):  # either missing alone too
        with pytest.raises(ValueError, match="multiscale_translation"):
            build_graphs(src, word_ids, word_heads, PAD)
    with pytest.raises(ValueError, match="B x W"):  # the right batch size, one dimension too many
        build_graphs(src, wid, heads.unsqueeze(-1), PAD)
    bad = wid.clone()
    bad[0, -1] = 0  # a real token marked as padding
    with pytest.raises(ValueError, match="inconsistent"):
        build_graphs(src, bad, heads, PAD, check_values=True)
    with pytest.raises(ValueError, match="laid out like src_tokens"):
        build_graphs(src, wid[:, 1:], heads, PAD)
    bad_heads = heads.clone()
    bad_heads[0, 0] = 99
    with pytest.raises(ValueError, match="inconsistent"):
        build_graphs(src, wid, bad_heads, PAD, check_values=True)


def _dense_R(g):
    bsz, n_slots = g.word_pad.shape
    r = torch.zeros(bsz, g.token_pad.size(1), n_slots + 1, dtype=torch.float64)
    r.scatter_add_(2, g.up_index, g.up_weight.double())
    return r[:, :, :n_slots]


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_interpolation_upsampling_matches_torch_interpolate(mode):
    """Table 6 rows 5/6: R ATTN2 R^T equals image interpolation of each sentence's W_b x W_b map to T_b x T_b."""
    sents = random_sentences(10, seed=11)
    src, wid, heads = collate(sents, left_pad=True)
    g = build_graphs(src, wid, heads, PAD, upsample=mode)
    r = _dense_R(g)
    for b, s in enumerate(sents):
        sl = token_slice(s, src.size(1), True)
        n_words, n_tok = len(s[2]), len(s[0])
        m = torch.rand(n_words, n_words, dtype=torch.float64)
        rb = r[b, sl, :n_words]
        ours = rb @ m @ rb.T
        torch_mode = "bilinear" if mode == "linear" else "nearest"
        kwargs = {"align_corners": False} if mode == "linear" else {}
        ref = F.interpolate(m[None, None], size=(n_tok, n_tok), mode=torch_mode, **kwargs)[0, 0]
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)  # weights are fp32


def test_shuffled_word_boundaries_keep_lengths_and_contiguity():
    torch.manual_seed(0)
    sents = random_sentences(20, seed=5)
    src, wid, heads = collate(sents, left_pad=True)
    g = build_graphs(src, wid, heads, PAD, word_boundary_noise="shuffle")
    changed = False
    for b, s in enumerate(sents):
        groups = g.word_groups[b, token_slice(s, src.size(1), True)].tolist()
        assert groups == sorted(groups) and groups[-1] == len(s[2])  # contiguous, </s> last
        assert groups.count(groups[-1]) == 1  # </s> alone
        sizes = sorted(np.bincount(groups)[1:].tolist())
        assert sizes == sorted(np.bincount(s[1])[1:].tolist())  # same multiset of word lengths
        changed |= groups != s[1]
    assert changed
    assert (g.word_groups.eq(0) == src.eq(PAD)).all()


def test_random_adjacencies_are_symmetric_with_self_loops_inside_sentences():
    torch.manual_seed(0)
    sents = random_sentences(6, seed=8)
    src, wid, heads = collate(sents, left_pad=False)
    g = build_graphs(src, wid, heads, PAD, word_boundary_noise="random", phrase_noise="random")
    for adj, valid in ((g.word_adj, ~g.token_pad), (g.phrase_adj, ~g.word_pad)):
        torch.testing.assert_close(adj, adj.transpose(1, 2))
        outside = ~(valid.unsqueeze(2) & valid.unsqueeze(1))
        assert not adj[outside].any()
        assert (torch.diagonal(adj, dim1=1, dim2=2)[valid] > 0).all()


# --------------------------------------------------------------------------------------------
# Rectified self-attention vs a dense per-sentence reference
# --------------------------------------------------------------------------------------------


def ref_rsan(attn, x, xw, word_ids, norm):
    """Dense numpy RSAN for one sentence (float64): ATTN = (ATTN1 + G ATTN2 [diag(1/n)] G^T) / 2. With relative
    positions (``attn.max_relative_positions`` = k > 0), ATTN1 and its share of the values are Shaw et al.'s
    (2018), written out pair by pair: e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_k) and sum_j ATTN1_ij (v_j + a^V_ij),
    with a_ij = the table's row clip(j - i, -k, k) + k."""
    p = {k: v.detach().double().numpy() for k, v in attn.state_dict().items()}
    H, dk = attn.num_heads, attn.head_dim
    k_max = attn.max_relative_positions

    def lin(name, i, t):  # map i of a module (rows i*C:(i+1)*C of a packed projection)
        rows = slice(i * attn.embed_dim, (i + 1) * attn.embed_dim)
        return t @ p[name + ".weight"][rows].T + p[name + ".bias"][rows]

    def softmax(s):
        s = s - s.max(-1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(-1, keepdims=True)

    word = "in_proj" if attn.share_qk else "word_in_proj"
    q1, k1, v = lin("in_proj", 0, x), lin("in_proj", 1, x), lin("in_proj", 2, x)
    q2, k2 = lin(word, 0, xw), lin(word, 1, xw)
    G = ref_G(word_ids)
    n = G.sum(0)
    cols = G / n[None, :] if norm == "row" else G
    heads, fused_maps = [], []
    length = len(word_ids)
    for h in range(H):
        sl = slice(h * dk, (h + 1) * dk)
        if k_max > 0:
            a_k, a_v = p["rel_keys.weight"], p["rel_values.weight"]
            row = lambda i, j: min(max(j - i, -k_max), k_max) + k_max  # noqa: E731
            e = np.array([[q1[i, sl] @ (k1[j, sl] + a_k[row(i, j)]) for j in range(length)]
                          for i in range(length)]) / math.sqrt(dk)
            a1 = softmax(e)
            subword = np.array([sum(a1[i, j] * (v[j, sl] + a_v[row(i, j)]) for j in range(length))
                                for i in range(length)])
        else:
            a1 = softmax(q1[:, sl] @ k1[:, sl].T / math.sqrt(dk))
            subword = a1 @ v[:, sl]
        a2 = softmax(q2[:, sl] @ k2[:, sl].T / math.sqrt(dk))
        word_map = G @ a2 @ cols.T  # ATTN2 up-sampled to subwords
        fused_maps.append(0.5 * (a1 + word_map))
        heads.append(0.5 * (subword + word_map @ v[:, sl]))
    return lin("out_proj", 0, np.concatenate(heads, -1)), fused_maps


def _matches_the_dense_reference(attn, sents, left_pad, norm):
    """``attn`` (float64, eval) on the batch of ``sents`` equals :func:`ref_rsan` on each sentence alone, on its real
    tokens; returns each sentence's reference maps."""
    src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=1)
    g = build_graphs(src, wid, heads, PAD, dtype=torch.float64, upsample_norm=norm)
    x = torch.randn(src.size(0), src.size(1), 16, dtype=torch.float64)
    xw = torch.randn(src.size(0), heads.size(1), 16, dtype=torch.float64)
    with torch.no_grad():
        out = attn(x, xw, g)
    maps = []
    for b, s in enumerate(sents):
        sl = token_slice(s, src.size(1), left_pad)
        ref, sentence_maps = ref_rsan(attn, x[b, sl].numpy(), xw[b, : len(s[2])].numpy(), s[1], norm)
        np.testing.assert_allclose(out[b, sl].numpy(), ref, atol=1e-10)
        maps.append(sentence_maps)
    return maps


@pytest.mark.parametrize("norm", ["row", "literal"])
@pytest.mark.parametrize("share_qk", [False, True])
@pytest.mark.parametrize("left_pad", [True, False])
def test_rectified_attention_matches_dense_reference(norm, share_qk, left_pad):
    torch.manual_seed(0)
    sents = random_sentences(7, seed=21)
    attn = RectifiedSelfAttention(16, 4, upsample_norm=norm, share_qk=share_qk).double().eval()
    for s, maps in zip(sents, _matches_the_dense_reference(attn, sents, left_pad, norm)):
        rows = np.stack(maps).sum(-1)
        multi_piece = max(np.bincount(s[1])) > 1
        if norm == "row":  # the default form is a distribution
            np.testing.assert_allclose(rows, 1.0, atol=1e-12)
        elif multi_piece:  # Eq. 4 verbatim is not row-stochastic when a word has several pieces
            assert rows.max() > 1.0 + 1e-6


@pytest.mark.parametrize("norm", ["row", "literal"])
@pytest.mark.parametrize("upsample", ["gather", "nearest", "linear"])
@pytest.mark.parametrize("left_pad", [True, False])
def test_fused_map_path_equals_factorised_path_without_dropout(norm, upsample, left_pad):
    """--rsan-attention-dropout fused builds (ATTN1 + ATTN2')/2 explicitly; with dropout 0 it must equal the
    default factorised path (ATTN2' never built) in outputs and gradients, with and without RPR."""
    torch.manual_seed(0)
    sents = random_sentences(6, seed=31)
    src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=2)
    g = build_graphs(src, wid, heads, PAD, upsample=upsample, dtype=torch.float64, upsample_norm=norm)
    for rpr, share_qk in ((0, False), (3, True)):
        per_map = RectifiedSelfAttention(16, 4, upsample_norm=norm, share_qk=share_qk,
                                         max_relative_positions=rpr).double().train()
        fused = RectifiedSelfAttention(16, 4, upsample_norm=norm, share_qk=share_qk, max_relative_positions=rpr,
                                       attention_dropout_mode="fused").double().train()
        fused.load_state_dict(per_map.state_dict())
        x = torch.randn(src.size(0), src.size(1), 16, dtype=torch.float64)
        xw = torch.randn(src.size(0), heads.size(1), 16, dtype=torch.float64)
        outs, grads = [], []
        for attn in (per_map, fused):
            out = attn(x, xw, g)
            out[~g.token_pad].pow(2).sum().backward()
            outs.append(out[~g.token_pad].detach())
            grads.append({n: p.grad for n, p in attn.named_parameters()})
        torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=1e-10)
        for name in grads[0]:
            torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("norm", ["row", "literal"])
def test_fused_map_path_drops_entries_of_the_averaged_map(norm):
    torch.manual_seed(0)
    sents = random_sentences(5, seed=8)
    src, wid, heads = collate(sents, left_pad=True, extra_pad=1)
    g = build_graphs(src, wid, heads, PAD, dtype=torch.float64, upsample_norm=norm)
    attn = RectifiedSelfAttention(16, 4, attention_dropout=0.3, upsample_norm=norm,
                                  attention_dropout_mode="fused").double().train()
    x = torch.randn(src.size(0), src.size(1), 16, dtype=torch.float64)
    xw = torch.randn(src.size(0), heads.size(1), 16, dtype=torch.float64)
    with torch.no_grad():
        fused_map = attn.attention_maps(x, xw, g)[2]  # dense reference: R from a scatter, no dropout
        v = attn._heads(attn.in_proj.project(x, 2))
        torch.manual_seed(77)
        expected = attn.out_proj(attn._merge(F.dropout(fused_map, 0.3, True) @ v))
        torch.manual_seed(77)
        got = attn(x, xw, g)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    assert not torch.allclose(got, attn.eval()(x, xw, g))  # dropout was on


@pytest.mark.parametrize("left_pad", [True, False])
def test_rpr_attention_matches_shaw_et_al_pair_by_pair(left_pad):
    """UMST + RPR's subword map against Shaw et al.'s formulas written out for every query-key pair (the banded
    gather and scatter of ``relative_key_logits`` / ``relative_value_term`` are what is checked): sentences up to 22
    subwords, k = 2, so most pairs are clipped, on both sides; trained relative tables (random, not zero)."""
    torch.manual_seed(0)
    sents = random_sentences(5, seed=44, max_words=8)
    assert max(len(s[0]) for s in sents) > 2 * 2 + 1
    attn = RectifiedSelfAttention(16, 4, max_relative_positions=2).double().eval()
    with torch.no_grad():
        attn.rel_keys.weight.normal_()
        attn.rel_values.weight.normal_()
    _matches_the_dense_reference(attn, sents, left_pad, "row")


def test_rpr_attention_reduces_to_plain_without_relative_embeddings_and_is_shift_invariant():
    torch.manual_seed(0)
    sents = random_sentences(4, seed=2)
    src, wid, heads = collate(sents, left_pad=True, extra_pad=2)
    g = build_graphs(src, wid, heads, PAD, dtype=torch.float64)
    plain = RectifiedSelfAttention(16, 4).double().eval()
    rpr = RectifiedSelfAttention(16, 4, max_relative_positions=3).double().eval()
    rpr.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(src.size(0), src.size(1), 16, dtype=torch.float64)
    xw = torch.randn(src.size(0), heads.size(1), 16, dtype=torch.float64)
    with torch.no_grad():
        rpr.rel_keys.weight.zero_()
        rpr.rel_values.weight.zero_()
    with torch.no_grad():
        torch.testing.assert_close(rpr(x, xw, g), plain(x, xw, g))
        rpr.rel_keys.weight.normal_()
        rpr.rel_values.weight.normal_()
    assert not torch.allclose(rpr(x, xw, g), plain(x, xw, g))
    # padding on the left (positions shifted) does not change relative positions
    src2, wid2, heads2 = collate(sents, left_pad=False, extra_pad=2)
    g2 = build_graphs(src2, wid2, heads2, PAD, dtype=torch.float64)
    x2 = torch.zeros_like(x)
    for b, s in enumerate(sents):
        x2[b, token_slice(s, src.size(1), False)] = x[b, token_slice(s, src.size(1), True)]
    out1, out2 = rpr(x, xw, g), rpr(x2, xw, g2)
    for b, s in enumerate(sents):
        torch.testing.assert_close(out1[b, token_slice(s, src.size(1), True)],
                                   out2[b, token_slice(s, src.size(1), False)])


def test_the_gat_ablation_is_a_single_head_gat_over_each_words_pieces():
    """Table 5's "replace GCN with GAT" (``WordGAT``, float64, evaluation) against its formula written out pair by
    pair: h = W LN(x) + b; for each piece i, e_ij = LeakyReLU_0.2(a_src . h_i + a_dst . h_j) over the pieces j of
    its own word, alpha_i = softmax_j e_ij, out_i = x_i + ReLU(sum_j alpha_ij h_j); a padding row keeps x."""
    from umst_plugin.modules.umst.layer import WordGAT

    torch.manual_seed(0)
    gat = WordGAT(8).double().eval()
    groups = torch.tensor([[1, 1, 2, 3, 3, 3, 0, 0], [1, 2, 2, 2, 3, 4, 4, 0]])
    x = torch.randn(2, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        got = gat(x, groups)
        h = gat.linear(gat.layer_norm(x))
        want = x.clone()
        for b in range(2):
            for i in range(8):
                if groups[b, i] == 0:
                    continue
                same = [j for j in range(8) if groups[b, j] == groups[b, i]]
                e = torch.stack([F.leaky_relu(h[b, i] @ gat.att_src + h[b, j] @ gat.att_dst, 0.2) for j in same])
                alpha = torch.softmax(e, dim=0)
                want[b, i] += torch.relu(sum(a * h[b, j] for a, j in zip(alpha, same)))
    # measured at most 2.2e-16 apart (outputs up to 3.1): the same sums in another order
    torch.testing.assert_close(got, want, atol=1e-13, rtol=0)


def test_the_encoder_keeps_no_layer_states_where_fairseqs_generator_calls_it():
    """fairseq's generator runs the encoder through ``forward_torchscript`` without ``return_all_hiddens``: no
    layer's states are kept (beam search would reorder every one of them at each step), as fairseq's transformer
    encoder; asked for them, one per layer."""
    model = build("umst_base", TINY).eval()
    src, wid, heads = collate(random_sentences(3, seed=4))
    net_input = dict(src_tokens=src, src_lengths=src.ne(PAD).sum(1), src_word_ids=wid, src_word_heads=heads)
    with torch.no_grad():
        assert model.encoder.forward_torchscript(net_input)["encoder_states"] == []
        states = model.encoder(**net_input, return_all_hiddens=True)["encoder_states"]
    assert len(states) == len(model.encoder.layers) + 1  # the embeddings' output, then each layer's


def test_project_to_words_literal_and_row():
    sents = random_sentences(3, seed=1)
    src, wid, heads = collate(sents)
    g = build_graphs(src, wid, heads, PAD)
    v = torch.randn(src.size(0), src.size(1), 4, dtype=torch.float64)
    torch.testing.assert_close(project_to_words(v, g, normalize=True), downsample_words(v, g, "mean"))
    for b, s in enumerate(sents):
        G = ref_G(s[1])
        lit = project_to_words(v, g, normalize=False)[b, : len(s[2])].numpy()
        np.testing.assert_allclose(lit, G.T @ v[b, token_slice(s, src.size(1), True)].numpy(), atol=1e-12)


# --------------------------------------------------------------------------------------------
# Full model through fairseq's argument parsing
# --------------------------------------------------------------------------------------------

TINY = ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48", "--encoder-attention-heads", "4",
        "--encoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
        "--decoder-attention-heads", "4", "--decoder-layers", "2"]


class _Task:
    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def make_dictionary(size):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}@@" if i % 3 == 0 else f"w{i}")
    return d


def build(arch, extra=(), vocab=64, seed=0):
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    torch.manual_seed(seed)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["unused", "--arch", arch, "--task", "translation", *extra])
    return ARCH_MODEL_REGISTRY[args.arch].build_model(args, _Task(make_dictionary(vocab)))


def n_params(model):
    return sum(p.numel() for p in model.parameters())


PAPER_ROWS = [  # table 6 (and table 2 for the baseline), millions of parameters
    ("transformer_wmt_en_de", ["--encoder-normalize-before", "--decoder-normalize-before"], 65),
    ("umst_base", [], 70),
    ("umst_base", ["--share-gcn-proj", "across-layers"], 66),
    ("umst_base", ["--share-gcn-proj", "within-layer"], 69),
    ("umst_base", ["--share-rsan-qk"], 67),
    ("umst_base", ["--rsan-upsample", "nearest"], 70),
    ("umst_base", ["--rsan-upsample", "linear"], 70),
]


def test_parameter_counts_against_the_paper(capsys):
    counts = []
    for arch, extra, paper in PAPER_ROWS:
        with torch.device("meta"):  # shapes only: fast and memory-free
            model = build(arch, ["--share-all-embeddings", *extra], vocab=40000)
        counts.append(n_params(model))
    with capsys.disabled():
        print("\nparameters at base size, shared 40K vocabulary (ours vs paper):")
        for (arch, extra, paper), c in zip(PAPER_ROWS, counts):
            print(f"  {arch:24s} {' '.join(extra):32s} {c / 1e6:6.2f}M  paper {paper}M")
    base_tf, umst, across, within, shared_qk, nearest, linear = counts
    assert abs(base_tf / 65e6 - 1) <= 0.02
    assert abs(umst / 70e6 - 1) <= 0.02
    # table 6: every sharing row is smaller than UMST and the interpolation rows equal it...
    assert across < within < umst and shared_qk < within and nearest == linear == umst
    # ...and each saving is within 1.5M of the paper's (rounded, and not self-consistent: 10 shared
    # matrices "across" are reported as -4M but 6 "within" as -1M, while 12 Q/K matrices are -3M)
    for ours, paper_row in ((across, 66), (within, 69), (shared_qk, 67)):
        assert abs((umst - ours) - (70e6 - paper_row * 1e6)) <= 1.5e6
    d = 512
    assert umst - within == 6 * (d * d + d)  # one W per block instead of two
    assert umst - shared_qk == 6 * 2 * (d * d + d)  # no word Q/K projections
    assert umst - across == 10 * (d * d + d)  # 2 matrices instead of 12


def encode(model, src, wid, heads):
    return model.encoder(src, src.ne(PAD).sum(1), src_word_ids=wid, src_word_heads=heads)["encoder_out"][0]


def _fig2_block(layer, x, graphs):
    """One UMST block as the paper writes it (section 3, figure 2; the layer module's docstring), from the layer's
    own sub-modules in their plain forms:

        x  <- x + GCN_w(x)                        (Eq. 2: the word GCN module, residual included)
        xw <- DS(x)                               (subwords -> words by average pooling, after the word GCN)
        xw <- xw + GCN_p(xw)                      (Eq. 3: the phrase GCN module, residual included)
        x  <- x + RSAN(LN(x), LN'(xw))            (Eq. 4)
        x  <- x + W_2 ReLU(W_1 LN(x) + b_1) + b_2
    """
    from umst_plugin.modules.umst.graphs import downsample_words

    x = layer.word_gcn(x, graphs.word_groups)
    x_word = layer.phrase_gcn(downsample_words(x, graphs, "mean"), graphs.phrase_adj)
    x = x + layer.self_attn(layer.self_attn_layer_norm(x), layer.word_attn_layer_norm(x_word), graphs)
    return x + layer.fc2(torch.relu(layer.fc1(layer.final_layer_norm(x))))


@pytest.mark.parametrize("reference", [False, True], ids=["default", "reference"])
@pytest.mark.parametrize("activations", ["lean", "store"])
def test_every_block_computes_figure_2s_equations(reference, activations):
    """Each encoder block (float64, evaluation), on the subword stream and graphs the encoder gives it, against the
    paper's block written out above: the default (dense) and the reference path, the lean and the plain GCNs. A
    change made to every path alike (which their equivalence tests cannot see) is caught here."""
    from umst_plugin.modules.common.lean_ops import use_reference_path

    src, wid, heads = collate(random_sentences(5, seed=3), left_pad=True, extra_pad=1)
    model = use_reference_path(build("umst_base", TINY + ["--gcn-activations", activations]).double(), reference)
    model.eval()
    seen = []
    hooks = [layer.register_forward_hook(lambda m, args, out: seen.append((m, args, out)))
             for layer in model.encoder.layers]
    with torch.no_grad():
        model.encoder(src, src.ne(PAD).sum(1), src_word_ids=wid, src_word_heads=heads)
        assert [m for m, _, _ in seen] == list(model.encoder.layers)
        for i, (layer, (x, graphs), out) in enumerate(seen):
            # the same float64 operations in another grouping: measured at most 8.9e-16 apart (states up to 5.0)
            torch.testing.assert_close(out, _fig2_block(layer, x, graphs), atol=1e-13, rtol=0,
                                       msg=lambda m: f"block {i + 1}: {m}")
    for hook in hooks:
        hook.remove()


@pytest.mark.parametrize("arch,extra", [
    ("umst_base", []),
    ("umst_base_rpr", []),
    ("umst_base", ["--rsan-upsample-norm", "literal", "--word-downsample", "scaled-sum"]),
    ("umst_base", ["--phrase-gcn-form", "authors", "--rsan-upsample-norm", "literal", "--word-downsample", "scaled-sum"]),
    ("umst_base", ["--rsan-upsample", "linear", "--intra-group-op", "gat"]),
    ("umst_base", ["--rsan-upsample", "nearest", "--intra-group-op", "pool", "--share-gcn-proj", "across-layers"]),
])
def test_batch_and_padding_invariance(arch, extra):
    model = build(arch, TINY + extra).eval()
    sents = random_sentences(6, seed=13)
    with torch.no_grad():
        alone = [encode(model, *collate([s]))[:, 0] for s in sents]
        for left_pad in (True, False):
            src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=2)
            out = encode(model, src, wid, heads)
            for b, s in enumerate(sents):
                torch.testing.assert_close(out[token_slice(s, src.size(1), left_pad), b], alone[b],
                                           atol=1e-5, rtol=1e-5)


def _separate_projections(state_dict):
    """A state dict in the layout UMST checkpoints had before the attention's projections were packed: q_proj,
    k_proj, v_proj (and word_q_proj, word_k_proj) stored apart."""
    old = {}
    for key, value in state_dict.items():
        for packed, names in ((".in_proj.", ("q_proj", "k_proj", "v_proj")),
                              (".word_in_proj.", ("word_q_proj", "word_k_proj"))):
            if packed in key and ".self_attn." in key:
                parent, kind = key.split(packed)
                for name, piece in zip(names, value.chunk(len(names))):
                    old[f"{parent}.{name}.{kind}"] = piece.clone()
                break
        else:
            old[key] = value.clone()
    return old


@pytest.mark.parametrize("extra", [[], ["--share-rsan-qk"]], ids=["own word q/k", "shared q/k"])
def test_checkpoints_with_separate_projections_load_into_the_packed_ones(extra, caplog):
    """fairseq's load path (``load_state_dict`` -> ``upgrade_state_dict_named``) packs an older checkpoint's
    separate maps: strict loading succeeds and the model encodes as the one it was saved from. A warning says that
    resuming its training needs --reset-optimizer (the optimizer's state is per parameter tensor)."""
    saved = build("umst_base_rpr", TINY + extra, seed=3).eval()
    old = _separate_projections(saved.state_dict())
    assert any(k.endswith("self_attn.k_proj.weight") for k in old)
    assert any(k.endswith("self_attn.word_q_proj.bias") for k in old) == (not extra)
    loaded = build("umst_base_rpr", TINY + extra, seed=4).eval()
    with caplog.at_level("WARNING"):
        loaded.load_state_dict(old, strict=True)
    assert [r.getMessage().split(":")[0] for r in caplog.records if "--reset-optimizer" in r.getMessage()] == ["encoder"]
    caplog.clear()
    build("umst_base_rpr", TINY + extra, seed=4).load_state_dict(saved.state_dict(), strict=True)
    assert not [r for r in caplog.records if "--reset-optimizer" in r.getMessage()]
    src, wid, heads = collate(random_sentences(3, seed=5), left_pad=True, extra_pad=1)
    with torch.no_grad():
        torch.testing.assert_close(encode(loaded, src, wid, heads), encode(saved, src, wid, heads), atol=0, rtol=0)


ABLATIONS = [
    [], ["--no-class-embedding"], ["--no-intra-group"], ["--no-inter-group"], ["--intra-group-op", "pool"],
    ["--intra-group-op", "gat"], ["--share-gcn-proj", "across-layers"], ["--share-gcn-proj", "within-layer"],
    ["--share-rsan-qk"], ["--rsan-upsample", "nearest"], ["--rsan-upsample", "linear"],
    ["--rsan-upsample-norm", "literal"], ["--word-downsample", "scaled-sum"], ["--phrase-gcn-form", "authors"],
    ["--phrase-gcn-form", "authors", "--gcn-activations", "store"],
    ["--word-boundary-noise", "random", "--no-inter-group"], ["--word-boundary-noise", "shuffle", "--no-inter-group"],
    ["--phrase-adjacency-noise", "random"], ["--max-relative-positions", "4"], ["--rsan-attention-dropout", "fused"],
    ["--gcn-activations", "store"], ["--gcn-activations", "recompute"],
]


@pytest.mark.parametrize("extra", ABLATIONS, ids=lambda e: " ".join(e) or "default")
def test_every_parameter_gets_a_gradient(extra):
    model = build("umst_base", TINY + extra).train()
    src, wid, heads = collate(random_sentences(4, seed=2), left_pad=True, extra_pad=1)
    prev = torch.randint(4, 60, (src.size(0), 5))
    out, _ = model(src, src.ne(PAD).sum(1), prev, src_word_ids=wid, src_word_heads=heads)
    out.float().pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_flags_change_the_model():
    base = build("umst_base", TINY)
    layer = base.encoder.layers[0]
    assert base.encoder.class_embedding is not None and layer.word_gcn is not None and layer.phrase_gcn is not None
    assert base.encoder.class_embedding.weight.std().item() == pytest.approx(32 ** -0.5, rel=0.5)
    assert build("umst_base", TINY + ["--no-class-embedding"]).encoder.class_embedding is None
    assert build("umst_base", TINY + ["--no-intra-group"]).encoder.layers[0].word_gcn is None
    assert build("umst_base", TINY + ["--no-inter-group"]).encoder.layers[0].phrase_gcn is None
    within = build("umst_base", TINY + ["--share-gcn-proj", "within-layer"]).encoder.layers[0]
    assert within.word_gcn.linear is within.phrase_gcn.linear
    across = build("umst_base", TINY + ["--share-gcn-proj", "across-layers"]).encoder
    assert across.layers[0].word_gcn.linear is across.layers[1].word_gcn.linear
    assert across.layers[0].phrase_gcn.linear is across.layers[1].phrase_gcn.linear
    assert across.layers[0].word_gcn.linear is not across.layers[0].phrase_gcn.linear
    assert layer.phrase_gcn.form == "eq3" and base.args.phrase_gcn_form == "eq3"
    assert all(lay.normalize_before for lay in base.decoder.layers)  # pre-norm decoder too (docs/umst.md)
    assert layer.self_attn.attention_dropout_mode == "per-map"
    fused = build("umst_base", TINY + ["--rsan-attention-dropout", "fused"])
    assert all(lay.self_attn.attention_dropout_mode == "fused" for lay in fused.encoder.layers)
    authors = build("umst_base", TINY + ["--phrase-gcn-form", "authors", "--activation-dropout", "0.2"])
    assert all(lay.phrase_gcn.form == "authors" for lay in authors.encoder.layers)
    assert authors.encoder.layers[0].phrase_gcn.activation_dropout == 0.2
    assert n_params(authors) == n_params(base)  # same parameters, another arithmetic
    rpr = build("umst_base_rpr", TINY)
    assert rpr.encoder.layers[0].self_attn.max_relative_positions == 16
    mine = build("umst_base_rpr", TINY + ["--max-relative-positions", "4"])  # a user's clipping distance wins
    assert mine.encoder.layers[0].self_attn.max_relative_positions == 4
    big_rpr = build("umst_big_rpr", ["--encoder-layers", "1", "--decoder-layers", "1"], vocab=8)
    assert big_rpr.encoder.layers[0].self_attn.max_relative_positions == 16
    big_mine = build("umst_big_rpr", ["--encoder-layers", "1", "--decoder-layers", "1", "--max-relative-positions",
                                      "8"], vocab=8)
    assert big_mine.encoder.layers[0].self_attn.max_relative_positions == 8
    big = build("umst_big", ["--encoder-layers", "1", "--decoder-layers", "1"], vocab=8)
    assert big.encoder.layers[0].self_attn.num_heads == 16 and big.cfg.dropout == 0.3
    deep = build("umst_base", TINY[:-2] + ["--decoder-layers", "1", "--encoder-layers", "3"])
    assert len(deep.encoder.layers) == 3
    with pytest.raises(ValueError, match="pre-norm"):
        _build_post_norm()


def _build_post_norm():
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["unused", "--arch", "umst_base", "--task", "translation", *TINY])
    args.encoder_normalize_before = False
    return ARCH_MODEL_REGISTRY["umst_base"].build_model(args, _Task(make_dictionary(16)))


def test_dropout_only_in_training_and_missing_side_inputs_error():
    model = build("umst_base", TINY)
    src, wid, heads = collate(random_sentences(3, seed=4))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(encode(model, src, wid, heads), encode(model, src, wid, heads), atol=0, rtol=0)
    model.train()
    assert not torch.allclose(encode(model, src, wid, heads), encode(model, src, wid, heads))
    with pytest.raises(ValueError, match="multiscale_translation"):
        model.encoder(src, src.ne(PAD).sum(1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_has_no_nan_on_padded_rows(dtype):
    model = build("umst_base_rpr", TINY).eval()
    sents = random_sentences(5, seed=9)
    src, wid, heads = collate(sents, left_pad=True, extra_pad=3)
    with torch.no_grad():
        ref = encode(model, src, wid, heads)
        model = model.to(dtype)
        out = encode(model, src, wid, heads)
    assert out.dtype == dtype and torch.isfinite(out).all()
    mask = src.ne(PAD).t()
    torch.testing.assert_close(out.float()[mask], ref[mask], atol=0.1, rtol=0.1)


# --------------------------------------------------------------------------------------------
# End to end through the real CLIs (toy corpus fixtures from conftest / e2e helpers)
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_toy_training_lowers_loss_then_generate_and_interactive(toy_raw, toy_databin, tmp_path):
    import os
    import re

    import e2e

    save_dir = str(tmp_path / "ckpt_umst")
    log = e2e.train(toy_databin, save_dir, "umst_base", *e2e.TINY, "--share-all-embeddings", max_update=60)
    inner = [float(x) for x in re.findall(r"\bloss=([0-9.]+)", log)]  # every 5 updates, in order
    assert len(inner) >= 10 and all(math.isfinite(v) for v in inner), log[-3000:]
    assert inner[-1] < inner[0] - 1.0, inner
    print(f"\nUMST toy training, loss every 5 updates: {inner}")
    ckpt = os.path.join(save_dir, "checkpoint_last.pt")

    out = e2e.generate(toy_databin, ckpt)
    assert "BLEU" in e2e.bleu_line(out)
    e2e.assert_translated_all(out, toy_raw)

    e2e.interactive_on_raw_test_lines(toy_raw, toy_databin, ckpt, n=3)


@pytest.mark.parametrize("left_pad", [True, False])
@pytest.mark.parametrize("extra", [[], ["--word-downsample", "scaled-sum", "--share-gcn-proj", "within-layer"],
                                   ["--word-boundary-noise", "shuffle"], ["--share-gcn-proj", "across-layers"],
                                   ["--phrase-gcn-form", "authors"]],
                         ids=lambda e: " ".join(e) or "default")
def test_gcn_activation_modes_give_identical_outputs_and_gradients(left_pad, extra):
    """lean (hand-written backward keeping masks), store (plain autograd) and recompute (checkpointing)
    are the same math with the same dropout masks (dropout 0.1 everywhere is on): same output and same
    gradients under the same seed, in float64 to rounding. The deprecated --no-gcn-recompute is store."""
    sents = random_sentences(5, seed=6)
    src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=2)
    prev = torch.randint(4, 60, (src.size(0), 5))
    results = {}
    for mode in ("lean", "store", "recompute"):
        torch.manual_seed(0)
        model = build("umst_base", TINY + extra + ["--gcn-activations", mode]).train().double()
        assert model.encoder.layers[0].gcn_activations == mode
        torch.manual_seed(123)
        out, _ = model(src, src.ne(PAD).sum(1), prev, src_word_ids=wid, src_word_heads=heads)
        out.pow(2).mean().backward()
        results[mode] = (out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    for mode in ("store", "recompute"):
        torch.testing.assert_close(results["lean"][0], results[mode][0], atol=1e-12, rtol=1e-10)
        for name, grad in results["lean"][1].items():
            torch.testing.assert_close(grad, results[mode][1][name], atol=1e-12, rtol=1e-10, msg=f"{mode} {name}")
    assert build("umst_base", TINY + ["--no-gcn-recompute"]).encoder.layers[0].gcn_activations == "store"
    assert build("umst_base", TINY).encoder.layers[0].gcn_activations == "lean"


def _lean_case(left_pad, dtype=torch.float64, form="eq3"):
    from umst_plugin.modules.common.group_gcn import GroupGCN
    from umst_plugin.modules.umst.layer import PhraseGCN

    sents = random_sentences(4, seed=17)
    src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=2)
    g = build_graphs(src, wid, heads, PAD, dtype=dtype)
    torch.manual_seed(3)
    word = GroupGCN(6, dropout=0.3, activation_dropout=0.2).to(dtype)
    phrase = PhraseGCN(6, dropout=0.3, form=form, activation_dropout=0.2).to(dtype)
    for module in (word, phrase):  # non-trivial LayerNorm affine parameters
        torch.nn.init.normal_(module.layer_norm.weight)
        torch.nn.init.normal_(module.layer_norm.bias)
    x = torch.randn(src.size(0), src.size(1), 6, dtype=dtype)
    xw = torch.randn(src.size(0), heads.size(1), 6, dtype=dtype)
    return g, word, phrase, x, xw


@pytest.mark.parametrize("form", ["eq3", "authors"])
@pytest.mark.parametrize("left_pad", [True, False])
def test_lean_gcn_backward_passes_gradcheck_with_dropout_on(left_pad, form):
    from umst_plugin.modules.umst.lean_gcn import LeanPhraseGCN, LeanPhraseGCNAuthors, LeanWordGCN

    g, word, phrase, x, xw = _lean_case(left_pad, form=form)
    tokens = x.clone().requires_grad_()
    params = [p.detach().clone().requires_grad_() for p in
              (word.layer_norm.weight, word.layer_norm.bias, word.linear.weight, word.linear.bias)]

    def word_fn(inp, ln_w, ln_b, w, b):
        torch.manual_seed(11)  # the same dropout masks on every evaluation
        return LeanWordGCN.apply(inp, ln_w, ln_b, w, b, g.group_onehot, g.group_mean, g.group_adj, 1e-5, 0.2, 0.3,
                                 True)

    assert torch.autograd.gradcheck(word_fn, (tokens, *params))
    words = xw.clone().requires_grad_()
    params = [p.detach().clone().requires_grad_() for p in
              (phrase.layer_norm.weight, phrase.layer_norm.bias, phrase.linear.weight, phrase.linear.bias)]
    adj = g.phrase_adj.double()

    def phrase_fn(inp, ln_w, ln_b, w, b):
        torch.manual_seed(11)
        if form == "authors":  # both dropouts on: 0.2 between the two products, 0.3 on the output
            return LeanPhraseGCNAuthors.apply(inp, ln_w, ln_b, w, b, adj, 1e-5, 0.2, 0.3, True)
        return LeanPhraseGCN.apply(inp, ln_w, ln_b, w, b, adj, 1e-5, 0.3, True)

    assert torch.autograd.gradcheck(phrase_fn, (words, *params))


@pytest.mark.parametrize("form", ["eq3", "authors"])
@pytest.mark.parametrize("left_pad", [True, False])
def test_lean_gcn_equals_the_reference_modules_and_leaves_padding_alone(left_pad, form):
    from umst_plugin.modules.umst.lean_gcn import lean_phrase_gcn, lean_word_gcn

    g, word, phrase, x, xw = _lean_case(left_pad, form=form)
    word.train(), phrase.train()
    for fn_lean, fn_ref, inp in ((lambda t: lean_word_gcn(word, t, g, True),
                                  lambda t: word(t, g.word_groups), x),
                                 (lambda t: lean_phrase_gcn(phrase, t, g.phrase_adj, True),
                                  lambda t: phrase(t, g.phrase_adj), xw)):
        outs, grads = [], []
        for fn in (fn_lean, fn_ref):
            inp_ = inp.clone().requires_grad_()
            torch.manual_seed(5)
            out = fn(inp_)
            out.pow(3).sum().backward()
            outs.append(out.detach())
            grads.append(inp_.grad)
        torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=1e-12)
    out = lean_word_gcn(word, x, g, True)
    torch.testing.assert_close(out[g.token_pad], x[g.token_pad], atol=0, rtol=0)  # padding: x + 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lean_training_step_in_half_precision_is_finite(dtype):
    model = build("umst_base", TINY).train().to(dtype)
    src, wid, heads = collate(random_sentences(5, seed=9), left_pad=True, extra_pad=3)
    prev = torch.randint(4, 60, (src.size(0), 5))
    out, _ = model(src, src.ne(PAD).sum(1), prev, src_word_ids=wid, src_word_heads=heads)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_lean_gcn_saves_less_for_backward_than_plain_autograd():
    """What the lean mode is for: fewer bytes kept for backward per block than the reference."""
    def saved_bytes(mode):
        layer = build("umst_base", TINY + ["--gcn-activations", mode]).encoder.layers[0].train()
        src, wid, heads = collate(random_sentences(6, seed=3), left_pad=True, extra_pad=1)
        g = build_graphs(src, wid, heads, PAD)
        x = torch.randn(src.size(0), src.size(1), 32, requires_grad=True)
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x, g)
        params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        return sum(n for ptr, n in storages.items() if ptr not in params), x.numel() * x.element_size()

    (lean, unit), (store, _), (recompute, _) = (saved_bytes(m) for m in ("lean", "store", "recompute"))
    print(f"\nsaved for backward, one block: lean {lean} B, store {store} B, recompute {recompute} B; "
          f"B x T x d = {unit} B")
    # lean keeps ~4.5 fewer B x T x d float tensors per block than store (see umst_lean_gcn)
    assert recompute < lean < store - 4 * unit
