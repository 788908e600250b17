"""Patch: a loaded checkpoint tells its task the ``--amp-dtype`` it was trained in, whatever the task.

``--amp`` at validation or decoding (fairseq-validate, -generate, -interactive; ``from_pretrained(...,
amp=True)``) without ``--amp-dtype`` autocasts in the dtype the checkpoint was trained in
(``mixed_precision.inference_amp_dtype``). Under ``multiscale_translation`` the task config carried it, but
only where the task was rebuilt from the checkpoint (fairseq-validate, ``from_pretrained``); fairseq-generate
and -interactive build the task from their own command line, and fairseq's ``translation`` task has no such
key: a bf16 checkpoint decoded under fp16 autocast there. The patch wraps
``fairseq.checkpoint_utils.load_model_ensemble_and_task`` (the loader of every CLI and of ``from_pretrained``;
``load_model_ensemble`` calls it) and sets ``task.checkpoint_amp_dtype`` from the loaded config
(``common.amp_dtype``, or the task's ``amp_dtype`` that older ``multiscale_translation`` checkpoints store).
"""
from umst_plugin import mixed_precision
from umst_plugin.patches import wrap

TARGET = "fairseq.checkpoint_utils.load_model_ensemble_and_task"
SYMPTOM = ("--amp without --amp-dtype decodes a bf16-trained checkpoint under fp16 autocast (fairseq-generate, "
           "-interactive; any command under --task translation)")
REMOVE_WHEN = "fairseq records and applies an autocast dtype itself"


def install():
    from fairseq import checkpoint_utils

    def make(original):
        def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, strict=True, suffix="",
                                         num_shards=1, state=None):
            ensemble, cfg, task = original(filenames, arg_overrides=arg_overrides, task=task, strict=strict,
                                           suffix=suffix, num_shards=num_shards, state=state)
            if task is not None:
                try:
                    task.checkpoint_amp_dtype = mixed_precision.configured_amp_dtype(cfg)
                except ValueError:  # a value this plugin does not know: leave the choice to the command line
                    task.checkpoint_amp_dtype = None
            return ensemble, cfg, task
        return load_model_ensemble_and_task

    wrap(checkpoint_utils, "load_model_ensemble_and_task", make, __name__,
         "(filenames, arg_overrides: Optional[Dict[str, Any]] = None, task=None, strict=True, suffix='', "
         "num_shards=1, state=None)")
