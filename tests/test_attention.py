"""The fast attention paths equal their explicit references in float64 on padded batches, forward and gradients
(dropout off), and a recomputed core equals the kept one with dropout on (same mask).

* ``modules/common/attention.py``: fused (SDPA) == explicit, boolean and additive masks; the CPU bf16 dropout path;
  the default scale; an additive mask cast to the inputs' dtype; which inputs take the explicit core or recompute;
* UMST: the banded relative-position terms == Shaw et al.'s L x L x d_k formulation (the previous code),
  and the recomputed subword core == the kept one;
* TranSFormer: the fused cross-granularity attention == its explicit (recording) path, both contractions;
  the recomputed fast-branch core == the kept one;
* Prime and MSMSA: the fused path == the explicit path that returns weights.
"""
import math

import pytest
import torch

from umst_plugin.modules.common import attention as attention_module
from umst_plugin.modules.common.attention import additive_mask, attention, explicit_attention

F64 = dict(dtype=torch.float64)


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def grads_of(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    torch.manual_seed(7)
    out.backward(torch.randn_like(out))
    return out.detach(), [t.grad for t in inputs]


def padding_mask(bsz, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (bsz,), generator=g)
    lengths[0] = length
    return torch.arange(length)[None, :] >= lengths[:, None]  # True at padding (right)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_attention_fused_equals_explicit(mask_kind):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, **F64) for _ in range(3))
    pad = padding_mask(3, 7)
    mask = {"none": None, "bool": (~pad)[:, None, None, :],
            "float": torch.zeros(3, 1, 1, 7, **F64).masked_fill(pad[:, None, None, :], float("-inf"))}[mask_kind]
    fused = grads_of(lambda a, b, c: attention(a, b, c, mask, 0.0, 0.3), q, k, v)
    ref = grads_of(lambda a, b, c: explicit_attention(a, b, c, mask, 0.0, 0.3)[0], q, k, v)
    close(fused[0], ref[0])
    for a, b in zip(fused[1], ref[1]):
        close(a, b)


def test_cpu_bf16_dropout_runs_the_explicit_path_in_bf16():
    """torch's SDPA would fall back to its fp32 math path here; the helper keeps the matmuls in bf16."""
    from umst_dev.op_counts import MatmulDtypes

    q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with MatmulDtypes() as counter:
        out = attention(q, k, v, None, 0.1)
        out.float().sum().backward()
    assert counter.total > 0 and counter.fp32_only == 0
    assert out.dtype == torch.bfloat16


def test_the_default_scale_is_one_over_the_root_of_the_head_dim():
    """scale=None: 1 / sqrt(d), d the last dimension (2 heads of 8 here, so another axis would give 1 / sqrt(2)),
    on both paths, against the formula written out."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(3, 2, 7, 8, **F64) for _ in range(3))
    pad = padding_mask(3, 7)
    formula = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(pad[:, None, None, :],
                                                                                  float("-inf")), -1) @ v
    keep = (~pad)[:, None, None, :]
    close(attention(q, k, v, keep), formula)
    close(explicit_attention(q, k, v, keep)[0], formula)


def test_an_additive_mask_of_another_dtype_is_cast_to_the_inputs():
    """torch's fused attention refuses an additive float64 mask on float32 inputs; the helper casts it (0 and -inf
    are exact in every float dtype), giving the boolean mask's result."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(3, 2, 7, 8) for _ in range(3))
    pad = padding_mask(3, 7)
    blocked = pad[:, None, None, :]
    torch.testing.assert_close(attention(q, k, v, additive_mask(blocked, torch.float64)),
                               attention(q, k, v, ~blocked), rtol=0, atol=0)


def test_cpu_bf16_without_dropout_stays_fused(monkeypatch):
    """Only dropout sends CPU bf16 to the explicit core: without it torch's CPU flash kernel runs in bf16."""
    calls = []
    explicit = attention_module.explicit_attention
    monkeypatch.setattr(attention_module, "explicit_attention", lambda *a, **kw: calls.append(1) or explicit(*a, **kw))
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.bfloat16) for _ in range(3))
    assert attention(q, k, v, None, 0.0).dtype == torch.bfloat16 and calls == []
    attention(q, k, v, None, 0.1)
    assert calls == [1]


def test_only_dropout_in_training_recomputes_the_core(monkeypatch):
    """The core is recomputed in backward only where a CPU would otherwise keep the probabilities: dropout on,
    gradients wanted, ``recompute`` left on. Without dropout the fused kernel keeps nothing to recompute."""
    calls = []
    checkpoint = attention_module.checkpoint
    monkeypatch.setattr(attention_module, "checkpoint", lambda *a, **kw: calls.append(1) or checkpoint(*a, **kw))
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    attention(q, k, v, None, 0.0)
    attention(q, k, v, None, 0.1, recompute=False)
    with torch.no_grad():
        attention(q, k, v, None, 0.1)
    assert calls == []
    attention(q, k, v, None, 0.1)
    assert calls == [1]


# ---- UMST -------------------------------------------------------------------------------------------------

def _umst_attention(max_rel=3, dropout=0.0):
    from umst_plugin.modules.umst.rectified_attention import RectifiedSelfAttention

    torch.manual_seed(1)
    return RectifiedSelfAttention(16, 2, attention_dropout=dropout, max_relative_positions=max_rel).double()


def shaw_reference(att, q, k, v, key_pad):
    """Shaw et al. with L x L x d_k relative tables (the formulation this plugin used before the banded one)."""
    length = q.size(2)
    pos = torch.arange(length)
    rel = (pos[None, :] - pos[:, None]).clamp(-att.max_relative_positions, att.max_relative_positions)
    rel = rel + att.max_relative_positions
    rel_k, rel_v = att.rel_keys(rel), att.rel_values(rel)  # L x L x d_k
    scale = 1.0 / math.sqrt(att.head_dim)
    scores = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, rel_k)) * scale
    probs = torch.softmax(scores.masked_fill(key_pad[:, None, None, :], float("-inf")), -1)
    return probs @ v + torch.einsum("bhij,ijd->bhid", probs, rel_v)


def test_umst_banded_relative_terms_equal_shaw_tables():
    att = _umst_attention().eval()
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 2, 9, 8, **F64) for _ in range(3))
    pad = padding_mask(3, 9, seed=3)
    ours = grads_of(lambda a, b, c: att._subword_attention(a, b, c, pad), q, k, v)
    ref = grads_of(lambda a, b, c: shaw_reference(att, a, b, c, pad), q, k, v)
    close(ours[0], ref[0])
    for a, b in zip(ours[1], ref[1]):
        close(a, b)


def test_umst_recomputed_core_equals_the_kept_one_with_dropout():
    att = _umst_attention(dropout=0.3).train()
    q, k, v = (torch.randn(2, 2, 6, 8, **F64) for _ in range(3))
    pad = padding_mask(2, 6, seed=4)
    torch.manual_seed(5)
    recomputed = grads_of(lambda a, b, c: att._subword_attention(a, b, c, pad), q, k, v)
    torch.manual_seed(5)
    kept = grads_of(lambda a, b, c: att._relative_core(a, b, c, pad, 0.3), q, k, v)
    close(recomputed[0], kept[0])
    for a, b in zip(recomputed[1], kept[1]):
        close(a, b)


def test_umst_compiled_form_keeps_the_core_and_equals_the_recomputed_one(monkeypatch):
    """Under --compile the relative core is not checkpointed (the compiler keeps what its backward reads) and its
    q, k, v are copied in one stack: float64, padded, dropout on with the same mask, the same output and gradients
    as the checkpointed form, and no checkpoint taken."""
    from umst_plugin.modules.umst import rectified_attention

    att = _umst_attention(dropout=0.3).train()
    q, k, v = (torch.randn(2, 2, 6, 8, **F64) for _ in range(3))
    pad = padding_mask(2, 6, seed=4)
    torch.manual_seed(5)
    recomputed = grads_of(lambda a, b, c: att._subword_attention(a, b, c, pad), q, k, v)
    checkpoints = []
    monkeypatch.setattr(rectified_attention, "checkpoint", lambda *a, **k: checkpoints.append(a) or None)
    monkeypatch.setattr(rectified_attention, "compiling", lambda: True)
    stacked = []
    real_stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda ts, *a: stacked.append(len(ts)) or real_stack(ts, *a))
    torch.manual_seed(5)
    compiled_form = grads_of(lambda a, b, c: att._subword_attention(a, b, c, pad), q, k, v)
    assert checkpoints == [] and stacked == [3]
    close(recomputed[0], compiled_form[0])
    for a, b in zip(recomputed[1], compiled_form[1]):
        close(a, b)


def test_umst_relative_core_traced_by_dynamo_equals_eager():
    """The compiled form of the relative core as dynamo and AOTAutograd trace it (the stack of q, k, v, no
    checkpoint; ``aot_eager``: the traced forward and backward graphs run as aten ops), float64, padded, training:
    the output and gradients of eager training (dropout off, so both draw nothing)."""
    att = _umst_attention(dropout=0.0).train()
    q, k, v = (torch.randn(2, 2, 6, 8, **F64) for _ in range(3))
    pad = padding_mask(2, 6, seed=4)
    eager = grads_of(lambda a, b, c: att._subword_attention(a, b, c, pad), q, k, v)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda a, b, c: att._subword_attention(a, b, c, pad), backend="aot_eager",
                                 fullgraph=True)
        traced = grads_of(compiled, q, k, v)
    finally:
        torch._dynamo.reset()
    close(eager[0], traced[0])
    for a, b in zip(eager[1], traced[1]):
        close(a, b)


# ---- TranSFormer ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("embed,kv_dim,heads", [(64, 8, 4), (8, 64, 2)], ids=["reassociated", "projected"])
def test_cross_granularity_attention_fused_equals_explicit(embed, kv_dim, heads):
    from umst_plugin.modules.transformer_sf.fusion import WidthChangingAttention

    torch.manual_seed(3)
    att = WidthChangingAttention(embed, kv_dim, heads).double().eval()
    with torch.no_grad():
        att.k_proj.bias.normal_()
        att.v_proj.bias.normal_()
    assert att.reassociate == (heads * kv_dim <= embed)
    query, kv = torch.randn(5, 3, embed, **F64), torch.randn(11, 3, kv_dim, **F64)
    pad = padding_mask(3, 11, seed=6)
    fused = grads_of(lambda a, b: att(a, b, pad), query, kv)
    att.record = []
    explicit = grads_of(lambda a, b: att(a, b, pad), query, kv)
    close(fused[0], explicit[0])
    for a, b in zip(fused[1], explicit[1]):
        close(a, b)


def test_fast_branch_recomputed_core_equals_the_kept_one_with_dropout():
    from umst_plugin.modules.transformer_sf.fast_attention import BoundaryRelativeSelfAttention

    torch.manual_seed(4)
    att = BoundaryRelativeSelfAttention(8, 2, dropout=0.3, max_distance=3).double().train()
    x = torch.randn(13, 3, 8, **F64)
    pad = padding_mask(3, 13, seed=8)
    groups = (torch.arange(13)[None, :] // 3 + 1).expand(3, -1).masked_fill(pad, 0)
    results = []
    for recompute in (True, False):
        att.recompute = recompute
        att.zero_grad()
        torch.manual_seed(9)
        out, (gx,) = grads_of(lambda a: att(a, pad, groups), x)
        results.append((out, gx, att.rel_keys.grad.clone(), att.rel_values.grad.clone()))
    for a, b in zip(*results):
        close(a, b)


# ---- Prime, MSMSA -----------------------------------------------------------------------------------------

def test_prime_fused_attention_equals_the_weights_path():
    from umst_dev import dev

    model, task = dev.build_model("prime_simple_base", dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16,
                                                            decoder_embed_dim=16, encoder_attention_heads=2,
                                                            decoder_attention_heads=2, encoder_ffn_embed_dim=32,
                                                            decoder_ffn_embed_dim=32))
    layer = model.encoder.layers[0].double().eval()
    q, k, v = (torch.randn(7, 3, 16, **F64) for _ in range(3))
    pad = additive_mask(padding_mask(3, 7, seed=10).view(3, 1, 1, 7), torch.float64)
    fused = grads_of(lambda a, b, c: layer._attend(a, b, c, pad)[0], q, k, v)
    explicit = grads_of(lambda a, b, c: layer._attend(a, b, c, pad, need_weights=True)[0], q, k, v)
    close(fused[0], explicit[0])
    for a, b in zip(fused[1], explicit[1]):
        close(a, b)


def test_msmsa_fused_attention_equals_the_weights_path():
    from umst_plugin.modules.msmsa.windowed_attention import _attend

    q, k, v = (torch.randn(2, 3, 6, 8, **F64) for _ in range(3))
    bias = torch.zeros(2, 1, 6, 6, **F64).masked_fill(padding_mask(2, 6, seed=11)[:, None, None, :], -1e9)
    fused = grads_of(lambda a, b, c: _attend(a, b, c, bias, 0.0, False, False)[0], q, k, v)
    explicit = grads_of(lambda a, b, c: _attend(a, b, c, bias, 0.0, False, True)[0], q, k, v)
    close(fused[0], explicit[0])
    for a, b in zip(fused[1], explicit[1]):
        close(a, b)
