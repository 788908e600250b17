"""UMST's default (dense) path equals its plain reference form, and launches few kernels.

The default path applies every per-word mean, gather to subwords and up-sampling as one ``bmm`` with a dense
operator built once per batch (``umst_graphs.dense_operators``), projects Q/K/V (and the word Q/K) in one product
each, adds the up-sampled word branch with one ``baddbmm``, takes additive attention masks built once per batch,
drops out with ``torch.native_dropout`` and runs the GCN blocks through the lean autograd functions
(``umst_lean_gcn``). ``use_reference_path`` runs the same blocks in their plain form: separate projections,
index-based pooling, gather and segment means (``downsample_words``, ``project_to_words``, ``upsample_tokens``,
``group_mean``), boolean masks, ``F.dropout`` and the GCN modules' own autograd. Checked here:

* whole models (encoder and decoder) in float64, left- and right-padded batches with extra padding, training with
  every dropout on and the same seed (the same masks): outputs and every parameter's gradient equal, for every
  ablation flag; evaluation too;
* the dense operators against the paper's definitions (numpy), the one-hot dependency adjacency against the
  ``index_put`` construction it replaced;
* bf16 autocast: the dense path follows the reference within bf16 rounding;
* the launches of one block (forward + backward, training) and of the per-batch graphs (guards).
"""
import numpy as np
import pytest
import torch

from test_umst import PAD, TINY, build, collate, random_sentences, ref_G, ref_phrase_adj, ref_word_adj, token_slice
from umst_plugin.modules.common.lean_ops import use_reference_path
from umst_plugin.modules.umst.graphs import (
    build_graphs,
    dense_operators,
    dependency_adjacency,
    normalize_binary,
    symmetric_normalize,
    upsampling_map,
)
from umst_dev.op_counts import KernelLaunches

CASES = [
    ("umst_base", []),
    ("umst_base_rpr", []),
    ("umst_base", ["--rsan-upsample-norm", "literal", "--word-downsample", "scaled-sum"]),
    ("umst_base", ["--phrase-gcn-form", "authors"]),
    ("umst_base", ["--phrase-gcn-form", "authors", "--gcn-activations", "store"]),
    ("umst_base", ["--rsan-upsample", "linear"]),
    ("umst_base", ["--rsan-upsample", "nearest", "--rsan-upsample-norm", "literal", "--share-rsan-qk"]),
    ("umst_base", ["--share-gcn-proj", "within-layer"]),
    ("umst_base", ["--share-gcn-proj", "across-layers"]),
    ("umst_base", ["--word-boundary-noise", "shuffle", "--no-inter-group"]),
    ("umst_base", ["--word-boundary-noise", "shuffle"]),
    ("umst_base", ["--word-boundary-noise", "random", "--no-inter-group"]),
    ("umst_base", ["--phrase-adjacency-noise", "random"]),
    ("umst_base", ["--no-inter-group"]),
    ("umst_base", ["--no-intra-group", "--no-class-embedding"]),
    ("umst_base", ["--intra-group-op", "pool"]),
    ("umst_base", ["--intra-group-op", "gat"]),
    ("umst_base", ["--gcn-activations", "store"]),
    ("umst_base", ["--gcn-activations", "recompute"]),
    ("umst_base_rpr", ["--gcn-activations", "recompute", "--share-rsan-qk"]),
    ("umst_base", ["--rsan-attention-dropout", "fused"]),
]


def _run(arch, extra, reference, src, wid, heads, prev, train=True):
    torch.manual_seed(0)
    model = use_reference_path(build(arch, TINY + extra + ["--dropout", "0.2"]).double(), reference)
    model.train(train)
    torch.manual_seed(123)  # the same dropout masks (and noise graphs) in both forms
    out, _ = model(src, src.ne(PAD).sum(1), prev, src_word_ids=wid, src_word_heads=heads)
    if not train:
        return out.detach(), {}
    out.pow(2).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("left_pad", [True, False])
@pytest.mark.parametrize("arch,extra", CASES, ids=lambda c: " ".join(c) if isinstance(c, list) else c)
def test_dense_path_equals_the_reference_path(arch, extra, left_pad):
    sents = random_sentences(5, seed=6)
    src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=2)
    prev = torch.randint(4, 60, (src.size(0), 5))
    dense, grads = _run(arch, extra, False, src, wid, heads, prev)
    ref, ref_grads = _run(arch, extra, True, src, wid, heads, prev)
    torch.testing.assert_close(dense, ref, atol=1e-12, rtol=1e-10)
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-12, rtol=1e-10, msg=name)
    dense_eval = _run(arch, extra, False, src, wid, heads, prev, train=False)[0]
    torch.testing.assert_close(dense_eval, _run(arch, extra, True, src, wid, heads, prev, train=False)[0],
                               atol=1e-12, rtol=1e-10)
    assert not torch.allclose(dense, dense_eval)  # dropout was on in training


def _old_dependency_adjacency(word_heads):
    """The index_put construction dependency_adjacency used before (an extra slot absorbs roots and padding)."""
    bsz, n = word_heads.shape
    valid = word_heads.ge(0)
    adj = torch.zeros(bsz, n + 1, n + 1, dtype=torch.bool)
    batch = torch.arange(bsz).unsqueeze(1).expand(bsz, n)
    child = torch.where(valid, torch.arange(n).unsqueeze(0).expand(bsz, n), torch.full((bsz, n), n))
    head = torch.where(word_heads.gt(0), word_heads - 1, torch.full_like(word_heads, n))
    ones = torch.ones(bsz, n, dtype=torch.bool)
    adj.index_put_((batch, child, head), ones)
    adj.index_put_((batch, head, child), ones)
    adj = adj[:, :n, :n] | torch.diag_embed(valid)
    return adj & valid.unsqueeze(2) & valid.unsqueeze(1)


@pytest.mark.parametrize("tree", [True, False])
def test_one_hot_dependency_adjacency_equals_the_index_put_one(tree):
    src, wid, heads = collate(random_sentences(12, seed=4, tree=tree), extra_pad=1)
    adj = dependency_adjacency(heads)
    assert torch.equal(adj, _old_dependency_adjacency(heads))
    torch.testing.assert_close(normalize_binary(adj, torch.float64), symmetric_normalize(adj.double()),
                               atol=0, rtol=0)


@pytest.mark.parametrize("left_pad", [True, False])
@pytest.mark.parametrize("upsample", ["gather", "nearest", "linear"])
def test_dense_operators_match_the_definitions(upsample, left_pad):
    sents = random_sentences(9, seed=12, tree=False)
    src, wid, heads = collate(sents, left_pad=left_pad, extra_pad=2)
    for downsample, norm in (("mean", "row"), ("scaled-sum", "literal")):
        g = build_graphs(src, wid, heads, PAD, upsample=upsample, dtype=torch.float64, downsample=downsample,
                         upsample_norm=norm)
        # the up-sampling map R from its compact (slot, weight) form
        r_all = torch.zeros(src.size(0), src.size(1), heads.size(1) + 1, dtype=torch.float64)
        r_all.scatter_add_(2, g.up_index, g.up_weight.double())
        for b, s in enumerate(sents):
            sl, n_words = token_slice(s, src.size(1), left_pad), len(s[2])
            G = ref_G(s[1])
            n = G.sum(0)
            down = (G / n).T if downsample == "mean" else (G / np.sqrt(n)).T
            np.testing.assert_allclose(g.down[b, :n_words, sl].numpy(), down, atol=1e-15)
            np.testing.assert_allclose(g.group_adj[b, sl, sl].numpy(), ref_word_adj(s[1]), atol=1e-15)
            np.testing.assert_allclose(g.group_onehot[b, sl, :n_words].numpy(), G, atol=0)
            np.testing.assert_allclose(g.group_mean[b, :n_words, sl].numpy(), (G / n).T, atol=1e-15)
            np.testing.assert_allclose(g.phrase[b, :n_words, :n_words].numpy(), ref_phrase_adj(s[2]), atol=1e-15)
            r = r_all[b, sl, :n_words].numpy()
            if upsample == "gather":
                np.testing.assert_array_equal(r, G)
            np.testing.assert_allclose(g.up[b, sl, :n_words].numpy(), r, atol=1e-15)
            proj = (r / r.sum(0)).T if norm == "row" else r.T
            np.testing.assert_allclose(g.proj[b, :n_words, sl].numpy(), proj, atol=1e-15)
            # padding: zero rows and columns, -inf in the additive masks
            real = np.zeros(src.size(1), dtype=bool)
            real[sl] = True
            for t in (g.down[b][:, ~real], g.down[b][n_words:], g.up[b][~real], g.proj[b][:, ~real],
                      g.group_adj[b][~real], g.group_adj[b][:, ~real], g.phrase[b][n_words:]):
                assert t.abs().sum() == 0
            assert torch.equal(g.token_attn_mask[b, 0, 0].isinf(), torch.from_numpy(~real))
            assert g.word_attn_mask[b, 0, 0, :n_words].eq(0).all() and g.word_attn_mask[b, 0, 0, n_words:].isinf().all()


def test_dense_operators_in_the_compute_dtype_and_shuffled_groups():
    sents = random_sentences(6, seed=2)
    src, wid, heads = collate(sents, extra_pad=1)
    g = build_graphs(src, wid, heads, PAD, dtype=torch.bfloat16)
    for name in ("down", "up", "proj", "group_onehot", "group_mean", "group_adj", "phrase", "token_attn_mask"):
        assert getattr(g, name).dtype == torch.bfloat16, name
    assert g.phrase_adj.dtype == torch.float32  # the graph itself stays float32
    torch.manual_seed(1)
    g = build_graphs(src, wid, heads, PAD, word_boundary_noise="shuffle", dtype=torch.float64)
    from umst_plugin.modules.common.group_gcn import normalized_group_adjacency
    torch.testing.assert_close(g.group_adj, normalized_group_adjacency(g.word_groups, torch.float64), atol=1e-15,
                               rtol=0)
    g = build_graphs(src, wid, heads, PAD, word_boundary_noise="random")
    assert g.group_adj is None and g.word_adj is not None
    index, weight, mass = upsampling_map(g.token_word, g.token_pad, g.word_pad, "gather")
    torch.testing.assert_close(mass, g.pieces)  # the shortcut through the piece counts


def test_dense_operators_build_the_one_hot_they_are_not_given():
    """``dense_operators`` called on its own (no one-hot of the token -> word map from ``build_graphs``) builds
    the same operators."""
    src, wid, heads = collate(random_sentences(6, seed=3), left_pad=True, extra_pad=2)
    for upsample in ("gather", "linear"):
        given = build_graphs(src, wid, heads, PAD, upsample=upsample, dtype=torch.float64)
        graphs = build_graphs(src, wid, heads, PAD, upsample=upsample, dtype=torch.float64, dense=False)
        alone = dense_operators(graphs, torch.float64, upsample=upsample)
        for name, value in alone.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, getattr(given, name)), (upsample, name)


def test_debug_checks_validate_the_side_inputs_only_when_asked(monkeypatch):
    """The model re-checks its side inputs' values (a host sync on a GPU) under ``UMST_DEBUG_CHECKS=1`` or
    ``check_values=True``, and never by default: the task's collater has checked every batch on the host."""
    src, wid, heads = collate(random_sentences(4, seed=6), extra_pad=1)
    short = int(heads.ge(0).sum(1).argmin())
    heads[short, 0] = int(heads[short].ge(0).sum()) + 1  # a head past the sentence's last word
    monkeypatch.delenv("UMST_DEBUG_CHECKS", raising=False)
    build_graphs(src, wid, heads, PAD)
    with pytest.raises(ValueError, match="inconsistent with src_tokens"):
        build_graphs(src, wid, heads, PAD, check_values=True)
    monkeypatch.setenv("UMST_DEBUG_CHECKS", "1")
    with pytest.raises(ValueError, match=rf"batch rows \[{short}\]"):
        build_graphs(src, wid, heads, PAD)
    build_graphs(src, wid, heads, PAD, check_values=False)


@pytest.mark.parametrize("extra", [[], ["--phrase-gcn-form", "authors"], ["--max-relative-positions", "4"]],
                         ids=lambda e: " ".join(e) or "default")
def test_dense_path_follows_the_reference_under_bf16_autocast(extra):
    src, wid, heads = collate(random_sentences(5, seed=9), left_pad=True, extra_pad=3)
    prev = torch.randint(4, 60, (src.size(0), 5))
    outs = []
    for reference in (False, True):
        torch.manual_seed(0)
        model = use_reference_path(build("umst_base", TINY + extra), reference).eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(model(src, src.ne(PAD).sum(1), prev, src_word_ids=wid, src_word_heads=heads)[0].float())
    assert torch.isfinite(outs[0]).all()
    torch.testing.assert_close(outs[0], outs[1], atol=0.1, rtol=0.05)


def _block_launches(reference, extra=()):
    model = use_reference_path(build("umst_base", TINY + list(extra)), reference).train()
    layer = model.encoder.layers[0]
    src, wid, heads = collate(random_sentences(6, seed=3), left_pad=True, extra_pad=1)
    g = build_graphs(src, wid, heads, PAD)
    x = torch.randn(src.size(0), src.size(1), 32, requires_grad=True)
    with KernelLaunches() as k:
        with k.in_phase("forward"):
            out = layer(x, g)
        grad = torch.randn_like(out)
        with k.in_phase("backward"):
            out.backward(grad)
    with KernelLaunches() as graphs:
        build_graphs(src, wid, heads, PAD)
    return k.by_phase["forward"], k.by_phase["backward"], graphs.total


def test_launches_of_one_block_and_of_the_graphs():
    """Kernel launches of one UMST block in training (fp32, every dropout on), counted below autograd (on a CPU
    attention with dropout runs torch's math path: ~16 launches forward and ~25 backward per attention call, one
    fused kernel each on a GPU). Measured: dense 59 / 96, reference 124 / 141 (the reference reads the packed
    projections in slices, and each slice's gradient is summed into the whole); with attention dropout 0 (fused
    attention on the CPU too) dense 35 / 54. The per-batch graphs with their dense operators: 34."""
    fwd, bwd, graphs = _block_launches(False)
    ref_fwd, ref_bwd, _ = _block_launches(True)
    print(f"\none block, forward / backward launches: dense {fwd} / {bwd}, reference {ref_fwd} / {ref_bwd}; "
          f"graphs {graphs}")
    assert fwd <= 61 and bwd <= 98 and graphs <= 36
    assert ref_fwd + ref_bwd - (fwd + bwd) >= 80
    fwd0, bwd0, _ = _block_launches(False, ["--attention-dropout", "0"])
    assert fwd0 <= 37 and bwd0 <= 56


def test_the_relative_key_table_is_cast_by_the_parameter_cast_cache():
    """UMST-RPR under --amp: Shaw et al.'s key table, which its product reads transposed (``relative_key_logits``),
    is cast by autocast's parameter cache (umst_plugin/amp_weights.py) once per update with every other weight.
    While the cache took only casts of a parameter as it lies, it left the table out: one cast kernel per encoder
    layer in the compiled forward and one for its gradient (a simulated H200: 1,314 -> 1,302 kernels an update of
    4,096 tokens, docs/compile.md). The same values: the logits equal plain autocast's bit for bit."""
    from umst_plugin import amp_weights
    from umst_plugin.modules.umst.rectified_attention import relative_buckets, relative_key_logits

    class KeyTerm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rel_keys = torch.nn.Embedding(2 * 3 + 1, 8)

        def forward(self, q):
            return relative_key_logits(q, self.rel_keys.weight, relative_buckets(q.size(2), 3, q.device))

    torch.manual_seed(0)
    module, q = KeyTerm(), torch.randn(2, 2, 9, 8)
    cache = amp_weights.WeightCache(module)
    with cache.record(torch.bfloat16), torch.autocast("cpu", dtype=torch.bfloat16):
        recorded = module(q)
    recorded.float().sum().backward()
    cache.settle()
    assert cache.names == ["rel_keys.weight"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with amp_weights.cast_weights_once(module, torch.bfloat16, cache):
            cached = module(q)
        plain = module(q)
    assert cached.dtype == torch.bfloat16 and torch.equal(cached, plain) and torch.equal(plain, recorded)


@pytest.mark.parametrize("extra", [[], ["--share-rsan-qk"], ["--rsan-attention-dropout", "fused"]],
                         ids=lambda e: " ".join(e) or "default")
def test_the_parameter_cast_cache_takes_every_matrix_and_bias_of_an_encoder_layer(extra):
    """UMST-RPR under --amp: autocast's parameter cache casts every weight and bias of an encoder layer once per
    update with all the others; only the layer norms (which compute in fp32) are left out. Before, two kinds of
    parameters were left out too, each worth kernels in every layer's compiled forward on a simulated H200
    (docs/compile.md):

    * the attention's q/k/v and word q/k maps, stored apart, were concatenated per layer and pass (4 kernels): they
      are now one parameter each (``PackedLinear``), read whole;
    * the GCN blocks' biases, handed to the lean autograd functions in fp32, were cast inside them (2 kernels):
      they are now cast before, as the weights are.

    The same values: the loss and every gradient with the cache equal plain autocast's bit for bit
    (``test_amp_weights.py``, every arch). With the word branch sharing W_q, W_k and with the fused-map attention
    dropout too: both read the packed maps through one whole cast."""
    from umst_plugin import amp_weights

    torch.manual_seed(0)
    model = build("umst_base_rpr", TINY + extra).train()
    src, wid, heads = collate(random_sentences(5, seed=9), left_pad=True, extra_pad=3)
    prev = torch.randint(4, 60, (src.size(0), 5))
    cache = amp_weights.WeightCache(model)
    with cache.record(torch.bfloat16), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(src, src.ne(PAD).sum(1), prev, src_word_ids=wid, src_word_heads=heads)[0]
    out.float().pow(2).mean().backward()
    cache.settle()
    layer = {n for n, _ in model.named_parameters() if n.startswith("encoder.layers.0.")}
    left = sorted(n[len("encoder.layers.0."):] for n in layer - set(cache.names))
    assert left == sorted(f"{norm}.{kind}" for kind in ("weight", "bias") for norm in (
        "word_gcn.layer_norm", "phrase_gcn.layer_norm", "self_attn_layer_norm", "word_attn_layer_norm",
        "final_layer_norm")), left
    assert {"encoder.layers.0.self_attn.in_proj.weight", "encoder.layers.0.word_gcn.linear.bias"} <= set(cache.names)
    assert ("encoder.layers.0.self_attn.word_in_proj.weight" in layer) == ("--share-rsan-qk" not in extra)


def test_the_encoder_makes_the_relative_buckets_once_for_every_layer(monkeypatch):
    """UMST-RPR: Shaw et al.'s relative-position buckets are made once per batch by the encoder
    (``UMSTGraphs.relative_buckets``), not in each layer's attention (one kernel per layer and pass); the encoder
    gives the same output as layers that make their own."""
    from umst_plugin.models.umst import encoder as umst_encoder
    from umst_plugin.modules.umst import rectified_attention

    calls = []
    made = rectified_attention.relative_buckets

    def counted(*args):
        calls.append(args)
        return made(*args)

    monkeypatch.setattr(rectified_attention, "relative_buckets", counted)
    monkeypatch.setattr(umst_encoder, "relative_buckets", counted)
    model = build("umst_base_rpr", TINY + ["--encoder-layers", "3"]).eval()
    src, wid, heads = collate(random_sentences(5, seed=9), left_pad=True, extra_pad=3)
    with torch.no_grad():
        once = model.encoder(src, src.ne(PAD).sum(1), src_word_ids=wid, src_word_heads=heads)["encoder_out"][0]
        assert len(calls) == 1 and calls[0][:2] == (src.size(1), model.encoder.max_relative_positions)
        model.encoder.max_relative_positions = 0  # the graphs carry no buckets: each layer makes its own
        per_layer = model.encoder(src, src.ne(PAD).sum(1), src_word_ids=wid, src_word_heads=heads)["encoder_out"][0]
    assert len(calls) == 1 + 3
    assert torch.equal(once, per_layer)


def test_attention_reads_only_the_dense_operators_built_for_it():
    """RectifiedSelfAttention's dense path reads the batch's operators only where they were built for its own
    up-sampling normalisation (``graphs.proj_norm``); graphs built for the other one, or without dense operators,
    run the reference form. Operators in another dtype than the activations (float32 graphs, a float64 module, no
    autocast) are cast to it: the output of float32 operators cast to float64 by hand, to the bit. A module built
    with its defaults is the paper's: the word stream's W_q, W_k of its own, nothing recomputed."""
    from umst_plugin.modules.umst.rectified_attention import RectifiedSelfAttention

    sents = random_sentences(5, seed=3)
    assert any(len(set(s[1])) < len(s[1]) for s in sents)  # words of several pieces: "row" != "literal"
    src, wid, heads = collate(sents, extra_pad=2)
    torch.manual_seed(0)
    default = RectifiedSelfAttention(16, 2)
    assert default.word_in_proj is not None and not default.share_qk and not default.recompute_word_branch
    x = torch.randn(src.size(0), src.size(1), 16, dtype=torch.float64)
    x_word = torch.randn(src.size(0), heads.size(1), 16, dtype=torch.float64)
    for norm, other in (("literal", "row"), ("row", "literal")):
        attn = RectifiedSelfAttention(16, 2, upsample_norm=norm).double().eval()

        def out(graphs, reference=False):
            with torch.no_grad():
                return use_reference_path(attn, reference)(x, x_word, graphs)

        own = build_graphs(src, wid, heads, PAD, dtype=torch.float64, upsample_norm=norm)
        expected = out(own, reference=True)
        torch.testing.assert_close(out(own), expected, atol=1e-12, rtol=1e-10)
        theirs = build_graphs(src, wid, heads, PAD, dtype=torch.float64, upsample_norm=other)
        assert not torch.allclose(theirs.proj, own.proj)
        torch.testing.assert_close(out(theirs), expected, atol=0, rtol=0)  # the reference form itself
        bare = build_graphs(src, wid, heads, PAD, dtype=torch.float64, upsample_norm=norm, dense=False)
        torch.testing.assert_close(out(bare), expected, atol=0, rtol=0)
        single = build_graphs(src, wid, heads, PAD, upsample_norm=norm)  # float32 operators
        assert single.up.dtype == torch.float32
        by_hand = single._replace(**{name: getattr(single, name).double() for name in ("up", "proj", "token_attn_mask",
                                                                                       "word_attn_mask")})
        torch.testing.assert_close(out(single), out(by_hand), atol=0, rtol=0)


def test_the_layer_reads_only_the_pooling_operator_built_for_it_and_its_reference_form_runs_nothing_lean(
        monkeypatch):
    """UMSTEncoderLayer (float64, evaluation): the dense per-word pooling is read only where the batch's operators
    were built for the layer's own down-sampling (``graphs.down_mode``); graphs built for the other one pool as the
    layer says (``downsample_words``). The reference form and ``gcn_activations='store'`` run the GCN modules'
    own forward, never the lean functions that the default form runs once each per layer call. A layer built with
    its defaults is the paper's: a word GCN and a phrase GCN with projections of their own, the word stream's
    W_q, W_k of its own; ``share_within_layer`` refuses a cross-layer projection, either one."""
    from umst_plugin.modules.umst import layer as umst_layer
    from umst_plugin.modules.umst.layer import UMSTEncoderLayer

    default = UMSTEncoderLayer(16, 32, 2)
    assert default.phrase_gcn is not None and isinstance(default.word_gcn, umst_layer.GroupGCN)
    assert default.word_gcn.linear is not default.phrase_gcn.linear and not default.self_attn.share_qk
    for given in ({"word_proj": torch.nn.Linear(16, 16)}, {"phrase_proj": torch.nn.Linear(16, 16)}):
        with pytest.raises(ValueError, match="share_within_layer and cross-layer projections"):
            UMSTEncoderLayer(16, 32, 2, share_within_layer=True, **given)

    calls = []
    for name in ("lean_word_gcn", "lean_phrase_gcn"):
        real = getattr(umst_layer, name)
        monkeypatch.setattr(umst_layer, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    sents = random_sentences(5, seed=3)
    assert any(len(set(s[1])) < len(s[1]) for s in sents)  # words of several pieces: "mean" != "scaled-sum"
    src, wid, heads = collate(sents, extra_pad=2)
    x = torch.randn(src.size(0), src.size(1), 16, dtype=torch.float64)
    for mode, other in (("mean", "scaled-sum"), ("scaled-sum", "mean")):
        torch.manual_seed(0)
        layer = UMSTEncoderLayer(16, 32, 2, downsample=mode).double().eval()

        def out(graphs, reference=False):
            with torch.no_grad():
                return use_reference_path(layer, reference)(x, graphs)

        own = build_graphs(src, wid, heads, PAD, dtype=torch.float64, downsample=mode)
        theirs = build_graphs(src, wid, heads, PAD, dtype=torch.float64, downsample=other)
        calls.clear()
        expected = out(own, reference=True)
        assert calls == []
        layer.gcn_activations = "store"
        stored = out(own)
        assert calls == []
        layer.gcn_activations = "lean"
        # the same float64 operations in another grouping: measured at most 8.9e-16 apart (outputs up to 3.6)
        torch.testing.assert_close(stored, expected, atol=1e-13, rtol=0)
        torch.testing.assert_close(out(own), expected, atol=1e-13, rtol=0)
        assert calls == ["lean_word_gcn", "lean_phrase_gcn"]
        assert not torch.allclose(theirs.down, own.down)
        torch.testing.assert_close(out(theirs), expected, atol=1e-13, rtol=0)
