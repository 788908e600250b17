"""The lean paths of Prime's layers equal the straightforward ones (float64, padded batches, training with the same
dropout and DropConnect masks, outputs and gradients), and launch few kernels:

* the convolution cells of Eq. 7 mixed into one dynamic convolution (``MultiKernelConv``) vs. each cell convolved
  alone by the loop over its taps and the outputs mixed by softmax(alpha), as the layer computed it before;
* the per-branch output dropout over one stacked tensor (fused form in training) vs. branch by branch
  (``--prime-unfused-projections``, the form the equations are written in);
* the additive attention masks built once per stack (``_MaskMemo``) vs. built in every layer;
* incremental decoding from one key/value cache that the convolution reads too (``tests/test_prime.py`` checks
  incremental = full decoding for every ablation; here the launches of a step and the cache refresh).
"""
import itertools

import pytest
import torch
import torch.nn.functional as F

from test_prime import ARCH_VARIANTS, batch, reference_attention_branch, stepwise_and_full_decoding, tiny
from umst_plugin.modules.prime import dynamic_conv
from umst_plugin.modules.prime import layer as prime_layer
from umst_plugin.modules.prime.dynamic_conv import reference_dynamic_convolution
from umst_plugin.modules.prime.layer import PrimeLayer, _MaskMemo
from umst_plugin.modules.prime.multi_kernel_conv import MultiKernelConv
from umst_dev.op_counts import KernelLaunches


def reference_multi_kernel_conv(conv, x, padding_mask, keep):
    """The layer's convolution branch as it was computed before (and as Eq. 7 reads): input zeroed at padding, each
    cell's kernels predicted, normalised, DropConnect-ed (its slice of ``keep``) and convolved by the loop over its
    taps, the cell outputs weighted by softmax(alpha) and summed."""
    if padding_mask is not None:
        x = x.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)
    T, B, _ = x.shape
    p = conv.cells[0].weight_dropout
    slices = [None] * len(conv.cells) if keep is None else keep.split(conv.kernel_sizes, dim=-1)
    gates = torch.softmax(conv.gate_logits, 0) if conv.gate_logits is not None else [1.0]
    out = 0
    for g, cell, kp in zip(gates, conv.cells, slices):
        logits = cell.weight_linear(x).view(T, B, cell.num_heads, cell.kernel_size)
        out = out + g * reference_dynamic_convolution(x, logits, cell.padding_l, kp, p)
    return out


@pytest.mark.parametrize("kernels", [(3, 15), (3,), (2, 4), (2, 5, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_mixed_cells_equal_each_cell_convolved_alone(kernels, causal, monkeypatch):
    """Training with DropConnect (the same masks), padded batch (left and right padding): output and gradients of
    the input, every cell's kernel predictor and the gate logits."""
    torch.manual_seed(0)
    C, H, T, B = 8, 2, 11, 3
    conv = MultiKernelConv(C, kernels, num_heads=H, causal=causal, weight_dropout=0.3).double().train()
    if conv.gate_logits is not None:
        with torch.no_grad():
            conv.gate_logits.copy_(torch.randn(len(kernels)))
    drawn = []
    draw = dynamic_conv.dropconnect_keep
    monkeypatch.setattr(dynamic_conv, "dropconnect_keep", lambda *a: drawn.append(draw(*a)) or drawn[-1])
    v = torch.randn(T, B, C, dtype=torch.double)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, :3] = True
    pad[2, -4:] = True
    grad = torch.randn(T, B, C, dtype=torch.double)

    def run(fn):
        conv.zero_grad()
        x = v.clone().requires_grad_()
        out = fn(x)
        out.backward(grad)
        return [out.detach(), x.grad] + [p.grad.clone() for p in conv.parameters()]

    lean = run(lambda x: conv(x, padding_mask=pad))
    assert len(drawn) == 1 and drawn[0].shape == (T, B, H, sum(kernels))
    ref = run(lambda x: reference_multi_kernel_conv(conv, x, pad, drawn[0]))
    for a, b in zip(lean, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    conv.eval()  # no DropConnect: the same without a mask
    torch.testing.assert_close(conv(v, padding_mask=pad), reference_multi_kernel_conv(conv, v, pad, None),
                               rtol=1e-12, atol=1e-12)


def slab_dropout_factory():
    """A dropout whose masks do not depend on how the calls are batched: a 4-d input (the stacked branch outputs,
    n x T x B x d) takes one mask per slab, each as a separate 3-d call would get it, from a counter of calls."""
    counter = itertools.count()

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        shape = x.shape[1:] if x.dim() == 4 else x.shape
        slabs = x.size(0) if x.dim() == 4 else 1
        masks = [torch.rand(shape, generator=torch.Generator().manual_seed(next(counter)), dtype=x.dtype) >= p
                 for _ in range(slabs)]
        mask = torch.stack(masks) if x.dim() == 4 else masks[0]
        return x * mask.to(x.dtype) / (1 - p)
    return dropout


def fused_or_branchwise_step(model, src, lengths, prev, fused, monkeypatch, after_forward=None):
    """One training step of ``model`` with every layer's ``fused`` set, the same dropout masks in either form
    (``slab_dropout_factory``, DropConnect from seed 4): (output, every parameter's gradient, what
    ``after_forward()`` returned right after the forward, or None)."""
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        layer.fused = fused
    monkeypatch.setattr(F, "dropout", slab_dropout_factory())
    model.zero_grad()
    torch.manual_seed(4)  # the DropConnect masks
    out = model(src, lengths, prev)[0]
    seen = after_forward() if after_forward is not None else None
    out.logsumexp(-1).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], seen


@pytest.mark.parametrize("arch,extra", ARCH_VARIANTS)
def test_stacked_output_dropout_equals_branch_by_branch(arch, extra, monkeypatch):
    """Training with output, activation and DropConnect dropout on a padded batch: the fused form (one dropout
    over the stacked branch outputs) equals the branch-by-branch form with the same masks, outputs and every
    parameter's gradient, float64."""
    model, _ = tiny(arch, dropout=0.3, activation_dropout=0.2, prime_conv_weight_dropout=0.2, **extra)
    model = model.double().train()
    src, lengths, prev = batch()

    def run(fused):
        return fused_or_branchwise_step(model, src, lengths, prev, fused, monkeypatch)[:2]

    (fused, g_fused), (unfused, g_unfused) = run(True), run(False)
    assert len(g_fused) == len(g_unfused)
    torch.testing.assert_close(fused, unfused, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_fused, g_unfused):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


WHOLE_CHUNK_FFN = [  # FFN widths that are whole multiples of d (16): the output projection as one batched product
    pytest.param("prime_base", {"encoder_ffn_embed_dim": 32, "decoder_ffn_embed_dim": 32}, id="prime_ffn2d"),
    pytest.param("prime_simple_base", {"encoder_ffn_embed_dim": 48, "decoder_ffn_embed_dim": 48}, id="simple_ffn3d"),
    pytest.param("prime_base", {"encoder_ffn_embed_dim": 32, "decoder_ffn_embed_dim": 32, "separate_projection": True,
                                "input_dropout": 0.2}, id="separate_projection_input_dropout"),
    pytest.param("prime_base", {"ffn_shares_conv_projection": True, "prime_kernels": "3"}, id="ffn_shares_conv"),
    pytest.param("prime_base", {"no_ffn": True}, id="no_ffn"),
]


@pytest.mark.parametrize("arch,extra", WHOLE_CHUNK_FFN)
def test_batched_output_projection_equals_branch_by_branch(arch, extra, monkeypatch):
    """Training with every dropout on, padded batch, float64: the branches' output projections as one batched
    product over d-wide chunks (an FFN of 2 or 3 chunks summing its chunks' products) equal the branch-by-branch
    form under the same masks, outputs and every parameter's gradient; and the layer takes that path."""
    model, _ = tiny(arch, dropout=0.3, activation_dropout=0.2, prime_conv_weight_dropout=0.2, **extra)
    model = model.double().train()
    src, lengths, prev = batch()
    batched = []
    bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: batched.append(a.shape) or bmm(a, b))

    def run(fused):
        batched.clear()
        return fused_or_branchwise_step(model, src, lengths, prev, fused, monkeypatch,
                                        after_forward=lambda: list(batched))

    (fused, g_fused, products), (unfused, g_unfused, _) = run(True), run(False)
    layers = len(model.encoder.layers) + len(model.decoder.layers)
    # one batched projection per layer (the last decoder layer's attention for alignment multiplies per head, width 8)
    assert len([shape for shape in products if shape[-1] == 16]) == layers, products
    assert len(g_fused) == len(g_unfused)
    torch.testing.assert_close(fused, unfused, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_fused, g_unfused):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_batched_output_projection_under_bf16_autocast(monkeypatch):
    """Under bf16 autocast the batched output projection runs its products in bf16, backward too, and its output
    and gradients stay close to the branch-by-branch form (dropout off: the same function), all finite. Close:
    the norm of the difference within 1% of the output's norm and 3% of each of the 43 gradients' (measured:
    0.40% and at most 1.15%, bf16 rounding; a margin of 2.5x), so a gradient halved, or a product's gradient
    lost, fails (0.5 and 1 of its norm)."""
    model, _ = tiny("prime_base", encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32)
    model.train()
    src, lengths, prev = batch()
    dtypes = []
    bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: dtypes.append((a.dtype, b.dtype)) or bmm(a, b))

    def run(fused):
        for layer in list(model.encoder.layers) + list(model.decoder.layers):
            layer.fused = fused
            layer.dropout = 0.5 if fused else 0.0  # the fused form takes the batched path only with output dropout
            layer.training = True
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(src, lengths, prev)[0]
        out.float().logsumexp(-1).sum().backward()
        return out.float().detach(), [(n, p.grad.clone()) for n, p in model.named_parameters() if p.grad is not None]

    monkeypatch.setattr(F, "dropout", lambda x, p=0.5, training=True, inplace=False: x)  # masks of ones
    (fused, g_fused), (unfused, g_unfused) = run(True), run(False)
    layers = len(model.encoder.layers) + len(model.decoder.layers)
    assert dtypes.count((torch.bfloat16, torch.bfloat16)) >= 3 * layers, dtypes  # forward and both backward products
    assert _relative_difference(fused, unfused) <= 0.01
    assert len(g_fused) == len(g_unfused) == 43
    for (name, a), (_, b) in zip(g_fused, g_unfused):
        assert a.dtype == torch.float32 and torch.isfinite(a).all()
        assert _relative_difference(a, b) <= 0.03, name


def _relative_difference(got, want):
    """||got - want|| / ||want||: one number per tensor that a tensor scaled by c misses by |1 - c|, whatever its
    magnitude (an elementwise atol passes a small gradient replaced by zeros)."""
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("arch,extra", [ARCH_VARIANTS[0], ARCH_VARIANTS[1]])
@pytest.mark.parametrize("left_pad_target", [False, True])
def test_masks_built_once_per_stack_equal_masks_built_per_layer(arch, extra, left_pad_target, monkeypatch):
    """Every layer of a stack reuses the additive masks its first layer built; the result equals every layer
    building its own (training, padded source and target, fp64, gradients too)."""
    model, _ = tiny(arch, **extra)
    model = model.double().train()
    src, lengths, prev = batch()
    if left_pad_target:
        prev[1, :2] = 1
    else:
        prev[2, -2:] = 1

    built = []
    get = _MaskMemo.get

    def counting_get(self, name, inputs, args, build):
        return get(self, name, inputs, args, lambda: built.append(name) or build())

    def run(shared):
        if not shared:
            monkeypatch.setattr(_MaskMemo, "get", lambda self, name, inputs, args, build: build())
        else:
            monkeypatch.setattr(_MaskMemo, "get", counting_get)
        model.zero_grad()
        out = model(src, lengths, prev)[0]
        out.logsumexp(-1).sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (shared, g_shared), (alone, g_alone) = run(True), run(False)
    assert sorted(built) == ["cross", "self", "self_causal"]  # once per stack, not once per layer
    torch.testing.assert_close(shared, alone, rtol=0, atol=0)
    for a, b in zip(g_shared, g_alone):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_additive_self_mask_is_the_boolean_mask():
    """The causal mask with key padding, padded query rows unblocked: 0 where allowed, -inf where blocked."""
    layer = PrimeLayer(8, 2, 12, causal=True, conv_type=None)
    pad = torch.tensor([[True, True, False, False], [False, False, False, True]])
    mask = layer._self_attention_mask(pad, 4, True, torch.float32, "cpu")
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    blocked = (causal | pad[:, None, None, :]) & ~pad[:, None, :, None]
    assert mask.shape == (2, 1, 4, 4)
    assert torch.equal(mask == float("-inf"), blocked) and torch.equal(mask[~blocked], torch.zeros(int((~blocked).sum())))
    assert layer._self_attention_mask(None, 4, False, torch.float32, "cpu") is None


def test_mask_memo_rebuilds_for_other_inputs():
    memo, calls = _MaskMemo(), []

    def build():
        calls.append(1)
        return torch.zeros(1)

    pad = torch.zeros(2, 3, dtype=torch.bool)
    first = memo.get("self", (pad,), (3,), build)
    assert memo.get("self", (pad,), (3,), build) is first and len(calls) == 1
    memo.get("self", (pad.clone(),), (3,), build)  # another tensor
    memo.get("self", (pad,), (3,), build)
    pad[0, 0] = True  # changed in place
    memo.get("self", (pad,), (3,), build)
    memo.get("self", (pad,), (4,), build)  # other arguments
    assert len(calls) == 5


def test_masks_are_shared_by_the_layers_of_a_stack():
    model, _ = tiny("prime_base")
    memos = {id(layer._mask_memo) for layer in model.encoder.layers}
    assert len(memos) == 1
    assert {id(layer._mask_memo) for layer in model.decoder.layers} != memos
    assert len({id(layer._mask_memo) for layer in model.decoder.layers}) == 1


def _prime_base_launches(kernels):
    model, _ = tiny("prime_base", prime_kernels=kernels, dropout=0.3, prime_conv_weight_dropout=0.1)
    model.train()
    src, lengths, prev = batch()
    with KernelLaunches() as k:
        with k.in_phase("forward"):
            out = model(src, lengths, prev)[0]
        with k.in_phase("backward"):
            out.sum().backward()
    return k.by_phase["forward"], k.by_phase["backward"]


def test_training_launches_do_not_depend_on_the_kernel_sizes():
    """Forward and backward of a Prime model launch as many kernels with cells 3,15 as with 3,31 or 2,4: no loop
    over taps, heads or cells of equal count; and few per layer (2+2 layers here)."""
    counts = _prime_base_launches("3,15")
    assert counts == _prime_base_launches("3,31") == _prime_base_launches("2,4")
    forward, backward = counts
    assert forward <= 195 and backward <= 220, counts  # measured: 188, 214 (about 60 and 50 outside the layers)


def _decoding_step_launches(model, bsz=2, steps=3):
    src, lengths, prev = batch(bsz=bsz, tgt_len=steps + 1)
    with torch.no_grad():
        enc, state = model.encoder(src, lengths), {}
        for t in range(steps):
            model.decoder(prev[:, :t + 1], enc, incremental_state=state)
        with KernelLaunches() as k:
            model.decoder(prev[:, :steps + 1], enc, incremental_state=state)
    return k.total


def test_decoding_step_launches():
    """A decoding step of a 2-layer Prime decoder: per layer one input projection, one cache concatenation, two
    attentions, the convolution (kernel predictor, softmax, gate mix, window product and sum), the FFN's ReLU, one
    concatenation, one output projection, the residual and the LayerNorm; no per-cell or per-tap work."""
    model, _ = tiny("prime_base")
    prime = _decoding_step_launches(model)
    simple = _decoding_step_launches(tiny("prime_simple_base")[0])
    assert prime - simple == 2 * 5, (prime, simple)  # the convolution: 5 launches per layer
    assert _decoding_step_launches(tiny("prime_base", prime_kernels="3,7,15")[0]) == prime
    assert prime <= 2 * 15 + 20, prime


def test_joint_kernel_predictor_follows_parameter_updates():
    """The inference cache of the joint kernel predictor (every cell in one multiply) is rebuilt after an in-place
    update of a cell's weights or of the gates: decoding step by step still equals full decoding."""
    model, _ = tiny("prime_base")
    src, lengths, prev = batch(bsz=2, tgt_len=5)

    def check():
        with torch.no_grad():
            stepwise, full = stepwise_and_full_decoding(model, src, lengths, prev)
        torch.testing.assert_close(stepwise, full, rtol=1e-5, atol=1e-5)
        return full

    before = check()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.conv.cells[1].weight_linear.weight.mul_(3.0)
            layer.conv.gate_logits.add_(torch.tensor([1.0, -1.0]))
    after = check()
    assert not torch.allclose(before, after)


def test_a_padded_step_is_zeroed_for_the_convolution():
    """A padded position fed step by step reaches the convolution as zeros, as in full decoding (the convolution
    reads its window from the attention's value cache)."""
    layer = PrimeLayer(8, 2, 12, causal=True, conv_kernels=(3,)).double().eval()
    x = torch.randn(3, 2, 8, dtype=torch.double)
    pad = torch.tensor([[False, False, False], [False, True, False]])
    state = {}
    with torch.no_grad():
        for t in range(3):
            layer(x[t:t + 1], padding_mask=pad[:, t:t + 1], incremental_state=state)
    kv = layer.get_incremental_state(state, "self_attn")["kv"]
    assert torch.equal(kv[1, 1, 8:], torch.zeros(8, dtype=torch.double))
    assert not torch.equal(kv[1, 0, 8:], torch.zeros(8, dtype=torch.double))


def test_layer_equals_eq4_with_dropconnect_in_training(monkeypatch):
    """One encoder layer in training (DropConnect on, output dropout off): the fused layer equals Eq. 4 written out
    with the reference convolution and the same DropConnect mask."""
    torch.manual_seed(1)
    d, H, ffn, T, B = 8, 2, 12, 7, 2
    layer = PrimeLayer(d, H, ffn, conv_kernels=(3, 5), conv_weight_dropout=0.25).double().train()
    drawn = []
    draw = dynamic_conv.dropconnect_keep
    monkeypatch.setattr(dynamic_conv, "dropconnect_keep", lambda *a: drawn.append(draw(*a)) or drawn[-1])
    x = torch.randn(T, B, d, dtype=torch.double)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, :2] = True
    out, _ = layer(x, padding_mask=pad)
    W, b = layer.in_proj_weight, layer.in_proj_bias
    Wo, bo = layer.out_proj_weight, layer.out_proj_bias
    attn = reference_attention_branch(layer, x, d, H, pad)
    v = F.linear(x, W[2 * d:3 * d], b[2 * d:3 * d])
    conv = F.linear(reference_multi_kernel_conv(layer.conv, v, pad, drawn[0]), Wo[:, d:2 * d], bo[1])
    ffn_out = F.linear(F.relu(F.linear(x, W[3 * d:], b[3 * d:])), Wo[:, 2 * d:], bo[2])
    ref = F.layer_norm(x + attn + conv + ffn_out, (d,), layer.layer_norm.weight, layer.layer_norm.bias)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_decoding_under_inference_mode():
    """Masks of inference tensors (no version counter) are cached by identity; step-by-step decoding under
    torch.inference_mode equals full decoding."""
    model, _ = tiny("prime_base")
    src, lengths, prev = batch(bsz=3, tgt_len=5)
    with torch.inference_mode():
        stepwise, full = stepwise_and_full_decoding(model, src, lengths, prev)
    torch.testing.assert_close(stepwise, full, rtol=1e-5, atol=1e-5)
