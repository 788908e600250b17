"""``--amp-dtype`` is a flag of fairseq's common options, so every task and every CLI has it (and, beside it,
``--no-amp-weight-cache``: autocast's own per-parameter casts instead of ``umst_plugin/amp_weights.py``'s one).

fairseq's ``--amp`` always autocasts to float16. The plugin's ``--amp-dtype {float16,bfloat16}`` used to be an
option of the ``multiscale_translation`` task alone: under fairseq's ``--task translation`` (a baseline row)
``fairseq-train --amp --amp-dtype bfloat16`` stopped with ``unrecognized arguments: --amp-dtype bfloat16``.
This module adds the field ``amp_dtype`` to fairseq's ``CommonConfig`` (the dataclass behind ``--amp``,
``--fp16``, ``--bf16``), next to ``amp``, and stores fairseq's hydra schema again with it. From there fairseq
itself makes it

* ``--amp-dtype`` in every parser built after the plugin was imported: the CLIs' (fairseq-train, -validate,
  -generate, -interactive; ``options.get_parser`` imports ``--user-dir`` from the command line first), for
  every task;
* ``common.amp_dtype`` in every config and in every checkpoint's config. fairseq-hydra-train composes its
  config before ``common.user_dir`` imports the plugin: there it is ``+common.amp_dtype=bfloat16``.

A program that builds its parser first and passes ``--user-dir`` in the arguments of
``options.parse_args_and_arch`` imports the plugin after that parser exists, so it also adds
``--amp-dtype`` where ``parse_args_and_arch`` next hands the parser over: the task's ``add_args``
(``FairseqTask.add_args``, and every registered task that defines its own). ``multiscale_translation``'s own
``amp_dtype`` follows the common one (``${common.amp_dtype}``); the value older checkpoints stored there is
still read (``mixed_precision.configured_amp_dtype``).

How the field is added (and the task ``add_args`` hook): ``umst_plugin/common_options.py``, shared with the other
common options of the plugin.

Unset (``None``) means float16 for training, as fairseq's ``--amp``; for validation and decoding, the dtype
the checkpoint was trained in (``mixed_precision.inference_amp_dtype``).
"""
import dataclasses
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from umst_plugin import common_options, mixed_precision

OPTIONS = "`--amp-dtype`, `--no-amp-weight-cache`"
TARGET = ("fairseq.dataclass.configs.CommonConfig (and the hydra schema fairseq stores from it); "
          "fairseq.tasks.FairseqTask.add_args (and each registered task's own)")
SYMPTOM = ("--amp-dtype exists under --task multiscale_translation only: fairseq-train --task translation --amp "
           "--amp-dtype bfloat16 stops with 'unrecognized arguments'")
REMOVE_WHEN = "fairseq's common options have an autocast dtype"

FIELD = "amp_dtype"
HELP = ("with --amp: the autocast dtype, on CUDA and CPU, under any task (float16: a grad scaler; bfloat16: loss "
        "scale 1, non-finite steps skipped). Unset: float16 for training; for validation and decoding the dtype "
        "the checkpoint was trained in, else float16")
WEIGHT_CACHE_HELP = ("with --amp: let autocast cast each parameter where it is read (two kernels per parameter an "
                     "update) instead of the plugin casting them all in one (umst_plugin/amp_weights.py: the same "
                     "values, four kernels in all)")
AmpDtypeChoices = ChoiceEnum(list(mixed_precision.AMP_DTYPES))


@dataclasses.dataclass
class _AmpDtypeField(FairseqDataclass):
    """Only here to have dataclasses build the field (name, type, kind) that CommonConfig receives."""
    amp_dtype: Optional[AmpDtypeChoices] = dataclasses.field(default=None, metadata={"help": HELP})
    no_amp_weight_cache: bool = dataclasses.field(default=False, metadata={"help": WEIGHT_CACHE_HELP})


def install():
    common_options.add_fields(__name__, _AmpDtypeField, after="amp_scale_window")  # next to the other --amp options
