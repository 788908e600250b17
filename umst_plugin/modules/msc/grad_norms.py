"""MSC's encoder L2 term and per-layer gradient-norm logging (figure 5 of the paper), hooked into the criterion's
log-probs: :class:`PerTokenLossTerm` (identity forward, the penalty's gradient in backward) and
:class:`EncoderGradNormLogger` (``--encoder-grad-norms-file``)."""
import atexit
import json
import math
import os
from functools import partial
from typing import Dict, Optional

import torch
import torch.nn as nn
from fairseq.distributed import utils as distributed_utils
from torch import Tensor


class PerTokenLossTerm(torch.autograd.Function):
    """Identity on the log-probs whose backward adds ``penalty`` once per target token.

    Backward treats every log-prob as lowered by ``penalty``.  For NLL and
    label-smoothed NLL the gradient w.r.t. each target position's log-probs
    sums to -1 (times fairseq's loss scale), so d(loss)/d(penalty) =
    -sum(grad) = number of target tokens (x loss scale).  After fairseq divides
    the gradients by sample_size (= target tokens) the encoder weights receive
    exactly the gradient of ``penalty``, under fp16 loss scaling, AMP, gradient
    accumulation and DDP alike.  The reported loss value is unchanged (the
    penalty is logged separately as ``encoder_l2``).  That same
    -sum(grad) is the loss's token count x loss scale: the grad-norm logger
    divides by it to report unscaled per-token gradients.
    """

    @staticmethod
    def forward(ctx, lprobs, penalty, observer):
        ctx.observer = observer
        ctx.penalty_needs_grad = penalty.requires_grad
        ctx.penalty_dtype = penalty.dtype
        return lprobs.view_as(lprobs)

    @staticmethod
    def backward(ctx, grad):
        loss_weight = -grad.sum(dtype=torch.float32)
        if ctx.observer is not None:
            ctx.observer.add_loss_weight(loss_weight.detach())
        grad_penalty = loss_weight.to(ctx.penalty_dtype) if ctx.penalty_needs_grad else None
        return grad, grad_penalty, None


class EncoderGradNormLogger:
    """Records the gradient norm of each encoder layer per update (figure 5).

    Post-accumulate hooks keep the squared norm of each parameter's
    accumulated ``.grad`` (so gradient accumulation over ``--update-freq`` is
    handled); the loss weight comes from :class:`PerTokenLossTerm`.  When the
    model is told a new update number (fairseq's task.train_step calls
    ``model.set_num_updates`` before each forward) the previous update's norms
    are written as one JSON line: ``{"update": u, "loss_weight": w,
    "grad_norms": [layer 1, ..., layer N*M]}`` with each norm = ||grad of the
    layer's parameters|| / w, i.e. the per-token gradient norm fairseq's
    optimizer sees before clipping.  Only rank 0 writes.  A step that fp16
    skips for overflow is logged with its non-finite norms as null.
    """

    def __init__(self, layers: nn.ModuleList, path: str, interval: int = 1):
        self.path = path
        self.interval = max(1, int(interval))
        self.update: Optional[int] = None
        self.recording = False
        self.loss_weight: Optional[Tensor] = None
        self.sq_norms: Dict[tuple, Tensor] = {}
        self.num_layers = len(layers)
        self._file = None
        for i, layer in enumerate(layers):
            for j, param in enumerate(layer.parameters()):
                param.register_post_accumulate_grad_hook(partial(self._on_grad, i, j))
        # fairseq-train has no end-of-training hook: write the last update at exit.
        atexit.register(self.flush)

    def _on_grad(self, layer_idx: int, param_idx: int, param: Tensor):
        if self.recording and param.grad is not None:
            self.sq_norms[(layer_idx, param_idx)] = param.grad.detach().float().pow(2).sum()

    def add_loss_weight(self, weight: Tensor):
        if self.recording:
            self.loss_weight = weight if self.loss_weight is None else self.loss_weight + weight

    def set_update(self, num_updates: int):
        if num_updates != self.update:
            self.flush()
            self.update = num_updates

    def flush(self):
        if not self.sq_norms:
            return
        sq_norms, self.sq_norms = self.sq_norms, {}
        loss_weight, self.loss_weight = self.loss_weight, None
        update = (self.update or 0) + 1  # the gradient of update number update+1
        if update % self.interval != 0 or distributed_utils.get_global_rank() != 0:
            return
        per_layer = torch.zeros(self.num_layers, dtype=torch.float64)
        for (i, _), value in sq_norms.items():
            per_layer[i] += float(value)
        weight = float(loss_weight) if loss_weight is not None else 1.0
        norms = (per_layer.sqrt() / (weight if weight > 0 else 1.0)).tolist()
        record = {
            "update": update,
            "loss_weight": weight if loss_weight is not None else None,
            "grad_norms": [n if math.isfinite(n) else None for n in norms],
        }
        if self._file is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._file = open(self.path, "a")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------
