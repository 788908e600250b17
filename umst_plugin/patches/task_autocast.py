"""Patch: every task's training, validation and decoding steps autocast on the model's device, in ``--amp-dtype``.

fairseq's ``FairseqTask.train_step`` wraps the forward pass in ``torch.cuda.amp.autocast`` when the optimizer is
an ``AMPOptimizer``: fp16, CUDA only (on a CPU ``--amp`` silently trained in fp32), and fairseq never autocasts
validation or decoding. The plugin's models also run under fairseq's plain ``--task translation``, and so do
the transformer rows, so the fix is installed once, on the base class, for every task:

* ``train_step``: under ``--amp``, ``mixed_precision.amp_train_step`` (``torch.autocast(model device, dtype)``,
  the dtype the ``AMPOptimizer`` built its grad scaler for: ``--amp-dtype``, else float16);
* ``valid_step`` and ``inference_step`` (fairseq-train's validation, fairseq-validate, fairseq-generate,
  fairseq-interactive, ``from_pretrained(...).translate``): under the same autocast when this process asks for
  ``--amp`` (``mixed_precision.inference_amp`` / ``inference_amp_dtype``). fairseq's ``TranslationTask``
  computes its loss and its BLEU decoding through these two, so they are covered too.
"""
from umst_plugin import mixed_precision
from umst_plugin.patches import wrap

TARGET = ("fairseq.tasks.fairseq_task.FairseqTask.train_step, .valid_step, .inference_step")
SYMPTOM = ("--amp trains in fp32 on a CPU; --amp-dtype bfloat16 cannot take effect inside fairseq's fp16 autocast; "
           "validation and decoding never autocast")
REMOVE_WHEN = "fairseq autocasts every step with torch.autocast(device_type, dtype) itself"


def install():
    from fairseq.tasks.fairseq_task import FairseqTask

    def make_train_step(original_train):
        def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
            if mixed_precision.is_amp_optimizer(optimizer) and \
                    mixed_precision.model_device_type(model) in mixed_precision.AUTOCAST_DEVICE_TYPES:
                return mixed_precision.amp_train_step(self, sample, model, criterion, optimizer, update_num,
                                                      ignore_grad)
            return original_train(self, sample, model, criterion, optimizer, update_num, ignore_grad)
        return train_step

    def make_valid_step(original_valid):
        def valid_step(self, sample, model, criterion):
            with mixed_precision.inference_autocast(self, model, "validation"):
                return original_valid(self, sample, model, criterion)
        return valid_step

    def make_inference_step(original_inference):
        def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
            with mixed_precision.inference_autocast(self, models[0], "decoding"):
                return original_inference(self, generator, models, sample, prefix_tokens=prefix_tokens,
                                          constraints=constraints)
        return inference_step

    wrap(FairseqTask, "train_step", make_train_step, __name__,
         "(self, sample, model, criterion, optimizer, update_num, ignore_grad=False)")
    wrap(FairseqTask, "valid_step", make_valid_step, __name__, "(self, sample, model, criterion)")
    wrap(FairseqTask, "inference_step", make_inference_step, __name__,
         "(self, generator, models, sample, prefix_tokens=None, constraints=None)")
