"""Launch-lean pieces of TranSFormer's encoder: what every block shares, computed once per forward.

The encoder's blocks read the same graphs: the same-word groups of the subword and the character GCNs, the
boundary band of the character self-attention, the padding masks. :func:`encoder_plan` builds them once per
forward (a handful of small integer ops) instead of once per block and sub-layer, and the blocks use them with
fewer, larger ops:

* the same-group GCNs (UMST Eq. 2 / TranSFormer Eq. 1) run as :class:`LeanGroupGCN`: one custom autograd
  function that keeps the block input, the LayerNorm statistics and 1-byte masks, averages into the plan's
  group rows (``gcn_rows``) and runs its d x d map once per group;
* dropout is ``torch.native_dropout`` (what ``F.dropout`` runs on a GPU: one kernel, a 1-byte mask; on a CPU
  ``F.dropout`` is three ops and keeps a float mask).

Every function here computes what the reference modules compute (``SlowFastConfig.lean=False``):
``tests/test_transformer_sf_lean.py`` checks values and gradients in float64 under the same dropout masks.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward, autocast_cast, compute_dtype  # noqa: F401  (compute_dtype: lean.compute_dtype)
from umst_plugin.modules.common import attention as common_attention
from umst_plugin.modules.common.attention import attention
from umst_plugin.modules.common.lean_ops import dropout_and_mask, dropout_backward, layer_norm_backward
from umst_plugin.modules.common.segment_ops import accumulation_dtype, segment_sum


def gcn_rows(groups: Tensor, num_groups: int) -> Tuple[Tensor, Tensor]:
    """Group rows of a same-group graph for time-first tensors flattened to (L * B) x C rows.

    groups: B x L ids (0 = padding), every id < ``num_groups``. Returns ``(slot, size)``: slot (L * B) long, row
    ``l * B + b`` -> ``b * num_groups + id``; size (B * num_groups) float, the members of each slot (>= 1), inf on
    the padding slots (id 0), so their mean is 0 and padding positions get nothing from the GCN."""
    batch = groups.size(0)
    offsets = torch.arange(batch, device=groups.device).view(-1, 1) * num_groups
    slot = (groups.long() + offsets).t().reshape(-1)
    # out of place (no in-place update of a fresh buffer): inductor compiles it in one program with the GCN
    # (``SlowFastInput`` under --compile); eager, the same number of ops
    size = torch.zeros(batch * num_groups, device=groups.device, dtype=torch.float32).index_add(
        0, slot, torch.ones((), device=groups.device, dtype=torch.float32).expand(slot.numel()))
    size = size.view(batch, num_groups)[:, 1:].clamp(min=1)
    return slot, torch.cat([size.new_full((batch, 1), float("inf")), size], dim=1).view(-1)


def _segment_mean(rows: Tensor, slot: Tensor, size: Tensor) -> Tensor:
    """Per-slot means of ``rows`` (``size``: the slots' sizes, inf on padding slots: mean 0), in rows' dtype."""
    acc = accumulation_dtype(rows.dtype)
    return (segment_sum(rows, slot, size.numel()) / size.to(acc).unsqueeze(-1)).to(rows.dtype)


class LeanGroupGCN(torch.autograd.Function):
    """Flat rows ``x`` (N x C) -> ``x + Drop(Â Drop_act(ReLU(Â LN(x) W + b)))`` for a same-group graph (the
    reference: ``common.group_gcn.GroupGCN``). Â x is the mean of x's group; ``slot`` (N) names each row's group
    row, ``size`` (R) the rows per group (inf on padding groups: their mean is 0, so padding rows get ``x`` back
    and send nothing). The d x d map runs once per group ((Â LN(x)) W = gather((mean LN(x)) W)).

    Keeps ``x``, the LayerNorm statistics and two 1-byte masks (the hidden units that passed both the ReLU and
    the activation dropout; the output dropout); backward recomputes the LayerNorm and one segment mean. The two
    dropouts draw their masks in the reference's order on tensors of the reference's shapes."""

    @staticmethod
    @amp_forward
    def forward(ctx, x, ln_weight, ln_bias, weight, bias, slot, size, eps, p_act, p_out, training):
        normed, mean, rstd = torch.native_layer_norm(x, (x.size(-1),), ln_weight, ln_bias, eps)
        pre = F.linear(_segment_mean(normed, slot, size), weight, bias)  # R x C, once per group
        hidden, keep_act = dropout_and_mask(F.relu(pre).index_select(0, slot), p_act, training)
        passed = hidden > 0  # ReLU > 0 and kept (the dropout's scale keeps the sign)
        branch, keep_out = dropout_and_mask(_segment_mean(hidden, slot, size).index_select(0, slot), p_out,
                                             training)
        ctx.save_for_backward(x, ln_weight, ln_bias, weight, mean, rstd, slot, size, passed, keep_out)
        ctx.eps, ctx.p_act, ctx.p_out = eps, (p_act if keep_act is not None else 0.0), p_out
        return x + branch

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        x, ln_weight, ln_bias, weight, mean, rstd, slot, size, passed, keep_out = ctx.saved_tensors
        need = ctx.needs_input_grad
        g = dropout_backward(grad, keep_out, ctx.p_out)
        # Â and the gathers are symmetric: the adjoint of "mean into groups, gather back" is itself
        g = _segment_mean(g, slot, size).index_select(0, slot)
        g = torch.ops.aten.native_dropout_backward(g, passed, 1.0 / (1.0 - ctx.p_act))  # ReLU and dropout
        g_pre = segment_sum(g, slot, size.numel()).to(g.dtype)  # R x C
        normed = torch.native_layer_norm(x, (x.size(-1),), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
        grad_weight = g_pre.t().mm(_segment_mean(normed, slot, size)) if need[3] else None
        grad_bias = g_pre.sum(0, dtype=accumulation_dtype(g_pre.dtype)) if need[4] else None
        acc = accumulation_dtype(g_pre.dtype)
        g_normed = (g_pre.mm(weight).to(acc) / size.to(acc).unsqueeze(-1)).to(g_pre.dtype)
        grad_x, grad_ln_weight, grad_ln_bias = layer_norm_backward(
            g_normed.index_select(0, slot), x, mean, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        grad_x = grad + grad_x.to(grad.dtype) if need[0] else None
        return grad_x, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None, None, None, None


def lean_gcn(gcn, x: Tensor, rows: Tuple[Tensor, Tensor], training: bool) -> Tensor:
    """A ``GroupGCN`` module's block on time-first ``x`` (L x B x C) through :class:`LeanGroupGCN` with the plan's
    rows (:func:`gcn_rows`): ``x + Drop(Â Drop_act(ReLU(Â LN(x) W + b)))``."""
    slot, size = rows
    ln = gcn.layer_norm
    out = LeanGroupGCN.apply(x.reshape(-1, x.size(-1)), ln.weight, ln.bias, amp_cast(gcn.linear.weight),
                             gcn.linear.bias, slot, size, ln.eps, gcn.activation_dropout, gcn.dropout, training)
    return out.view(x.shape)


def additive_mask(padding_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """B x L padding mask (True at padding) -> B x 1 x 1 x L float mask, -inf at padding, in ``dtype``
    (``common.attention.additive_mask``, as key masks)."""
    return common_attention.additive_mask(padding_mask, dtype).view(padding_mask.size(0), 1, 1, -1)


amp_cast = autocast_cast  # a parameter cast whole under autocast, before a concatenation or a custom function


def fused_weights(*linears) -> Tuple[Tensor, Tensor]:
    """The linear maps' weights and biases concatenated (output rows), each cast whole first (:func:`amp_cast`)."""
    return (torch.cat([amp_cast(l.weight) for l in linears]), torch.cat([amp_cast(l.bias) for l in linears]))


def fused_linear(x: Tensor, *linears) -> Tensor:
    """``cat([l(x) for l in linears], -1)`` as one matrix product (the weights concatenated)."""
    return F.linear(x, *fused_weights(*linears))


def multihead_self_attention(mha, x: Tensor, mask: Tensor, training: bool) -> Tensor:
    """fairseq ``MultiheadAttention(self_attention=True)``'s training forward (``need_weights=False``, no bias_k,
    no zero attention) on time-first ``x`` with the plan's additive key mask: the three input maps as one
    product, the fused attention, the output map."""
    length, batch, embed_dim = x.shape
    heads, head_dim = mha.num_heads, mha.head_dim
    qkv = fused_linear(x, mha.q_proj, mha.k_proj, mha.v_proj).view(length, batch, 3, heads, head_dim)
    q, k, v = qkv.permute(2, 1, 3, 0, 4).unbind(0)  # B x H x L x d views
    dropout = mha.dropout_module.p if training else 0.0
    out = attention(q, k, v, mask, dropout, scale=mha.scaling)
    return mha.out_proj(out.permute(2, 0, 1, 3).reshape(length, batch, embed_dim))


def multihead_cross_attention(mha, query: Tensor, kv: Tensor, mask: Tensor, training: bool) -> Tensor:
    """fairseq ``MultiheadAttention(encoder_decoder_attention=True)``'s training forward (``need_weights=False``)
    with the plan's additive key mask: the key and value maps as one product."""
    len_q, batch, embed_dim = query.shape
    len_k = kv.size(0)
    heads, head_dim = mha.num_heads, mha.head_dim
    q = mha.q_proj(query).view(len_q, batch, heads, head_dim).permute(1, 2, 0, 3)
    k, v = fused_linear(kv, mha.k_proj, mha.v_proj).view(len_k, batch, 2, heads, head_dim).permute(
        2, 1, 3, 0, 4).unbind(0)
    dropout = mha.dropout_module.p if training else 0.0
    out = attention(q, k, v, mask, dropout, scale=mha.scaling)
    return mha.out_proj(out.permute(2, 0, 1, 3).reshape(len_q, batch, embed_dim))


def unhooked(module) -> bool:
    """No hook asks for what the module's own forward returns (``umst-inspect`` asks fairseq's attention for
    its weights through hooks): the lean path may call its parameters directly."""
    return not (module._forward_hooks or module._forward_pre_hooks)


class LeanFFN(torch.autograd.Function):
    """The pre-norm residual FFN, ``x + Drop(W2 Drop_act(ReLU(W1 LN(x) + b1)) + b2)``, on flat rows ``x`` (N x C),
    keeping the input, the LayerNorm statistics and two 1-byte masks (where the hidden unit passed both the
    ReLU and the activation dropout; the output dropout) instead of the LayerNorm output, the hidden layer
    before and after its dropout and a float mask. Backward recomputes the LayerNorm and the first product
    (no random draw is repeated). Dropout masks are drawn like the reference's ``F.dropout`` calls, in order,
    on tensors of the same shapes."""

    @staticmethod
    @amp_forward
    def forward(ctx, x, ln_weight, ln_bias, w1, b1, w2, b2, eps, p_act, p_out, training):
        channels = x.size(-1)
        normed, mean, rstd = torch.native_layer_norm(x, (channels,), ln_weight, ln_bias, eps)
        hidden = F.relu(F.linear(normed, w1, b1))
        keep_act = keep_out = None
        if training and p_act > 0:
            hidden, keep_act = torch.native_dropout(hidden, p_act, True)
        passed = hidden > 0  # ReLU > 0 and kept by the activation dropout (scaling keeps the sign)
        out = F.linear(hidden, w2, b2)
        if training and p_out > 0:
            out, keep_out = torch.native_dropout(out, p_out, True)
        ctx.save_for_backward(x, ln_weight, ln_bias, w1, b1, w2, mean, rstd, passed, keep_out)
        ctx.eps = eps
        ctx.scale_act = 1.0 / (1.0 - p_act) if keep_act is not None else 1.0
        ctx.scale_out = 1.0 / (1.0 - p_out) if keep_out is not None else 1.0
        return x + out

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        x, ln_weight, ln_bias, w1, b1, w2, mean, rstd, passed, keep_out = ctx.saved_tensors
        need = ctx.needs_input_grad
        g_out = grad if keep_out is None else torch.ops.aten.native_dropout_backward(grad, keep_out, ctx.scale_out)
        channels = x.size(-1)
        normed = torch.native_layer_norm(x, (channels,), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
        pre = F.linear(normed, w1, b1)  # recomputed
        # the hidden layer after ReLU and dropout: pre where it passed both, times the dropout's scale
        hidden = torch.ops.aten.native_dropout_backward(pre, passed, ctx.scale_act)
        grad_w2 = g_out.t().mm(hidden) if need[5] else None
        grad_b2 = g_out.sum(0, dtype=accumulation_dtype(g_out.dtype)) if need[6] else None
        g_hidden = g_out.mm(w2)
        g_pre = torch.ops.aten.native_dropout_backward(g_hidden, passed, ctx.scale_act)
        grad_w1 = g_pre.t().mm(normed) if need[3] else None
        grad_b1 = g_pre.sum(0, dtype=accumulation_dtype(g_pre.dtype)) if need[4] else None
        grad_x, grad_ln_weight, grad_ln_bias = layer_norm_backward(
            g_pre.mm(w1), x, mean, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        grad_x = grad + grad_x.to(grad.dtype) if need[0] else None
        return (grad_x, grad_ln_weight, grad_ln_bias, grad_w1, grad_b1, grad_w2, grad_b2, None, None, None,
                None)


def lean_ffn(ffn, x: Tensor, training: bool) -> Tensor:
    """A ``PreNormFFN`` module's block on ``x`` (any leading shape) through :class:`LeanFFN`."""
    ln = ffn.layer_norm
    out = LeanFFN.apply(x.reshape(-1, x.size(-1)), ln.weight, ln.bias, amp_cast(ffn.fc1.weight), ffn.fc1.bias,
                        amp_cast(ffn.fc2.weight), ffn.fc2.bias, ln.eps, ffn.activation_dropout, ffn.dropout, training)
    return out.view(x.shape)


class LayerNormLinear(torch.autograd.Function):
    """``F.linear(LN(x), weight, bias)`` on flat rows ``x`` (N x C) keeping ``x`` and the LayerNorm statistics,
    not the LayerNorm output: backward recomputes it (one op) for the weight's gradient. ``x`` is a residual
    stream that other blocks keep anyway, so the N x C normalised copy is what this saves."""

    @staticmethod
    @amp_forward
    def forward(ctx, x, ln_weight, ln_bias, eps, weight, bias):
        normed, mean, rstd = torch.native_layer_norm(x, (x.size(-1),), ln_weight, ln_bias, eps)
        ctx.save_for_backward(x, ln_weight, ln_bias, weight, mean, rstd)
        ctx.eps = eps
        return F.linear(normed, weight, bias)

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        x, ln_weight, ln_bias, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad_weight = grad_bias = None
        if need[4]:
            normed = torch.native_layer_norm(x, (x.size(-1),), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
            grad_weight = grad.t().mm(normed)
        if need[5]:
            grad_bias = grad.sum(0, dtype=accumulation_dtype(grad.dtype))
        grad_x, grad_ln_weight, grad_ln_bias = layer_norm_backward(
            grad.mm(weight), x, mean, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        return grad_x, grad_ln_weight, grad_ln_bias, None, grad_weight, grad_bias


def layer_norm_linear(layer_norm, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``F.linear(layer_norm(x), weight, bias)`` through :class:`LayerNormLinear`; x is ... x C."""
    out = LayerNormLinear.apply(x.reshape(-1, x.size(-1)), layer_norm.weight, layer_norm.bias, layer_norm.eps,
                                weight, bias)
    return out.view(*x.shape[:-1], out.size(-1))
