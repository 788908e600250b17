"""MSMSA's lean path (every head of a layer in one fused attention call, the window biases of all layers built once
per stack forward) equals the grouped path it replaced for short batches (one ``windowed_attention`` call per scale,
banded or dense: the implementation before, still used above ``--msmsa-dense-max-len`` and in incremental
decoding), and launches about as many kernels as the transformer's attention:

* float64, padded batches (left and right), bidirectional and causal heads of every kind of scale: outputs at the
  real positions and the gradients of every parameter and of the input are equal, in eval and in training with
  attention dropout (the same dropout decisions on the same attention map: both paths' attention calls patched
  with one deterministic, content-keyed dropout);
* the window bias equals the old dense path's bias entry by entry (padding queries included);
* the bias is built once per encoder / decoder forward for all layers and dropped afterwards; built per layer
  outside a stack's forward; no host sync; no graph break under torch.compile;
* whole-model fwd+bwd launches at most the transformer's (+ the one bias build).
"""
import copy

import pytest
import torch

import model_checks as checks
from test_msmsa import padded_batch
from umst_dev import dev
from umst_plugin.modules.msmsa import window_bias as wb
from umst_plugin.modules.msmsa import windowed_attention as wa
from umst_plugin.modules.msmsa.windowed_attention import MultiScaleSelfAttention, parse_scale, share_window_masks
from umst_dev.op_counts import HostSyncs, KernelLaunches

SPECS = ("1", "3", "7", "N/16", "N/8", "N/4", "N/2", "N", "global")
HEAD_SCALES = [parse_scale(s) for s in ("1", "1", "3", "N/8", "N/8", "N/4", "N/2", "global")]
TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
            decoder_ffn_embed_dim=32, encoder_attention_heads=4, decoder_attention_heads=4)


def hashed_dropout_attention(q, k, v, mask=None, dropout_p=0.0, scale=None, recompute=True):
    """softmax(q k^T * scale + mask) v with attention dropout whose keep decision for (query i, key j) of a head
    is a fixed function of that head's scaled query row i and key row j: the same decisions on the same attention
    map whatever layout (groups, query blocks, key windows) a path computes it in."""
    q = q * (q.size(-1) ** -0.5 if scale is None else scale)
    probs = torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1)
    if dropout_p > 0:
        u = torch.linspace(-1.0, 1.0, q.size(-1), dtype=q.dtype)
        hq, hk = (q.detach() * u).sum(-1), (k.detach() * u.flip(0)).sum(-1)
        noise = torch.frac(torch.sin(hq[..., :, None] * 12.9898 + hk[..., None, :] * 78.233).abs() * 43758.5453)
        probs = probs * (noise >= dropout_p) / (1 - dropout_p)
    return probs @ v


def grouped_through_attention(monkeypatch):
    """The grouped path with scale-1 heads through the attention call too (the shortcut draws its dropout
    elsewhere), and both paths' attention replaced by hashed_dropout_attention."""
    grouped = wa.windowed_attention
    monkeypatch.setattr(wa, "windowed_attention", lambda *a, **kw: grouped(*a, **dict(kw, self_shortcut=False)))
    monkeypatch.setattr(wa, "attention", hashed_dropout_attention)


def run(attn, x, pad, weights):
    out, _ = attn(x, key_padding_mask=pad)
    real = ~pad.t()
    loss = (out * weights)[real].sum()
    params = [x] + list(attn.parameters())
    return out, torch.autograd.grad(loss, params)


@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("left", [True, False], ids=["left-pad", "right-pad"])
@pytest.mark.parametrize("min_block", [2, 1000], ids=["banded", "dense"])
def test_all_heads_equal_grouped_path(left, causal, dropout, min_block, monkeypatch):
    """float64, training mode: outputs at real positions and gradients of input and parameters."""
    if dropout:
        grouped_through_attention(monkeypatch)
    torch.manual_seed(0)
    lengths, total = [37, 30, 9, 1], 37
    attn = MultiScaleSelfAttention(32, 8, HEAD_SCALES, dropout=dropout, causal=causal,
                                   min_block=min_block).double().train()
    x = torch.randn(total, 4, 32, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(total, 4, 32, dtype=torch.float64)
    pad = padded_batch(lengths, total, left)
    out, grads = run(attn, x, pad, weights)
    attn.dense_max_len = 0  # the grouped path
    ref_out, ref_grads = run(attn, x, pad, weights)
    real = ~pad.t()
    torch.testing.assert_close(out[real], ref_out[real], rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-11, atol=1e-12)
    if dropout:  # the dropout acted (the same decisions on both paths)
        attn.eval()
        assert not torch.allclose(attn(x, key_padding_mask=pad)[0][real], out[real])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_one_scale_per_layer_equals_grouped(spec, causal):
    """Every kind of scale alone (a layer of one group), no padding (the bias broadcast over the batch) and padded."""
    torch.manual_seed(1)
    attn = MultiScaleSelfAttention(16, 4, [parse_scale(spec)] * 4, causal=causal, min_block=2).double().eval()
    x = torch.randn(40, 3, 16, dtype=torch.float64)
    for pad in (torch.zeros(3, 40, dtype=torch.bool), padded_batch([40, 23, 6], 40, left=True)):
        attn.dense_max_len = 1000
        out, _ = attn(x, key_padding_mask=pad)
        out_none, _ = attn(x) if not pad.any() else (out, None)
        attn.dense_max_len = 0
        ref, _ = attn(x, key_padding_mask=pad)
        real = ~pad.t()
        torch.testing.assert_close(out[real], ref[real], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out_none, out)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("left", [True, False], ids=["left-pad", "right-pad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_bias_equals_old_dense_bias_everywhere(left, causal, dtype):
    """Every entry, padding queries included: the old dense path's _window_bias of each head's scale."""
    pad = padded_batch([21, 13, 2], 21, left)
    scales = [parse_scale(s) for s in SPECS]
    bias = wb.window_bias(scales, pad, 21, causal, dtype, "cpu")
    assert bias.shape == (3, len(scales), 21, 21) and bias.dtype == dtype
    positions, lengths = wa._token_positions(pad, 3, 21, "cpu")
    offset = torch.arange(21)[None, :] - torch.arange(21)[:, None]
    for p, scale in enumerate(scales):
        if scale.kind == "fixed":
            half = (scale.value - 1) // 2
        elif scale.kind == "global":
            half = 21
        else:
            half = scale.half_width(positions + 1 if causal else lengths)[:, None, :, None]
        expected = wa._window_bias(offset, half, causal, (~pad)[:, None, None, :], dtype)
        torch.testing.assert_close(bias[:, p:p + 1], expected.expand(3, 1, 21, 21), rtol=0, atol=0)
    # without padding: one 1 x P x T x T bias for the whole batch
    torch.testing.assert_close(wb.window_bias(scales, None, 21, causal, dtype, "cpu"),
                               wb.window_bias(scales, torch.zeros(1, 21, dtype=torch.bool), 21, causal, dtype, "cpu"))


def test_aligned_storage_for_memory_efficient_kernels():
    """align=16 (what CUDA gets): the same values, strides multiples of 16, last stride 1."""
    pad = padded_batch([21, 13, 2], 21, left=False)
    scales = [parse_scale(s) for s in SPECS]
    for mask in (pad, None):
        plain = wb.window_bias(scales, mask, 21, False, torch.float32, "cpu")
        aligned = wb.window_bias(scales, mask, 21, False, torch.float32, "cpu", align=16)
        torch.testing.assert_close(aligned, plain, rtol=0, atol=0)
        assert aligned.stride(-1) == 1 and all(s % 16 == 0 for s in aligned[:, 2:5].stride()[:-1])


def _stack(causal, heads_per_layer=((0, 0, 1, 3), (4, 4, 4, 4), (8, 2, 1, 3))):
    torch.manual_seed(2)
    layers = [MultiScaleSelfAttention(16, 4, [parse_scale(SPECS[i]) for i in heads], causal=causal).eval()
              for heads in heads_per_layer]
    return layers, share_window_masks(layers)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_stack_builds_every_layers_bias_once_and_drops_it(causal, monkeypatch):
    layers, masks = _stack(causal)
    calls = []
    build = wb.window_bias
    monkeypatch.setattr(wb, "window_bias", lambda scales, *a, **kw: calls.append(len(scales)) or build(scales, *a, **kw))
    x = torch.randn(12, 3, 16)
    pad = padded_batch([12, 7, 3], 12, left=True)
    alone = []
    for layer in layers:  # outside a stack's scope: each layer its own heads, nothing kept
        alone.append(layer(x, key_padding_mask=pad)[0])
    assert calls == [4, 4, 4] and masks._entry is None
    calls.clear()
    with masks.scope():
        shared = [layer(x, key_padding_mask=pad)[0] for layer in layers]
        shared += [layer(x, key_padding_mask=pad)[0] for layer in layers]  # the same mask: reused
        assert calls == [12]
        other = pad.clone()  # another mask tensor (even with the same values) is built again
        [layer(x, key_padding_mask=other) for layer in layers]
        shorter = other[:, :10]
        [layer(x[:10], key_padding_mask=shorter) for layer in layers]
        [layer(x) for layer in layers]
        assert calls == [12, 12, 12, 12]
    assert masks._entry is None
    for a, b in zip(alone + alone, shared):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_stack_s_bias_follows_its_padding_mask(causal):
    """Inside a scope the bias is kept for the mask it was built for, the same tensor unchanged: another mask of the
    same shape and version counter, or the same mask changed in place, gets its own bias, as each layer alone
    builds it."""
    layers, masks = _stack(causal)
    x = torch.randn(12, 3, 16)
    first, second = padded_batch([12, 7, 3], 12, left=True), padded_batch([5, 12, 9], 12, left=True)
    assert first._version == second._version  # the key alone cannot tell them apart: the tensor's identity must

    def alone(mask):
        return [layer(x, key_padding_mask=mask)[0] for layer in layers]

    want_first, want_second = alone(first), alone(second)
    with masks.scope():
        for mask, want in ((first, want_first), (second, want_second)):
            for layer, expected in zip(layers, want):
                torch.testing.assert_close(layer(x, key_padding_mask=mask)[0], expected, rtol=0, atol=0)
        second.copy_(first)  # the same tensor, changed in place
        for layer, expected in zip(layers, want_first):
            torch.testing.assert_close(layer(x, key_padding_mask=second)[0], expected, rtol=0, atol=0)


def test_window_masks_keep_their_rules_and_pickle_without_their_state():
    """The heads' rule (2 x H half-width constants) is made once per device and module; a pickled stack (a
    checkpoint of the whole model, multiprocessing) carries no cached tensor and no open scope."""
    import pickle

    layers, masks = _stack(False)
    assert masks._constants_on("cpu", 1) is masks._constants_on("cpu", 1)
    assert masks._constants_on("cpu", None).shape == (2, 12)
    with masks.scope():
        layers[0](torch.randn(5, 2, 16), key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
        assert masks._entry is not None
        restored = pickle.loads(pickle.dumps(masks))
    assert (restored._constants, restored._entry, restored._active) == ({}, None, False)
    assert (restored.slots, restored.causal) == (masks.slots, masks.causal)


def test_model_encoder_builds_its_bias_once_per_forward(monkeypatch):
    model, task = dev.build_model("msmsa_base", dict(TINY, encoder_layers=3, msmsa_decoder=True))
    calls = []
    build = wb.window_bias
    monkeypatch.setattr(wb, "window_bias", lambda scales, *a, **kw: calls.append(len(scales)) or build(scales, *a, **kw))
    sample = dev.random_sample(task, 3, 9, 7)
    model.train()
    model(**dev.model_inputs(model, sample))[0].sum().backward()
    assert calls == [12, 8]  # encoder: 3 layers x 4 heads at once; decoder: 2 x 4
    assert model.encoder.window_masks._entry is None and model.decoder.window_masks._entry is None
    copied = copy.deepcopy(model)  # a copy shares its own (empty) masks across its layers
    attns = [layer.self_attn for layer in copied.encoder.layers]
    assert all(a.window_masks is copied.encoder.window_masks for a in attns)
    assert copied.encoder.window_masks is not model.encoder.window_masks


def test_no_host_sync():
    layers, masks = _stack(False)
    x = torch.randn(12, 3, 16, requires_grad=True)
    pad = padded_batch([12, 7, 3], 12, left=True)
    for layer in layers:
        layer.train()
        layer.dropout = 0.1
    with HostSyncs() as syncs, masks.scope():
        sum(layer(x, key_padding_mask=pad)[0].sum() for layer in layers).backward()
    assert not syncs.locations, syncs.locations


def test_layer_compiles_without_graph_break():
    """dynamo captures the attention of every kind of scale whole (training, dropout, padding and none)."""
    torch._dynamo.reset()
    attn = MultiScaleSelfAttention(16, 4, [parse_scale(s) for s in ("1", "3", "N/4", "global")], dropout=0.1).train()
    x = torch.randn(9, 3, 16, requires_grad=True)
    pad = padded_batch([9, 5, 2], 9, left=True)
    for mask in (pad, None):
        explanation = torch._dynamo.explain(attn)(x, key_padding_mask=mask)
        assert explanation.graph_break_count == 0, explanation.break_reasons


def _launches(arch, overrides):
    model, task = dev.build_model(arch, dict(TINY, **overrides))
    model.train()
    sample = dev.random_sample(task, 8, 20, 18)
    inputs = dev.model_inputs(model, sample)
    model(**inputs)[0].sum().backward()  # warm-up
    model.zero_grad(set_to_none=True)
    with KernelLaunches() as k:
        model(**inputs)[0].sum().backward()
    return k.total


def test_launches_at_most_the_transformers():
    transformer = _launches("transformer", dict(encoder_normalize_before=True, decoder_normalize_before=True))
    msmsa = _launches("msmsa_base", {})
    grouped = _launches("msmsa_base", dict(msmsa_dense_max_len=0))
    assert msmsa <= transformer + 12, (msmsa, transformer)  # + the bias, built once for the stack
    assert grouped > msmsa + 80, (grouped, msmsa)  # (two encoder layers here)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_padded_rows_finite(dtype):
    torch.manual_seed(3)
    attn = MultiScaleSelfAttention(16, 4, [parse_scale(s) for s in ("1", "3", "N/4", "global")]).to(dtype).eval()
    x = torch.randn(14, 3, 16, dtype=dtype)
    for left in (True, False):
        pad = padded_batch([14, 6, 1], 14, left)
        with torch.no_grad():
            assert torch.isfinite(attn(x, key_padding_mask=pad)[0]).all()


@pytest.mark.parametrize("left", [True, False], ids=["left-pad", "right-pad"])
def test_model_padding_invariance_lean_path(left):
    checks.check_padding_invariance("msmsa_base", dict(TINY, msmsa_scales="1,3,N/4,N/2", msmsa_decoder=True),
                                    left_pad_source=left)
