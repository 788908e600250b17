"""Memory-lean training kernels for UMST's two GCN blocks: the same math as the reference modules
(``group_gcn.GroupGCN`` for Eq. 2, ``umst_encoder_layer.PhraseGCN`` for Eq. 3), with a hand-written
backward that keeps 1-byte masks instead of float activations.

Why: plain autograd keeps, per GCN block, the LayerNorm output, the linear map's input, the ReLU
output and (on CPU) a float dropout-noise tensor per dropout: about seven B x T x d float tensors
for the word GCN and four B x W x d for the phrase GCN, which is most of what UMST adds to a
transformer's activation memory. Recomputing the blocks in backward (``torch.utils.checkpoint``)
saves that memory but re-runs their d x d matmuls and dropout RNG. These functions keep only the
block input, LayerNorm statistics and boolean masks (ReLU > 0 merged with the dropout keep-mask),
and recompute in backward only what is elementwise or a segment mean (LayerNorm, per-word means);
no matmul and no random draw is repeated.

Mixed precision: the functions follow autocast on their inputs' device (``amp_functions``): the backward pass
runs under the forward pass's autocast, so its matrix products take the autocast dtype like autograd's own; the
LayerNorm backward gets its tensors in the statistics' dtype (float32).

Dropout masks are drawn with ``torch.native_dropout`` in the same order and on tensors of the same
size as the reference modules' ``F.dropout`` calls, which draw identical masks from the same RNG
state; hence lean and reference give identical outputs and gradients under the same seed (tested).

The phrase GCN has two forms (``PhraseGCN.form``): Eq. 3, ``xw + Drop(ReLU(Â_p (LN(xw) W + b)))``
(:class:`LeanPhraseGCN`), and the authors' ``xw + Drop(Â_p Drop_act(ReLU((Â_p LN(xw)) W + b)))``
(:class:`LeanPhraseGCNAuthors`), both with the same saving: inputs, LayerNorm statistics, masks.

Word GCN (Eq. 2 plus the left Â_w), y = x + Drop(Â_w Drop_act(ReLU(Â_w LN(x) W + b))). For the
same-word clique Â_w is the per-word mean, so Â_w LN(x) has one distinct row per word and
(Â_w LN(x)) W = G (mean_w LN(x)) W: the d x d map runs once per word (group), not once per subword,
then is gathered back to subwords, where the per-subword dropout applies as before.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward
from umst_plugin.modules.common.segment_ops import accumulation_dtype, segment_sum


def _divide_rows(rows: Tensor, size: Tensor, dtype) -> Tensor:
    acc = accumulation_dtype(dtype)
    return (rows.to(acc) / size.to(acc).unsqueeze(-1)).to(dtype)


def _segment_mean(rows: Tensor, slot: Tensor, size: Tensor) -> Tensor:
    """Per-slot means of ``rows``; ``size`` holds the slots' sizes (inf on padding slots: mean 0)."""
    return _divide_rows(segment_sum(rows, slot, size.numel()), size, rows.dtype)


def _layer_norm_backward(grad, x, mean, rstd, weight, bias, need):
    """``native_layer_norm_backward`` with the gradient and the input in the dtype of the LayerNorm's weight
    (float32 under autocast, where a matmul of the backward pass can hand a bf16/fp16 gradient to a float32
    block input; bf16 in a pure-bf16 model). The kernels expect them to match the weight (seen on CUDA:
    "expected scalar type Float but found BFloat16")."""
    dtype = weight.dtype if weight is not None else x.dtype
    return torch.ops.aten.native_layer_norm_backward(grad.to(dtype), x.to(dtype), [x.size(-1)], mean, rstd,
                                                     weight, bias, need)


def _dropout(t: Tensor, p: float, training: bool):
    if training and p > 0:
        return torch.native_dropout(t, p, True)
    return t, None


class LeanWordGCN(torch.autograd.Function):
    """Flat tokens ``x`` (N x C) -> ``x + Drop(Â_w Drop_act(ReLU(Â_w LN(x) W + b)))``.

    ``slot`` (N): each token's group row; ``size`` (R): tokens per row, inf on rows holding padding
    (their mean is 0, so padding tokens get exactly ``x`` back and send nothing to real groups)."""

    @staticmethod
    @amp_forward
    def forward(ctx, x, ln_weight, ln_bias, weight, bias, slot, size, eps, p_act, p_out, training):
        channels = x.size(-1)
        normed, mean, rstd = torch.native_layer_norm(x, (channels,), ln_weight, ln_bias, eps)
        pre = F.linear(_segment_mean(normed, slot, size), weight, bias)  # R x C, once per group
        active = pre > 0
        hidden, keep_act = _dropout(pre.clamp_min(0).index_select(0, slot), p_act, training)
        branch, keep_out = _dropout(_segment_mean(hidden, slot, size).index_select(0, slot), p_out, training)
        ctx.save_for_backward(x, ln_weight, ln_bias, weight, mean, rstd, slot, size, active, keep_act, keep_out)
        ctx.eps, ctx.p_act, ctx.p_out = eps, p_act, p_out
        return x + branch

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        x, ln_weight, ln_bias, weight, mean, rstd, slot, size, active, keep_act, keep_out = ctx.saved_tensors
        need = ctx.needs_input_grad
        g = grad if keep_out is None else grad * keep_out * (1.0 / (1.0 - ctx.p_out))
        # Â_w and the gathers are symmetric: the adjoint of "mean into groups, gather back" is itself.
        g = _segment_mean(g, slot, size).index_select(0, slot)
        if keep_act is not None:
            g = g * keep_act * (1.0 / (1.0 - ctx.p_act))
        g_pre = segment_sum(g, slot, size.numel()).to(g.dtype).masked_fill_(~active, 0.0)  # R x C
        channels = x.size(-1)
        normed = torch.native_layer_norm(x, (channels,), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
        grad_weight = g_pre.t().mm(_segment_mean(normed, slot, size)) if need[3] else None
        grad_bias = g_pre.sum(0, dtype=accumulation_dtype(g_pre.dtype)) if need[4] else None
        g_normed = _divide_rows(g_pre.mm(weight), size, g_pre.dtype)
        grad_x, grad_ln_weight, grad_ln_bias = _layer_norm_backward(
            g_normed.index_select(0, slot), x, mean, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        grad_x = grad + grad_x.to(grad.dtype) if need[0] else None
        return grad_x, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None, None, None, None


class LeanPhraseGCN(torch.autograd.Function):
    """Words ``xw`` (B x W x C) -> ``xw + Drop(ReLU(Â_p LN(xw) W_p + b))`` (Eq. 3), ``adj`` = Â_p."""

    @staticmethod
    @amp_forward
    def forward(ctx, xw, ln_weight, ln_bias, weight, bias, adj, eps, p, training):
        channels = xw.size(-1)
        normed, mean, rstd = torch.native_layer_norm(xw, (channels,), ln_weight, ln_bias, eps)
        mixed = torch.bmm(adj.to(xw.dtype), F.linear(normed, weight, bias))
        keep = mixed > 0
        branch, kept = _dropout(mixed.clamp_min(0), p, training)
        if kept is not None:
            keep &= kept
        ctx.save_for_backward(xw, ln_weight, ln_bias, weight, mean, rstd, adj, keep)
        ctx.eps, ctx.scale = eps, 1.0 / (1.0 - p) if kept is not None else 1.0
        return xw + branch

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        xw, ln_weight, ln_bias, weight, mean, rstd, adj, keep = ctx.saved_tensors
        need = ctx.needs_input_grad
        g_mixed = grad.masked_fill(~keep, 0.0)
        if ctx.scale != 1.0:
            g_mixed = g_mixed * ctx.scale
        g_lin = torch.bmm(adj.to(grad.dtype).transpose(1, 2), g_mixed)  # B x W x C
        channels = xw.size(-1)
        flat = g_lin.reshape(-1, channels)
        grad_weight = grad_bias = None
        if need[3]:
            normed = torch.native_layer_norm(xw, (channels,), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
            grad_weight = flat.t().mm(normed.reshape(-1, channels))
        if need[4]:
            grad_bias = flat.sum(0, dtype=accumulation_dtype(flat.dtype))
        grad_xw, grad_ln_weight, grad_ln_bias = _layer_norm_backward(
            g_lin.matmul(weight), xw, mean, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        grad_xw = grad + grad_xw.to(grad.dtype) if need[0] else None
        return grad_xw, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None, None


class LeanPhraseGCNAuthors(torch.autograd.Function):
    """Words ``xw`` (B x W x C) -> ``xw + Drop(Â_p Drop_act(ReLU((Â_p LN(xw)) W_p + b)))``, the authors'
    phrase GCN (``PhraseGCN(form="authors")``); ``adj`` = Â_p.

    Keeps ``xw``, the LayerNorm statistics and two boolean masks (ReLU > 0 merged with the activation
    dropout's keep-mask; the output dropout's keep-mask). Backward recomputes only the LayerNorm; its two
    products with Â_p^T are those any backward of the two forward products needs, and the weight
    gradient reads (Â_p^T g_pre)^T LN(xw), so Â_p LN(xw) is never kept nor recomputed."""

    @staticmethod
    @amp_forward
    def forward(ctx, xw, ln_weight, ln_bias, weight, bias, adj, eps, p_act, p_out, training):
        channels = xw.size(-1)
        adj = adj.to(xw.dtype)
        normed, mean, rstd = torch.native_layer_norm(xw, (channels,), ln_weight, ln_bias, eps)
        pre = F.linear(torch.bmm(adj, normed), weight, bias)
        active = pre > 0
        hidden, keep_act = _dropout(pre.clamp_min(0), p_act, training)
        if keep_act is not None:
            active &= keep_act
        branch, keep_out = _dropout(torch.bmm(adj, hidden), p_out, training)
        ctx.save_for_backward(xw, ln_weight, ln_bias, weight, mean, rstd, adj, active, keep_out)
        ctx.eps, ctx.p_act, ctx.p_out = eps, (p_act if keep_act is not None else 0.0), p_out
        return xw + branch

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        xw, ln_weight, ln_bias, weight, mean, rstd, adj, active, keep_out = ctx.saved_tensors
        need = ctx.needs_input_grad
        adj_t = adj.to(grad.dtype).transpose(1, 2)
        g = grad if keep_out is None else grad * keep_out * (1.0 / (1.0 - ctx.p_out))
        g_pre = torch.bmm(adj_t, g).masked_fill_(~active, 0.0)  # through the second product and the ReLU
        if ctx.p_act:
            g_pre = g_pre * (1.0 / (1.0 - ctx.p_act))
        channels = xw.size(-1)
        grad_bias = g_pre.reshape(-1, channels).sum(0, dtype=accumulation_dtype(g_pre.dtype)) if need[4] else None
        g_back = torch.bmm(adj_t, g_pre)  # Â_p^T g_pre: the weight's and the LayerNorm output's gradients
        grad_weight = None
        if need[3]:
            normed = torch.native_layer_norm(xw, (channels,), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
            grad_weight = g_back.reshape(-1, channels).t().mm(normed.reshape(-1, channels))
        grad_xw, grad_ln_weight, grad_ln_bias = _layer_norm_backward(
            g_back.matmul(weight), xw, mean, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        grad_xw = grad + grad_xw.to(grad.dtype) if need[0] else None
        return grad_xw, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None, None, None


def lean_word_gcn(gcn, x: Tensor, slot: Tensor, size: Tensor, training: bool) -> Tensor:
    """Apply a ``GroupGCN`` module's parameters through :class:`LeanWordGCN`; x is B x T x C."""
    ln = gcn.layer_norm
    out = LeanWordGCN.apply(x.reshape(-1, x.size(-1)), ln.weight, ln.bias, gcn.linear.weight, gcn.linear.bias,
                            slot, size, ln.eps, gcn.activation_dropout, gcn.dropout, training)
    return out.view_as(x)


def lean_phrase_gcn(gcn, xw: Tensor, adj: Tensor, training: bool) -> Tensor:
    """Apply a ``PhraseGCN`` module's parameters through :class:`LeanPhraseGCN` (form eq3) or
    :class:`LeanPhraseGCNAuthors` (form authors); xw is B x W x C."""
    ln = gcn.layer_norm
    if gcn.form == "authors":
        return LeanPhraseGCNAuthors.apply(xw, ln.weight, ln.bias, gcn.linear.weight, gcn.linear.bias, adj, ln.eps,
                                          gcn.activation_dropout, gcn.dropout, training)
    return LeanPhraseGCN.apply(xw, ln.weight, ln.bias, gcn.linear.weight, gcn.linear.bias, adj, ln.eps,
                               gcn.dropout, training)
