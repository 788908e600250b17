"""The criterion's loss as a compile region: under fairseq-train ``--compile``, fairseq's label-smoothed
cross-entropy (``--criterion label_smoothed_cross_entropy``, every recipe's) is compiled with the layers.

Why: eager, the loss goes over a (target tokens x vocabulary) tensor in each of its 24 ATen ops (26 for bfloat16
logits) -- the logits cast to float32, the log-softmax, the gather and the label smoothing's sum, then in the
backward the scattered and the summed gradients, the log-softmax's backward and the cast back to the logits'
dtype: 48-60 bytes read and written per logit, at 4,096 tokens and a 32,768-type dictionary about as many bytes as
the transformer's compiled layers move. Compiled, inductor's program is one forward kernel, which reads the logits
in its reductions and writes the float32 log-probabilities the backward needs, and two backward kernels (the
gather's gradient scattered into a zeroed float32 buffer; the log-softmax's backward, writing the gradient in the
logits' dtype): about a third of eager's bytes for bfloat16 logits (``benchmarks/bench_loss.py`` counts eager's and times both;
docs/compile.md has the figures).

What is compiled is fairseq's own code: :class:`LabelSmoothedLoss` is ``utils.log_softmax`` (float32) followed by
``label_smoothed_nll_loss`` (summed, padding left out), the two calls of the criterion's ``compute_loss``, as a
module with ``compile_region = True`` that runs through the same dispatch as a layer (``dispatch``: a failed
compile falls back to eager with a warning, a failed compiled backward retries the update). Only the order of the
float32 sums differs from eager.

Where it applies (:func:`compile_criterion`): the criterion is fairseq's ``LabelSmoothedCrossEntropyCriterion`` with
its own ``compute_loss`` and ``get_lprobs_and_target`` (subclasses that keep them, such as the alignment variant,
too), the loss is reduced, and the model's log-probabilities are the plain log-softmax of its decoder's output
(:func:`plain_log_probs`). Otherwise fairseq's eager code runs, unchanged: another criterion, an adaptive softmax,
``--report-accuracy``'s extra pass (which stays eager), or a model whose ``get_normalized_probs`` adds a term -- a
model that overrides it says when it is plain through a method ``plain_normalized_probs()`` (MSC: unless
``--encoder-l2`` or ``--log-encoder-grad-norms`` hooks it in training).
"""
import types

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.criterions.label_smoothed_cross_entropy import (LabelSmoothedCrossEntropyCriterion,
                                                             label_smoothed_nll_loss)
from fairseq.models.fairseq_decoder import FairseqDecoder
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq.models.transformer.transformer_base import TransformerModelBase

from umst_plugin.compilation import dispatch

# The get_normalized_probs of fairseq's models that only hand the decoder's output to the decoder's (the
# transformer's repeats the base class's for TorchScript).
_PLAIN_MODEL_PROBS = (BaseFairseqModel.get_normalized_probs, TransformerModelBase.get_normalized_probs)
LOSS_MODULE = "umst_compiled_loss"  # the criterion's child module that holds the compiled loss


class LabelSmoothedLoss(nn.Module):
    """fairseq's label-smoothed cross-entropy from the decoder's logits, as its criterion computes it: the
    float32 log-softmax over the vocabulary (``fairseq.utils.log_softmax``), then ``label_smoothed_nll_loss`` with
    ``epsilon`` and the padding index, summed. Returns ``(loss, nll_loss)``. No parameters."""

    compile_region = True

    def __init__(self, epsilon, ignore_index):
        super().__init__()
        self.epsilon = float(epsilon)
        self.ignore_index = ignore_index

    def forward(self, logits, target):
        lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
        return label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.reshape(-1), self.epsilon,
                                       ignore_index=self.ignore_index, reduce=True)


def _unwrapped(model):
    """The fairseq model inside a distributed wrapper (fairseq's ``ModuleProxyWrapper`` and torch's DDP)."""
    while not isinstance(model, BaseFairseqModel) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def plain_log_probs(model):
    """Whether ``model.get_normalized_probs(net_output, log_probs=True)`` is the float32 log-softmax of the
    decoder's output ``net_output[0]`` and nothing more: fairseq's model and decoder methods, no adaptive softmax,
    no ONNX tracing; or, for a model that overrides ``get_normalized_probs``, what its ``plain_normalized_probs()``
    says now."""
    model = _unwrapped(model)
    declared = getattr(model, "plain_normalized_probs", None)
    if declared is not None:
        return bool(declared())
    cls = type(model)
    if cls.get_normalized_probs not in _PLAIN_MODEL_PROBS or \
            cls.get_normalized_probs_scriptable is not BaseFairseqModel.get_normalized_probs_scriptable:
        return False
    decoder = getattr(model, "decoder", None)
    if not isinstance(decoder, FairseqDecoder):
        return False
    dec = type(decoder)
    return (dec.get_normalized_probs is FairseqDecoder.get_normalized_probs
            and dec.get_normalized_probs_scriptable is FairseqDecoder.get_normalized_probs_scriptable
            and getattr(decoder, "adaptive_softmax", None) is None and not getattr(decoder, "onnx_trace", False))


def _compute_loss(self, model, net_output, sample, reduce=True):
    """``LabelSmoothedCrossEntropyCriterion.compute_loss`` with the loss compiled where it applies."""
    if not reduce or not plain_log_probs(model):
        return LabelSmoothedCrossEntropyCriterion.compute_loss(self, model, net_output, sample, reduce=reduce)
    logits, target = net_output[0], model.get_targets(sample, net_output)
    if self.ignore_prefix_size > 0:  # as get_lprobs_and_target
        logits, target = logits[:, self.ignore_prefix_size:, :], target[:, self.ignore_prefix_size:]
    return getattr(self, LOSS_MODULE)(logits, target)


def compilable(criterion):
    """Whether :func:`compile_criterion` compiles ``criterion``'s loss."""
    cls = type(criterion)
    return (isinstance(criterion, LabelSmoothedCrossEntropyCriterion)
            and cls.compute_loss is LabelSmoothedCrossEntropyCriterion.compute_loss
            and cls.get_lprobs_and_target is LabelSmoothedCrossEntropyCriterion.get_lprobs_and_target)


def compile_criterion(criterion):
    """Compile ``criterion``'s loss in place (see the module's docstring): True where it did, False where the
    criterion is not one this compiles (its eager code runs). Lazy, as the layers: the first update compiles."""
    if LOSS_MODULE in criterion._modules:
        return True
    if not compilable(criterion):
        return False
    loss = LabelSmoothedLoss(criterion.eps, criterion.padding_idx)
    loss.train(criterion.training)
    dispatch.compile_layers(loss, check=False)
    criterion.add_module(LOSS_MODULE, loss)  # a child: train() and eval() reach it; no parameters, no state
    criterion.compute_loss = types.MethodType(_compute_loss, criterion)
    return True
