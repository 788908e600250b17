"""Memory- and launch-lean training kernels for UMST's two GCN blocks: the same math as the reference modules
(``common.group_gcn.GroupGCN`` for Eq. 2, ``layer.PhraseGCN`` for Eq. 3), with a hand-written
backward that keeps 1-byte masks instead of float activations and launches few kernels.

Why: plain autograd keeps, per GCN block, the LayerNorm output, the linear map's input, the ReLU
output and (on CPU) a float dropout-noise tensor per dropout: about seven B x T x d float tensors
for the word GCN and four B x W x d for the phrase GCN, which is most of what UMST adds to a
transformer's activation memory. Recomputing the blocks in backward (``torch.utils.checkpoint``)
saves that memory but re-runs their d x d matmuls and dropout RNG. These functions keep only the
block input, LayerNorm statistics and boolean masks (ReLU > 0 merged with the dropout keep-mask),
and recompute in backward only the LayerNorm and one per-word mean; no d x d matmul and no random draw
is repeated.

Kernel launches: every per-word mean, gather to subwords and Â product is one ``bmm`` with a dense operator
built once per batch (``graphs.dense_operators``), forward and backward; dropout is
``torch.native_dropout`` (one kernel) and its backward ``native_dropout_backward`` (one kernel, which also
applies a merged ReLU mask). Per block, training: the word GCN launches 10 kernels forward and 12 backward,
the phrase GCN (Eq. 3) 6 and 8.

Mixed precision: the functions follow autocast on their inputs' device (``amp_functions``): the backward pass
runs under the forward pass's autocast, so its matrix products take the autocast dtype like autograd's own; the
LayerNorm backward gets its tensors in the statistics' dtype (float32).

Dropout masks are drawn with ``torch.native_dropout`` in the same order and on tensors of the same
size as the reference modules' ``F.dropout`` calls, which draw identical masks from the same RNG
state; hence lean and reference give identical outputs and gradients under the same seed (tested).
Dropout commutes with the ReLU (a positive scale), so where a dropout follows a ReLU the lean forms drop first
and take the ReLU mask of the dropped tensor: ``d > 0`` is the ReLU mask and the keep-mask in one.

The phrase GCN has two forms (``PhraseGCN.form``): Eq. 3, ``xw + Drop(ReLU(Â_p (LN(xw) W + b)))``
(:class:`LeanPhraseGCN`), and the authors' ``xw + Drop(Â_p Drop_act(ReLU((Â_p LN(xw)) W + b)))``
(:class:`LeanPhraseGCNAuthors`), both with the same saving: inputs, LayerNorm statistics, masks.

Word GCN (Eq. 2 plus the left Â_w), y = x + Drop(Â_w Drop_act(ReLU(Â_w LN(x) W + b))). For the
same-word clique Â_w is the per-word mean, so Â_w LN(x) has one distinct row per word and
(Â_w LN(x)) W = G (mean_w LN(x)) W: the d x d map runs once per word (group), not once per subword,
then is gathered back to subwords (``G``, a bmm), where the per-subword dropout applies as before.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward, autocast_cast
from umst_plugin.modules.common.lean_ops import dropout_and_mask, layer_norm_backward
from umst_plugin.modules.common.segment_ops import accumulation_dtype

_dropout_backward = torch.ops.aten.native_dropout_backward


def _scale(p: float, mask) -> float:
    return 1.0 / (1.0 - p) if mask is not None else 1.0


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, t.size(-1))


class LeanWordGCN(torch.autograd.Function):
    """Tokens ``x`` (B x T x C) -> ``x + Drop(Â_w Drop_act(ReLU(Â_w LN(x) W + b)))``.

    ``onehot`` (B x T x W): each token's group (0/1; padding rows 0); ``mean`` (B x W x T): the per-group mean;
    ``adj`` (B x T x T) = onehot @ mean = Â_w (symmetric). Padding tokens get exactly ``x`` back and send
    nothing to real groups. W_w runs once per group (B x W rows)."""

    @staticmethod
    @amp_forward
    def forward(ctx, x, ln_weight, ln_bias, weight, bias, onehot, mean, adj, eps, p_act, p_out, training):
        normed, mu, rstd = torch.native_layer_norm(x, (x.size(-1),), ln_weight, ln_bias, eps)
        pre = F.linear(torch.bmm(mean, normed), weight, bias)  # B x W x C, once per group
        hidden, keep_act = dropout_and_mask(torch.bmm(onehot, F.relu(pre)), p_act, training)  # per subword
        # ReLU > 0 of the token's group and the activation keep-mask, at once (dropout scales by > 0)
        active = hidden > 0
        branch, keep_out = dropout_and_mask(torch.bmm(adj, hidden), p_out, training)
        ctx.save_for_backward(x, ln_weight, ln_bias, weight, mu, rstd, onehot, mean, adj, active, keep_out)
        ctx.eps, ctx.scale_act, ctx.scale_out = eps, _scale(p_act, keep_act), _scale(p_out, keep_out)
        return x + branch

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        x, ln_weight, ln_bias, weight, mu, rstd, onehot, mean, adj, active, keep_out = ctx.saved_tensors
        need = ctx.needs_input_grad
        g = grad if keep_out is None else _dropout_backward(grad, keep_out, ctx.scale_out)
        g = _dropout_backward(torch.bmm(adj.transpose(1, 2), g), active, ctx.scale_act)  # Â_w symmetric
        g_pre = torch.bmm(onehot.transpose(1, 2), g)  # B x W x C: the gather's adjoint
        grad_weight = grad_bias = None
        if need[3]:
            normed = torch.native_layer_norm(x, (x.size(-1),), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
            grad_weight = _flat(g_pre).t().mm(_flat(torch.bmm(mean, normed).to(g_pre.dtype)))
        if need[4]:
            grad_bias = _flat(g_pre).sum(0, dtype=accumulation_dtype(g_pre.dtype))
        g_normed = torch.bmm(mean.transpose(1, 2), g_pre.matmul(weight))
        grad_x, grad_ln_weight, grad_ln_bias = layer_norm_backward(
            g_normed, x, mu, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        grad_x = grad + grad_x.to(grad.dtype) if need[0] else None
        return (grad_x, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None, None, None, None,
                None)


class LeanPhraseGCN(torch.autograd.Function):
    """Words ``xw`` (B x W x C) -> ``xw + Drop(ReLU(Â_p (LN(xw) W_p + b)))`` (Eq. 3), ``adj`` = Â_p.

    Dropout is drawn on Â_p(...) before the ReLU (it commutes with it): ``d > 0`` is then the ReLU mask and the
    keep-mask at once, and ``xw + d * (d > 0)`` is one ``addcmul``."""

    @staticmethod
    @amp_forward
    def forward(ctx, xw, ln_weight, ln_bias, weight, bias, adj, eps, p, training):
        normed, mu, rstd = torch.native_layer_norm(xw, (xw.size(-1),), ln_weight, ln_bias, eps)
        mixed = torch.bmm(adj, F.linear(normed, weight, bias))
        dropped, kept = dropout_and_mask(mixed, p, training)
        keep = dropped > 0  # ReLU > 0 and the dropout keep-mask
        ctx.save_for_backward(xw, ln_weight, ln_bias, weight, mu, rstd, adj, keep)
        ctx.eps, ctx.scale = eps, _scale(p, kept)
        return torch.addcmul(xw, dropped, keep)

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        xw, ln_weight, ln_bias, weight, mu, rstd, adj, keep = ctx.saved_tensors
        need = ctx.needs_input_grad
        g_lin = torch.bmm(adj.transpose(1, 2), _dropout_backward(grad, keep, ctx.scale))  # B x W x C
        grad_weight = grad_bias = None
        if need[3]:
            normed = torch.native_layer_norm(xw, (xw.size(-1),), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
            grad_weight = _flat(g_lin).t().mm(_flat(normed).to(g_lin.dtype))
        if need[4]:
            grad_bias = _flat(g_lin).sum(0, dtype=accumulation_dtype(g_lin.dtype))
        grad_xw, grad_ln_weight, grad_ln_bias = layer_norm_backward(
            g_lin.matmul(weight), xw, mu, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
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
        normed, mu, rstd = torch.native_layer_norm(xw, (xw.size(-1),), ln_weight, ln_bias, eps)
        pre = F.linear(torch.bmm(adj, normed), weight, bias)
        dropped, keep_act = dropout_and_mask(pre, p_act, training)
        active = dropped > 0  # ReLU > 0 and the activation dropout's keep-mask
        branch, keep_out = dropout_and_mask(torch.bmm(adj, F.relu(dropped)), p_out, training)
        ctx.save_for_backward(xw, ln_weight, ln_bias, weight, mu, rstd, adj, active, keep_out)
        ctx.eps, ctx.scale_act, ctx.scale_out = eps, _scale(p_act, keep_act), _scale(p_out, keep_out)
        return xw + branch

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        xw, ln_weight, ln_bias, weight, mu, rstd, adj, active, keep_out = ctx.saved_tensors
        need = ctx.needs_input_grad
        adj_t = adj.transpose(1, 2)
        g = grad if keep_out is None else _dropout_backward(grad, keep_out, ctx.scale_out)
        g_pre = _dropout_backward(torch.bmm(adj_t, g), active, ctx.scale_act)  # the second product, the ReLU
        grad_bias = _flat(g_pre).sum(0, dtype=accumulation_dtype(g_pre.dtype)) if need[4] else None
        g_back = torch.bmm(adj_t, g_pre)  # Â_p^T g_pre: the weight's and the LayerNorm output's gradients
        grad_weight = None
        if need[3]:
            normed = torch.native_layer_norm(xw, (xw.size(-1),), ln_weight, ln_bias, ctx.eps)[0]  # recomputed
            grad_weight = _flat(g_back).t().mm(_flat(normed).to(g_back.dtype))
        grad_xw, grad_ln_weight, grad_ln_bias = layer_norm_backward(
            g_back.matmul(weight), xw, mu, rstd, ln_weight, ln_bias, [need[0], need[1], need[2]])
        grad_xw = grad + grad_xw.to(grad.dtype) if need[0] else None
        return grad_xw, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None, None, None


def _operator(t: Tensor, like: Tensor) -> Tensor:
    """A dense graph operator in ``like``'s dtype: as is under autocast (the products cast it), else cast."""
    if t.dtype == like.dtype or torch.is_autocast_enabled(like.device.type):
        return t
    return t.to(like.dtype)


def _weight(weight: Tensor, like: Tensor) -> Tensor:
    """The d x d weight or its bias as the functions' products read it: under autocast cast whole before the
    function, as autocast would cast it inside (the same values); so autocast's parameter cache
    (``umst_plugin.amp_weights``) can make the cast once per update, and neither pass casts it per layer.

    The gradients: the weight's is the autocast-dtype product either way. The bias's is summed in float32 in
    backward and rounded once to the autocast dtype (the engine gives an input its gradient in the input's
    dtype), then cast back to float32: the precision a linear layer's bias gradient has under autocast (its
    ``addmm`` backward returns it in the autocast dtype). Handed the float32 bias, the function returned the
    float32 sum unrounded, but autocast cast the bias inside it, one kernel per GCN block and forward pass."""
    return autocast_cast(weight, like.device.type)


def lean_word_gcn(gcn, x: Tensor, graphs, training: bool) -> Tensor:
    """Apply a ``GroupGCN`` module's parameters through :class:`LeanWordGCN`; x is B x T x C, ``graphs`` a
    ``UMSTGraphs`` with its dense operators."""
    ln = gcn.layer_norm
    return LeanWordGCN.apply(x, ln.weight, ln.bias, _weight(gcn.linear.weight, x), _weight(gcn.linear.bias, x),
                             _operator(graphs.group_onehot, x), _operator(graphs.group_mean, x),
                             _operator(graphs.group_adj, x), ln.eps, gcn.activation_dropout, gcn.dropout, training)


def lean_phrase_gcn(gcn, xw: Tensor, adj: Tensor, training: bool) -> Tensor:
    """Apply a ``PhraseGCN`` module's parameters through :class:`LeanPhraseGCN` (form eq3) or
    :class:`LeanPhraseGCNAuthors` (form authors); xw is B x W x C."""
    ln = gcn.layer_norm
    adj, weight, bias = _operator(adj, xw), _weight(gcn.linear.weight, xw), _weight(gcn.linear.bias, xw)
    if gcn.form == "authors":
        return LeanPhraseGCNAuthors.apply(xw, ln.weight, ln.bias, weight, bias, adj, ln.eps,
                                          gcn.activation_dropout, gcn.dropout, training)
    return LeanPhraseGCN.apply(xw, ln.weight, ln.bias, weight, bias, adj, ln.eps, gcn.dropout, training)
