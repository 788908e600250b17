"""Patch: ``--amp-dtype`` is a flag of fairseq's common options, so every task and every CLI has it.

fairseq's ``--amp`` always autocasts to float16. The plugin's ``--amp-dtype {float16,bfloat16}`` used to be an
option of the ``multiscale_translation`` task alone: under fairseq's ``--task translation`` (a baseline row)
``fairseq-train --amp --amp-dtype bfloat16`` stopped with ``unrecognized arguments: --amp-dtype bfloat16``.
The patch adds the field ``amp_dtype`` to fairseq's ``CommonConfig`` (the dataclass behind ``--amp``,
``--fp16``, ``--bf16``), next to ``amp``, and stores fairseq's hydra schema again with it. From there fairseq
itself makes it

* ``--amp-dtype`` in every parser built after the plugin was imported: the CLIs' (fairseq-train, -validate,
  -generate, -interactive; ``options.get_parser`` imports ``--user-dir`` from the command line first), for
  every task;
* ``common.amp_dtype`` in every config and in every checkpoint's config. fairseq-hydra-train composes its
  config before ``common.user_dir`` imports the plugin: there it is ``+common.amp_dtype=bfloat16``.

A program that builds its parser first and passes ``--user-dir`` in the arguments of
``options.parse_args_and_arch`` imports the plugin after that parser exists, so the patch also adds
``--amp-dtype`` where ``parse_args_and_arch`` next hands the parser over: the task's ``add_args``
(``FairseqTask.add_args``, and every registered task that defines its own). ``multiscale_translation``'s own
``amp_dtype`` follows the common one (``${common.amp_dtype}``); the value older checkpoints stored there is
still read (``mixed_precision.configured_amp_dtype``).

Unset (``None``) means float16 for training, as fairseq's ``--amp``; for validation and decoding, the dtype
the checkpoint was trained in (``mixed_precision.inference_amp_dtype``).
"""
import dataclasses
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from umst_plugin import mixed_precision
from umst_plugin.patches import PatchError, expect_signature

TARGET = ("fairseq.dataclass.configs.CommonConfig (and the hydra schema fairseq stores from it); "
          "fairseq.tasks.FairseqTask.add_args (and each registered task's own)")
SYMPTOM = ("--amp-dtype exists under --task multiscale_translation only: fairseq-train --task translation --amp "
           "--amp-dtype bfloat16 stops with 'unrecognized arguments'")
REMOVE_WHEN = "fairseq's common options have an autocast dtype"

FIELD = "amp_dtype"
HELP = ("with --amp: the autocast dtype, on CUDA and CPU, under any task (float16: a grad scaler; bfloat16: loss "
        "scale 1, non-finite steps skipped). Unset: float16 for training; for validation and decoding the dtype "
        "the checkpoint was trained in, else float16")
AmpDtypeChoices = ChoiceEnum(list(mixed_precision.AMP_DTYPES))


@dataclasses.dataclass
class _AmpDtypeField(FairseqDataclass):
    """Only here to have dataclasses build the field (name, type, kind) that CommonConfig receives."""
    amp_dtype: Optional[AmpDtypeChoices] = dataclasses.field(default=None, metadata={"help": HELP})


def _check_target(common_config, fairseq_config):
    fields = getattr(common_config, "__dataclass_fields__", None)
    if fields is None or "amp" not in fields:
        raise PatchError(f"{__name__}: fairseq's CommonConfig is not a dataclass with an 'amp' field; the plugin "
                         "does not know this fairseq (install fairseq-fixed==0.12.3.1, docs/install.md)")
    if fairseq_config.__dataclass_fields__["common"].default is not common_config:
        raise PatchError(f"{__name__}: FairseqConfig.common is not built from CommonConfig; the plugin does not "
                         "know this fairseq (install fairseq-fixed==0.12.3.1, docs/install.md)")


def add_amp_dtype_argument(parser):
    """``--amp-dtype`` on ``parser`` unless it has it (a parser built after the plugin was imported)."""
    if "--amp-dtype" in getattr(parser, "_option_string_actions", {}):
        return
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    gen_parser_from_dataclass(parser, _AmpDtypeField())


def _wrap_add_args(task_cls):
    """Make ``task_cls.add_args`` (its own, classmethod or staticmethod) also add ``--amp-dtype``."""
    own = task_cls.__dict__.get("add_args")
    if own is None or getattr(own.__func__, "_umst_amp_dtype", False):
        return
    function = own.__func__
    if isinstance(own, staticmethod):
        def add_args(parser):
            function(parser)
            add_amp_dtype_argument(parser)
        wrapped = staticmethod(add_args)
    elif isinstance(own, classmethod):
        def add_args(cls, parser):
            function(cls, parser)
            add_amp_dtype_argument(parser)
        wrapped = classmethod(add_args)
    else:
        raise PatchError(f"{__name__}: {task_cls.__qualname__}.add_args is neither a classmethod nor a staticmethod")
    add_args._umst_amp_dtype = True
    add_args.__doc__ = function.__doc__
    task_cls.add_args = wrapped


def _install_parser_hook():
    from fairseq.tasks import TASK_REGISTRY
    from fairseq.tasks.fairseq_task import FairseqTask

    expect_signature(FairseqTask.add_args, "(parser)", __name__)
    _wrap_add_args(FairseqTask)
    for task_cls in set(TASK_REGISTRY.values()):
        if isinstance(task_cls.__dict__.get("add_args"), (staticmethod, classmethod)):
            _wrap_add_args(task_cls)


def install():
    from fairseq.dataclass.configs import CommonConfig, FairseqConfig
    from fairseq.dataclass.initialize import hydra_init

    if FIELD in CommonConfig.__dataclass_fields__:
        if not getattr(CommonConfig, "_umst_amp_dtype", False):
            raise PatchError(f"{__name__}: fairseq's CommonConfig already has '{FIELD}'; this patch is not needed "
                             "on this fairseq and would replace fairseq's own field")
        _install_parser_hook()  # tasks registered since (idempotent)
        return
    _check_target(CommonConfig, FairseqConfig)
    expect_signature(hydra_init, "(cfg_name='config') -> None", __name__)

    new_field = _AmpDtypeField.__dataclass_fields__[FIELD]
    # the same order as in --help: right after the other --amp options
    fields = {}
    for name, f in CommonConfig.__dataclass_fields__.items():
        fields[name] = f
        if name == "amp_scale_window":
            fields[FIELD] = new_field
    fields.setdefault(FIELD, new_field)
    CommonConfig.__dataclass_fields__ = fields
    CommonConfig.__annotations__[FIELD] = new_field.type  # omegaconf reads the type from the annotations
    setattr(CommonConfig, FIELD, None)  # the class default, as dataclasses sets it

    original_init = CommonConfig.__init__

    def __init__(self, *args, amp_dtype=None, **kwargs):
        original_init(self, *args, **kwargs)
        self.amp_dtype = amp_dtype

    CommonConfig.__init__ = __init__
    CommonConfig._umst_amp_dtype = True
    # fairseq stored its schema (ConfigStore) when it was imported; every config fairseq composes
    # (convert_namespace_to_omegaconf, fairseq-hydra-train) is checked against it
    hydra_init()
    _install_parser_hook()
