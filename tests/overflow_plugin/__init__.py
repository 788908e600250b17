"""A ``--user-dir`` for tests: the plugin, plus a criterion that makes chosen training steps overflow.

``--criterion label_smoothed_cross_entropy_poisoned --poison-calls 5,6,7`` multiplies the loss of the 5th, 6th
and 7th training forward passes by inf, so their gradients are non-finite: what a real overflow looks like to
the optimizer (fairseq retries an overflowing batch ``--amp-batch-retries`` times, 2 by default, then skips it;
three poisoned calls in a row make one skipped batch).
"""
from dataclasses import dataclass, field

import umst_plugin  # noqa: F401  (the plugin's task, models and patches)
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (LabelSmoothedCrossEntropyCriterion,
                                                            LabelSmoothedCrossEntropyCriterionConfig)


@dataclass
class PoisonedConfig(LabelSmoothedCrossEntropyCriterionConfig):
    poison_calls: str = field(default="", metadata={"help": "1-based training forward calls whose loss is x inf"})


@register_criterion("label_smoothed_cross_entropy_poisoned", dataclass=PoisonedConfig)
class PoisonedCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 poison_calls=""):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.poison = {int(c) for c in str(poison_calls).split(",") if c}
        self.calls = 0

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        if model.training:
            self.calls += 1
            if self.calls in self.poison:
                loss = loss * float("inf")
        return loss, sample_size, logging_output
