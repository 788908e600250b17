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
from umst_plugin.op_counts import KernelLaunches

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
