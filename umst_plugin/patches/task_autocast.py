"""Patch: every task's ``train_step`` autocasts on the model's device, in ``--amp-dtype``.

fairseq's ``FairseqTask.train_step`` wraps the forward pass in ``torch.cuda.amp.autocast`` when the optimizer is
an ``AMPOptimizer``: fp16, CUDA only (on a CPU ``--amp`` silently trained in fp32). The plugin's models also
train under fairseq's plain ``--task translation``, so the fix is installed once, on the base class:
under ``--amp`` the step runs ``mixed_precision.amp_train_step`` (``torch.autocast(model device, dtype)``, the
dtype from the task's ``--amp-dtype`` where the task has one -- ``multiscale_translation`` -- else float16).
"""
from umst_plugin import mixed_precision
from umst_plugin.patches import expect_signature

TARGET = "fairseq.tasks.fairseq_task.FairseqTask.train_step"
SYMPTOM = "--amp trains in fp32 on a CPU; --amp-dtype bfloat16 cannot take effect inside fairseq's fp16 autocast"
REMOVE_WHEN = "fairseq autocasts with torch.autocast(device_type, dtype) itself"


def install():
    from fairseq.tasks.fairseq_task import FairseqTask

    if getattr(FairseqTask.train_step, "_umst_autocast", False):
        return
    original = FairseqTask.train_step
    expect_signature(original, "(self, sample, model, criterion, optimizer, update_num, ignore_grad=False)", __name__)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if mixed_precision.is_amp_optimizer(optimizer) and \
                mixed_precision.model_device_type(model) in mixed_precision.AUTOCAST_DEVICE_TYPES:
            return mixed_precision.amp_train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad)
        return original(self, sample, model, criterion, optimizer, update_num, ignore_grad)

    train_step._umst_autocast = True
    FairseqTask.train_step = train_step
