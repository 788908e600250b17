"""TranSFormer's launch-lean encoder (``SlowFastConfig.lean``, ``modules/transformer_sf/lean.py``) against the
reference modules it replaces: float64, padded batches, training mode with dropout under the same masks, outputs
and gradients equal; and the launch counts it saves.

Same masks: the lean path draws its dropout masks with ``torch.native_dropout`` on tensors laid out as its own
ops produce them, the reference with ``F.dropout`` on its layouts, so under one seed the two draw the same
numbers in different orders of the elements. ``logical_dropout`` replaces both functions, for a test, by one
that draws a mask of the tensor's logical shape from the global generator: the same call sequence (the lean path
keeps the reference's order of dropouts) gives both the same masks, whatever the layouts. The attention kernels'
own dropout (``F.scaled_dot_product_attention``) draws from the same generator on probabilities of the same
shapes in both paths, and recomputation in backward restores the generator as ``torch.utils.checkpoint`` does.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

from umst_plugin.modules.transformer_sf.fast_attention import (
    BoundaryRelativeAttention,
    BoundaryRelativeSelfAttention,
    boundary_band,
)
from umst_plugin.modules.transformer_sf.fusion import WidthChangingAttention
from umst_dev.op_counts import KernelLaunches

from test_transformer_sf import ABLATIONS, SENTENCES, batch_of, build

DROPOUTS = {"dropout": 0.3, "attention_dropout": 0.2, "activation_dropout": 0.25}


@contextlib.contextmanager
def logical_dropout():
    """``F.dropout`` and ``torch.native_dropout`` drawing masks of the logical shape from the global generator."""
    def keep_mask(x, p):
        return torch.rand(x.shape, dtype=torch.float64, device=x.device) >= p

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        return x * keep_mask(x, p) * (1.0 / (1.0 - p))

    def native_dropout(x, p, train):
        if not train or p == 0:
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
        keep = keep_mask(x, p)
        return x * keep * (1.0 / (1.0 - p)), keep

    saved = F.dropout, torch.native_dropout
    F.dropout, torch.native_dropout = dropout, native_dropout
    try:
        yield
    finally:
        F.dropout, torch.native_dropout = saved


def set_lean(model, lean):
    stack = model.encoder.stack
    stack.cfg.lean = lean
    for layer in stack.layers:
        layer.lean = lean


def set_recompute(model, recompute):
    for layer in model.encoder.stack.layers:
        layer.recompute_fast = recompute


def train_step(model, d, seed, left_pad=True):
    tokens = batch_of(d, SENTENCES, left_pad=left_pad)
    prev = batch_of(d, ["the car über a", "a b@@ c the", "über naïve é@@ t"], left_pad=False)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with logical_dropout():
        enc = model.encoder(tokens, src_lengths=tokens.ne(d.pad()).sum(1))
        logits, _ = model.decoder(prev, encoder_out=enc)
        weights = torch.linspace(-1, 1, logits.numel(), dtype=logits.dtype).view_as(logits)
        (logits * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return enc["encoder_out"][0].detach(), logits.detach(), grads


def assert_same_step(a, b):
    enc_a, out_a, grads_a = a
    enc_b, out_b, grads_b = b
    torch.testing.assert_close(enc_a, enc_b, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_a, out_b, rtol=1e-10, atol=1e-10)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-9, atol=1e-10, msg=name)


# ----------------------------------------------------------------------------- whole model
@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "keep"])
@pytest.mark.parametrize("overrides", ABLATIONS)
def test_lean_encoder_equals_reference_in_training(overrides, recompute):
    model, d = build(overrides={**DROPOUTS, **overrides})
    model.double().train()
    set_recompute(model, recompute)
    for left_pad in (True, False):
        set_lean(model, False)
        reference = train_step(model, d, seed=3, left_pad=left_pad)
        set_lean(model, True)
        lean = train_step(model, d, seed=3, left_pad=left_pad)
        assert_same_step(reference, lean)
        assert lean[2]  # gradients reached the parameters


def test_dropout_masks_differ_between_seeds():
    """The test's own premise: dropout is on, so another seed gives another step."""
    model, d = build(overrides=DROPOUTS)
    model.double().train()
    a, b = train_step(model, d, seed=3), train_step(model, d, seed=4)
    assert not torch.allclose(a[1], b[1])


@pytest.mark.parametrize("overrides", [{}, {"sf_fusion": "linear-attention"}, {"sf_encoder_output": "both"}])
def test_lean_encoder_equals_reference_in_eval(overrides):
    model, d = build(overrides=overrides)
    model.double().eval()
    tokens = batch_of(d, SENTENCES)
    outs = []
    for lean in (False, True):
        set_lean(model, lean)
        with torch.no_grad():
            outs.append(model.encoder(tokens, src_lengths=tokens.ne(d.pad()).sum(1))["encoder_out"][0])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- pieces
F64 = dict(dtype=torch.float64)


def padding_mask(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    lengths[0] = length
    return torch.arange(length)[None, :] >= lengths[:, None]


def grads_of(fn, inputs, module):
    """(output, grads of the inputs, grads of the module's parameters), backpropagating a fixed weighting."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    module.zero_grad(set_to_none=True)
    out = fn(*inputs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * weights).sum().backward()
    params = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return out.detach(), [t.grad for t in inputs], params


def assert_same(a, b, rtol=1e-10, atol=1e-11):
    torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=atol)
    for x, y in zip(a[1], b[1]):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        torch.testing.assert_close(a[2][name], b[2][name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("use_boundary", [True, False])
@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "keep"])
def test_boundary_relative_attention_function_equals_reference(recompute, use_boundary):
    torch.manual_seed(4)
    att = BoundaryRelativeSelfAttention(8, 2, dropout=0.3, max_distance=3, recompute=recompute).double().train()
    norm = torch.nn.LayerNorm(8).double()
    with torch.no_grad():
        norm.weight.normal_(1, 0.1)
        norm.bias.normal_(0, 0.1)
    module = torch.nn.ModuleDict(dict(att=att, norm=norm))
    x = torch.randn(13, 3, 8, **F64)
    pad = padding_mask(3, 13, seed=8)
    groups = (torch.arange(13)[None, :] // 3 + 1).expand(3, -1).masked_fill(pad, 0)
    side = dict(fast_band=boundary_band(groups, 3, use_boundary), fast_padding_mask=pad)
    results = []
    for fn in (lambda a: att(norm(a), pad, groups, use_boundary=use_boundary),
               lambda a: att.forward_lean(a, norm, side)):
        torch.manual_seed(9)
        with logical_dropout():
            results.append(grads_of(fn, [x], module))
    assert_same(*results)


def test_boundary_relative_attention_compiled_form_equals_reference():
    """Traced by dynamo, the function's scaled products take their compiled form (``fast_attention._scaled``: the
    product, then the scale, which inductor fuses; no beta-0 product on a scalar, which a GPU fills and expands in
    two kernels of its own). Real tracing (AOTAutograd, no inductor), float64, padded, training with dropout:
    the same output and gradients as the reference modules, and no such product left in either graph."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch.manual_seed(4)
    att = BoundaryRelativeSelfAttention(8, 2, dropout=0.3, max_distance=3).double().train()
    norm = torch.nn.LayerNorm(8).double()
    module = torch.nn.ModuleDict(dict(att=att, norm=norm))
    x = torch.randn(13, 3, 8, **F64)
    pad = padding_mask(3, 13, seed=8)
    groups = (torch.arange(13)[None, :] // 3 + 1).expand(3, -1).masked_fill(pad, 0)
    side = dict(fast_band=boundary_band(groups, 3), fast_padding_mask=pad)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(lambda a: att.forward_lean(a, norm, side), backend=backend, fullgraph=True)
    results = []
    torch._dynamo.reset()
    try:
        for fn in (lambda a: att(norm(a), pad, groups), compiled):
            torch.manual_seed(9)
            with logical_dropout():
                results.append(grads_of(fn, [x], module))
    finally:
        torch._dynamo.reset()
    assert_same(*results)
    graphs = [str(g.graph) for g in backend.fw_graphs + backend.bw_graphs]
    assert len(graphs) == 2 and all("baddbmm" not in g and "new_empty" not in g for g in graphs), graphs


def _band_function_inputs():
    """(padding mask, cols, valid, heads, [x, ln_w, ln_b, w, b, rel_k, rel_v]) of a small float64 case of
    :class:`BoundaryRelativeAttention` (k = 2, two heads), the tensors requiring gradients."""
    torch.manual_seed(5)
    batch, length, dim, heads = 2, 7, 4, 2
    pad = padding_mask(batch, length, seed=3)
    groups = (torch.arange(length)[None, :] // 2 + 1).expand(batch, -1).masked_fill(pad, 0)
    cols, valid = boundary_band(groups, 2)
    args = [torch.randn(length * batch, dim, **F64), 1 + 0.1 * torch.randn(dim, **F64), 0.1 * torch.randn(dim, **F64),
            torch.randn(3 * dim, dim, **F64) / 2, torch.randn(3 * dim, **F64) / 4, torch.randn(5, dim // heads, **F64),
            torch.randn(5, dim // heads, **F64)]
    return pad, cols, valid, heads, [a.requires_grad_() for a in args]


@pytest.mark.parametrize("use_boundary", [True, False])
def test_band_terms_added_by_index_equal_the_scatter(use_boundary):
    """``add_band``'s compiled form (each band entry read by index in an element-wise sum, which inductor fuses into
    the next kernel) adds what the eager ``scatter_add_`` adds, to the same elements: float64, a padded batch, the
    clamped columns at both ends of the sentences, k = 3 > some words' length; the values bit for bit and the
    gradients of both operands."""
    from umst_plugin.modules.transformer_sf.fast_attention import add_band

    torch.manual_seed(2)
    batch, heads, length, k = 3, 2, 11, 3
    pad = padding_mask(batch, length, seed=5)
    groups = (torch.arange(length)[None, :] // 4 + 1).expand(batch, -1).masked_fill(pad, 0)
    cols, valid = boundary_band(groups, k, use_boundary)
    band_cols = cols.unsqueeze(1).expand(-1, heads, -1, -1)
    full = torch.randn(batch, heads, length, length, **F64)
    band = torch.randn(batch, heads, length, 2 * k + 1, **F64) * valid.unsqueeze(1)
    weights = torch.randn(batch, heads, length, length, **F64)
    results = []
    for gather in (False, True):
        f, b = full.clone().requires_grad_(), band.clone().requires_grad_()
        out = add_band(f.clone(), b, band_cols, gather=gather)
        (out * weights).sum().backward()
        results.append((out.detach(), f.grad, b.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    # a band entry of an invalid pair is never read (it is zero here): compare the gradients where it is valid
    torch.testing.assert_close(results[0][2] * valid.unsqueeze(1), results[1][2] * valid.unsqueeze(1),
                               rtol=0, atol=0)
    assert not torch.equal(results[0][0], full)  # the band did add something
    # each form ran as asked: the eager one adds into ``full`` in place, the compiled one reads it
    for gather in (False, True):
        target = full.clone()
        add_band(target, band, band_cols, gather=gather)
        assert torch.equal(target, full) == gather, gather


def test_boundary_relative_attention_gradcheck():
    pad, cols, valid, heads, args = _band_function_inputs()

    def fn(x, ln_w, ln_b, w, b, rel_k, rel_v):
        return BoundaryRelativeAttention.apply(x, ln_w, ln_b, 1e-5, w, b, rel_k, rel_v, cols, valid, pad, heads,
                                               0.7, 0.0)
    assert torch.autograd.gradcheck(fn, args)


class _SizesWatched(torch.Tensor):
    """A tensor (and every tensor computed from it) that records each read of its sizes."""
    reads = []
    NAMES = {torch.Tensor.size: "size", torch.Tensor.shape.__get__: "shape", torch.Tensor.dim: "dim",
             torch.Tensor.ndim.__get__: "ndim"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.NAMES:
            cls.reads.append(cls.NAMES[func])
        return super().__torch_function__(func, types, args, kwargs or {})


def test_boundary_relative_attention_reads_no_size_of_the_band_indices():
    """The autograd function takes batch, length and 2k + 1 from the padding mask, ``heads`` and the relative
    tables, never from ``cols`` or what is computed from it (the band's columns, the gathered band). Under
    ``--compile`` (dynamic shapes) cols' last size is a symbol that the products with the tables fix to 2k + 1;
    torch 2.11's dynamo (the H200's torch) fails on such a size computed in an autograd function's forward
    (symbolic when traced, a constant when replayed: an AssertionError in ``overwrite_tensor_vt_proxy``), and
    every TranSFormer encoder layer then ran eager on the GPU. torch 2.13 traces either, so this checks the cause
    on any torch: each read of a size of cols or its descendants is recorded, forward and backward."""
    pad, cols, valid, heads, args = _band_function_inputs()
    x, ln_w, ln_b, w, b, rel_k, rel_v = args
    watched = cols.as_subclass(_SizesWatched)
    _SizesWatched.reads = []
    out = BoundaryRelativeAttention.apply(x, ln_w, ln_b, 1e-5, w, b, rel_k, rel_v, watched, valid, pad, heads, 0.7,
                                          0.3)
    torch.as_tensor(out).sum().backward()
    assert _SizesWatched.reads == [], f"sizes of the band indices read: {_SizesWatched.reads}"
    _SizesWatched.reads = []
    watched.size(-1)  # (the recording itself works)
    assert _SizesWatched.reads == ["size"]


@pytest.mark.parametrize("embed,kv_dim,heads", [(64, 4, 4), (32, 4, 4), (8, 32, 2), (16, 8, 2)],
                         ids=["reassociated-premultiplied", "reassociated", "plain", "reassociated-equal-cost"])
def test_cross_granularity_fusion_lean_equals_reference(embed, kv_dim, heads):
    from umst_plugin.modules.transformer_sf.fusion import CrossGranularityFusion
    from umst_plugin.modules.transformer_sf import lean

    torch.manual_seed(2)
    fusion = CrossGranularityFusion("cga", embed, kv_dim, heads, "slow", attention_dropout=0.2).double().train()
    with torch.no_grad():
        for p in fusion.parameters():
            p.add_(0.1 * torch.randn_like(p))  # biases and layer norms away from their initial values
    assert fusion.attn.reassociate == (heads * kv_dim <= embed)
    assert (heads * fusion.attn.width < embed) == (embed == 64)  # the training path pre-multiplies its weights
    x_self, x_other = torch.randn(5, 3, embed, **F64), torch.randn(11, 3, kv_dim, **F64)
    pad = padding_mask(3, 11, seed=6)
    for training in (True, False):
        fusion.train(training)
        results = []
        for mask in (None, lean.additive_mask(pad, torch.float64)):
            torch.manual_seed(7)
            results.append(grads_of(lambda a, b: fusion(a, b, pad, None, mask), [x_self, x_other], fusion))
        assert_same(*results)


def test_linear_attention_fusion_lean_equals_reference():
    from umst_plugin.modules.transformer_sf.fusion import CrossGranularityFusion
    from umst_plugin.modules.transformer_sf import lean

    torch.manual_seed(3)
    fusion = CrossGranularityFusion("linear-attention", 8, 16, 2, "fast", attention_dropout=0.2).double().train()
    x_self, x_other = torch.randn(9, 2, 8, **F64), torch.randn(4, 2, 16, **F64)
    pad = padding_mask(2, 4, seed=1)
    results = []
    for mask in (None, lean.additive_mask(pad, torch.float64)):
        torch.manual_seed(7)
        results.append(grads_of(lambda a, b: fusion(a, b, pad, None, mask), [x_self, x_other], fusion))
    assert_same(*results)


def test_self_attention_lean_equals_fairseq():
    from fairseq.modules import MultiheadAttention
    from umst_plugin.modules.transformer_sf import lean

    torch.manual_seed(3)
    mha = MultiheadAttention(16, 4, dropout=0.2, self_attention=True).double().train()
    x = torch.randn(7, 3, 16, **F64)
    pad = padding_mask(3, 7, seed=2)
    results = []
    torch.manual_seed(5)
    results.append(grads_of(lambda a: mha(query=a, key=a, value=a, key_padding_mask=pad, need_weights=False)[0],
                            [x], mha))
    torch.manual_seed(5)
    results.append(grads_of(lambda a: lean.multihead_self_attention(mha, a, lean.additive_mask(pad, torch.float64),
                                                                    True), [x], mha))
    assert_same(*results)


def test_lean_group_gcn_equals_group_gcn():
    from umst_plugin.modules.transformer_sf import lean
    from umst_plugin.modules.common.group_gcn import GroupGCN

    torch.manual_seed(6)
    gcn = GroupGCN(8, dropout=0.3, activation_dropout=0.2).double().train()
    with torch.no_grad():
        gcn.layer_norm.weight.normal_(1, 0.1)
        gcn.layer_norm.bias.normal_(0, 0.1)
    x = torch.randn(10, 3, 8, **F64)
    pad = padding_mask(3, 10, seed=4)
    groups = (torch.arange(10)[None, :] // 3 + 1).expand(3, -1).masked_fill(pad, 0)
    rows = lean.gcn_rows(groups, 10 // 3 + 2)
    results = []
    for fn in (lambda a: gcn(a, groups, time_first=True, num_groups=10 // 3 + 2),
               lambda a: lean.lean_gcn(gcn, a, rows, True)):
        torch.manual_seed(2)
        with logical_dropout():
            results.append(grads_of(fn, [x], gcn))
    assert_same(*results)
    assert torch.isfinite(results[1][0]).all()
    torch.testing.assert_close(results[1][0][pad.t()], x[pad.t()])  # padding rows: the input back


def test_lean_ffn_and_layer_norm_linear_equal_their_modules():
    from umst_plugin.modules.transformer_sf import lean
    from umst_plugin.modules.transformer_sf.layer import PreNormFFN

    torch.manual_seed(8)
    ffn = PreNormFFN(8, 24, dropout=0.3, activation_dropout=0.2).double().train()
    x = torch.randn(6, 2, 8, **F64)
    results = []
    for fn in (lambda a: ffn(a), lambda a: lean.lean_ffn(ffn, a, True)):
        torch.manual_seed(1)
        with logical_dropout():
            results.append(grads_of(fn, [x], ffn))
    assert_same(*results)
    ln, linear = ffn.layer_norm, ffn.fc1
    module = torch.nn.ModuleList([ln, linear])
    a = grads_of(lambda t: linear(ln(t)), [x], module)
    b = grads_of(lambda t: lean.layer_norm_linear(ln, t, linear.weight, linear.bias), [x], module)
    assert_same(a, b)


# ----------------------------------------------------------------------------- bf16, flags, launches, memory
def test_lean_encoder_close_to_reference_under_bf16_autocast():
    # attention dropout off: on a CPU in bf16 fairseq's attention (the reference) draws its mask inside torch's
    # kernel, the lean path in the plugin's explicit attention (``modules.common.attention``), so they differ
    model, d = build(overrides={**DROPOUTS, "attention_dropout": 0.0})
    model.train()
    steps = []
    for lean_path in (False, True):
        set_lean(model, lean_path)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            steps.append(train_step(model, d, seed=3))
    (enc_a, out_a, grads_a), (enc_b, out_b, grads_b) = steps
    torch.testing.assert_close(enc_a.float(), enc_b.float(), rtol=0.05, atol=0.05)
    # bf16 rounding differs between the paths (products regrouped, ReLUs flip near 0): relative norms within 10%;
    # gradients that are 0 in exact arithmetic (k_proj.bias: softmax ignores it) are bf16 noise in both
    floor = 0.01 * max(g.norm() for g in grads_a.values())
    for name in grads_a:
        assert torch.isfinite(grads_b[name]).all(), name
        assert (grads_a[name] - grads_b[name]).norm() / grads_a[name].norm().clamp(min=floor) < 0.1, name


def test_recompute_flag_and_default():
    model, _ = build()
    assert not any(layer.recompute_fast for layer in model.encoder.stack.layers)  # kept by default
    model, _ = build(overrides={"sf_recompute_fast": True})
    assert all(layer.recompute_fast for layer in model.encoder.stack.layers)
    model, _ = build(overrides={"sf_keep_fast_activations": True})
    assert not any(layer.recompute_fast for layer in model.encoder.stack.layers)
    with pytest.raises(ValueError, match="contradict"):
        build(overrides={"sf_recompute_fast": True, "sf_keep_fast_activations": True})


def launches_and_saved(model, d):
    """Kernel launches and saved bytes of the encoder's forward and backward (training mode)."""
    tokens = batch_of(d, SENTENCES)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    model.zero_grad(set_to_none=True)
    counter = KernelLaunches()
    torch.manual_seed(0)
    with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model.encoder(tokens, src_lengths=tokens.ne(d.pad()).sum(1))["encoder_out"][0]
        loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum()
    with counter:
        loss.backward()
    return counter.total, sum(seen.values())


def test_lean_encoder_launches_fewer_kernels_and_keeps_less():
    model, d = build(overrides=DROPOUTS)
    model.train()
    set_lean(model, False)
    ref_launches, ref_saved = launches_and_saved(model, d)
    set_recompute(model, True)
    ref_recompute_launches, _ = launches_and_saved(model, d)
    set_lean(model, True)
    recompute_launches, recompute_saved = launches_and_saved(model, d)
    set_recompute(model, False)
    keep_launches, keep_saved = launches_and_saved(model, d)
    print(f"\nlaunches of the encoder's training step (tiny model): reference {ref_launches} kept / {ref_recompute_launches} "
          f"recomputed, lean {keep_launches} kept / {recompute_launches} recomputed; saved bytes: reference "
          f"{ref_saved}, lean {keep_saved} kept / {recompute_saved} recomputed")
    assert keep_launches < 0.85 * ref_launches
    assert recompute_launches < 0.75 * ref_recompute_launches
    assert keep_launches < recompute_launches
    assert keep_saved < ref_saved and recompute_saved < keep_saved


# ----------------------------------------------------------------------------- character table
def reference_char_batch(table, src_tokens, char_len):
    """``CharTable.forward`` as it was before its ops were merged (three placements, one per output)."""
    word_ids = table.word_ids(src_tokens)
    valid = word_ids > 0
    starts_word = valid.clone()
    starts_word[:, 1:] &= word_ids[:, 1:] != word_ids[:, :-1]
    sep_before = (starts_word & (word_ids > 1)).long()
    n_chars = table.token_num_chars[src_tokens].long() * valid.long()
    ends = torch.cumsum(n_chars + sep_before, dim=1)
    batch, seq_len = src_tokens.shape
    starts = ends - (n_chars + sep_before)
    width = char_len + 1
    max_chars = table.token_chars.size(1)
    k = torch.arange(max_chars)
    char_valid = k.view(1, 1, -1) < n_chars.unsqueeze(-1)
    dest = (starts + sep_before).unsqueeze(-1) + k.view(1, 1, -1)
    dest = torch.where(char_valid, dest, torch.full_like(dest, char_len))
    row = torch.arange(batch).view(-1, 1, 1) * width
    flat_dest = (row + dest).view(-1)
    sep_dest = torch.where(sep_before.bool(), starts, torch.full_like(starts, char_len))
    flat_sep = (row.view(-1, 1) + sep_dest).view(-1)
    token_char_ids = table.token_chars[src_tokens].long()
    token_col = torch.arange(1, seq_len + 1).view(1, -1).expand(batch, -1)

    def place(per_char, per_sep):
        out = torch.zeros(batch * width, dtype=torch.long)
        out.index_put_((flat_dest,), per_char.reshape(-1))
        out.index_put_((flat_sep,), per_sep.reshape(-1))
        return out.view(batch, width)[:, :char_len]

    from umst_plugin.modules.transformer_sf.char_table import CHAR_SEP
    return (place(token_char_ids, torch.full_like(sep_before, CHAR_SEP)),
            place((2 * word_ids).unsqueeze(-1).expand(-1, -1, max_chars), 2 * word_ids - 1),
            place(token_col.unsqueeze(-1).expand(-1, -1, max_chars), token_col), word_ids)


@pytest.mark.parametrize("symbols", ["bpe", "spm"])
def test_char_table_equals_its_reference_on_random_batches(symbols):
    from test_transformer_sf import BPE_SYMBOLS, SPM_SYMBOLS, make_dict
    from umst_plugin.modules.transformer_sf.char_table import CharTable

    d = make_dict(BPE_SYMBOLS if symbols == "bpe" else SPM_SYMBOLS)
    table = CharTable.from_dictionary(d)
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        batch, width = 1 + trial % 4, 1 + trial % 9
        tokens = torch.randint(0, len(d), (batch, width), generator=g)  # specials and fillers included
        lengths = torch.randint(1, width + 1, (batch,), generator=g)
        for left_pad in (True, False):
            padded = torch.full_like(tokens, d.pad())
            for b in range(batch):
                row = tokens[b, : lengths[b]].clone()
                row = row.masked_fill(row.eq(d.pad()), d.eos())
                row[-1] = d.eos()
                if left_pad:
                    padded[b, width - lengths[b]:] = row
                else:
                    padded[b, : lengths[b]] = row
            char_len = table.max_char_length(padded)
            got = table(padded, char_len=char_len)
            want = reference_char_batch(table, padded, char_len)
            for a, b in zip((got.chars, got.char_groups, got.char_token_index, got.token_word_ids), want):
                assert torch.equal(a, b)


# ----------------------------------------------------------------------------- --compile's input region
def test_compiled_input_region_equals_the_reference_in_float64():
    """Under --compile the encoder's input region (``SlowFastInput``: the character table, both embeddings, the
    lean path's plan and the subword GCN on the input) is one compiled program. Compiled alone (the blocks eager)
    as dynamo and AOTAutograd make it, forward and backward graphs with inductor's decompositions, run without
    inductor's code generation (``aot_eager_decomp_partition``: seconds instead of a minute; test_compile.py
    compares the whole model compiled by inductor with eager), in float64, training mode with dropout under the
    same masks, both padding sides, with no host-side character length (the encoder reads it before the compiled
    region): the step equals the reference modules' eager step."""
    from umst_dev import compiled_layers
    from umst_plugin import compilation

    model, d = build(overrides=DROPOUTS)
    model.double().train()
    set_lean(model, False)
    reference = [train_step(model, d, seed=3, left_pad=left_pad) for left_pad in (True, False)]
    set_lean(model, True)
    compilation.compile_layers(model, backend="aot_eager_decomp_partition")
    for _, layer in compilation.find_layers(model):
        if layer is not model.encoder.inputs:  # only the input region compiled
            layer.__dict__.pop("_umst_compiled")
            layer.__dict__.pop("forward")
    graphs = compilation.compiled_graphs()
    for left_pad, want in zip((True, False), reference):
        assert_same_step(want, train_step(model, d, seed=3, left_pad=left_pad))
    assert compilation.compiled_graphs() > graphs and not compiled_layers.eager_variants()  # compiled, no fall back


def test_compiled_bf16_cross_attention_gradients_equal_eager():
    """The slow branch's cross-granularity attention at kv_dim 32 (the paper's character width), pre-multiplied
    training path, under bf16 autocast with attention dropout, compiled by inductor: every gradient equals the
    eager one (the same dropout masks: inductor's ``fallback_random``). With the widened key/value maps built by
    concatenating a zero tensor, the compiled backward gave the key and value weights uninitialized memory
    (NaN, inf, values near 3e38) at these sizes, and at base width a compiled transformer_sf_base never made a
    finite bf16 update. Widths 128/32 with 2 heads are the smallest found that showed it."""
    import torch._inductor.config as inductor_config

    from umst_plugin.compilation import dispatch

    torch.manual_seed(0)
    attn = WidthChangingAttention(128, 32, 2, dropout=0.1).train()
    assert attn.reassociate and attn.training and 2 * attn.width < 128  # the pre-multiplied path
    q_norm, kv_norm = torch.nn.LayerNorm(128), torch.nn.LayerNorm(32)
    x_q, x_kv = torch.randn(20, 32, 128), torch.randn(90, 32, 32)
    lengths = torch.randint(10, 91, (32,))
    mask = torch.zeros(32, 1, 1, 90).masked_fill((torch.arange(90) >= lengths[:, None]).view(32, 1, 1, 90),
                                                  float("-inf"))
    modules = (attn, q_norm, kv_norm)

    def step(forward):
        for m in modules:
            m.zero_grad(set_to_none=True)
        inputs = [x_q.clone().requires_grad_(), x_kv.clone().requires_grad_()]
        torch.manual_seed(5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(attn, inputs[0], q_norm, inputs[1], kv_norm, mask)
        out.float().square().mean().backward()
        return dict(output=out.float(), x_query=inputs[0].grad, x_kv=inputs[1].grad,
                    **{f"{i}.{n}": p.grad for i, m in enumerate(modules) for n, p in m.named_parameters()})

    eager = step(WidthChangingAttention.forward_lean)
    dispatch.configure_dynamo()
    compiled_forward = torch.compile(WidthChangingAttention.forward_lean, dynamic=True, fullgraph=True)
    with inductor_config.patch(fallback_random=True):
        compiled = step(compiled_forward)
    assert eager.keys() == compiled.keys()
    for name, want in eager.items():
        got = compiled[name]
        assert torch.isfinite(got).all(), (name, got)
        if name == "0.k_proj.bias":  # zero up to rounding: softmax ignores a per-query constant
            assert got.abs().max() < 1e-6, got
            continue
        # bf16 rounding: the compiled code fuses and orders its products differently
        assert (got - want).abs().max() <= 0.02 * want.abs().max(), (name, (got - want).abs().max(), want.abs().max())


@pytest.mark.parametrize("overrides", [{}, {"sf_fusion": "linear-attention"}], ids=["default", "linear-attention"])
def test_fairseqs_attention_modules_run_themselves_only_where_a_hook_listens(overrides):
    """The lean path calls the weights of fairseq's attention modules (the subword self-attention; the
    linear-attention ablation's cross attention) through its own functions, unless a hook listens on a module
    (``lean.unhooked``: umst-inspect records attention weights through hooks): then the module itself runs and the
    hook sees it. The encoder's output is the same either way (float64, evaluation)."""
    model, d = build(overrides=overrides)
    model.double().eval()
    modules = [layer.slow_attn for layer in model.encoder.stack.layers]
    if overrides:
        modules += [layer.slow_fusion.attn for layer in model.encoder.stack.layers if layer.slow_fusion is not None]
    calls = []
    for m in modules:
        m.forward = lambda *a, _m=m, **k: calls.append(_m) or type(_m).forward(_m, *a, **k)
    tokens = batch_of(d, SENTENCES)
    with torch.no_grad():
        unhooked = model.encoder(tokens, src_lengths=tokens.ne(d.pad()).sum(1))["encoder_out"][0]
        assert calls == []
        heard = []
        hooks = [m.register_forward_hook(lambda m, args, out: heard.append(m)) for m in modules]
        hooked = model.encoder(tokens, src_lengths=tokens.ne(d.pad()).sum(1))["encoder_out"][0]
        for hook in hooks:
            hook.remove()
    assert sorted(map(id, calls)) == sorted(map(id, modules)) == sorted(map(id, heard))
    # the lean functions against fairseq's module: measured at most 1.3e-15 apart (outputs up to 3.0)
    torch.testing.assert_close(hooked, unhooked, atol=1e-13, rtol=0)
