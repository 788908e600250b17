"""Options the plugin adds to fairseq's common options (``CommonConfig``); shared by the features that add one.

``training/amp_dtype_flag.py`` (``--amp-dtype``), ``compilation/flags.py`` (``--compile``, ``--tf32``) and
``training/preemption.py`` (``--stop-on-signals``) call :func:`add_fields`. A field of fairseq's ``CommonConfig`` (the dataclass behind ``--amp``, ``--fp16``, ``--cpu``)
is, from fairseq itself,

* an option of every parser built after the plugin was imported: the CLIs' (fairseq-train, -validate,
  -generate, -interactive; ``options.get_parser`` imports ``--user-dir`` from the command line first), under
  every task;
* a key ``common.<name>`` of every config and every checkpoint's config (fairseq-hydra-train composes its config
  before ``common.user_dir`` imports the plugin: there it is ``+common.<name>=...``).

:func:`add_fields` adds a small dataclass's fields to ``CommonConfig`` (its ``__dataclass_fields__``, annotations
and class defaults, and its ``__init__``) and stores fairseq's hydra schema again with them. A program that
builds its parser first and passes ``--user-dir`` in the arguments of ``options.parse_args_and_arch`` imports
the plugin after that parser exists, so the options also come where ``parse_args_and_arch`` next hands the
parser over: the task's ``add_args`` (``FairseqTask.add_args``, and every registered task that defines its own)
adds each added option the parser lacks (:func:`add_missing_arguments`).
"""
import dataclasses

from umst_plugin.patches import PatchError, expect_signature, wrap

# field name -> (patch that added it, the dataclass whose instance makes its argument)
_ADDED = {}


def _check_target(common_config, fairseq_config, patch):
    fields = getattr(common_config, "__dataclass_fields__", None)
    if fields is None or "amp" not in fields:
        raise PatchError(f"{patch}: fairseq's CommonConfig is not a dataclass with an 'amp' field; the plugin "
                         "does not know this fairseq (install fairseq-fixed==0.12.3.1, docs/install.md)")
    if fairseq_config.__dataclass_fields__["common"].default is not common_config:
        raise PatchError(f"{patch}: FairseqConfig.common is not built from CommonConfig; the plugin does not "
                         "know this fairseq (install fairseq-fixed==0.12.3.1, docs/install.md)")


def _own_fields(fields_cls):
    """The fields ``fields_cls`` declares (not FairseqDataclass's ``_name``)."""
    return [f for f in dataclasses.fields(fields_cls) if not f.name.startswith("_")]


def _option(name):
    return "--" + name.replace("_", "-")


def add_missing_arguments(parser):
    """The arguments of every added field ``parser`` lacks (a parser built before the plugin was imported)."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    known = getattr(parser, "_option_string_actions", {})
    done = set()
    for name, (_, fields_cls) in _ADDED.items():
        if fields_cls in done or _option(name) in known:
            continue
        done.add(fields_cls)
        missing = [f for f in _own_fields(fields_cls) if _option(f.name) not in known]
        if len(missing) == len(_own_fields(fields_cls)):
            gen_parser_from_dataclass(parser, fields_cls())
        else:  # some of a group's options are there already: add the others one by one
            for f in missing:
                gen_parser_from_dataclass(parser, _single_field_dataclass(fields_cls, f)())


def _single_field_dataclass(fields_cls, f):
    from fairseq.dataclass import FairseqDataclass

    return dataclasses.make_dataclass(f"{fields_cls.__name__}_{f.name}", [(f.name, f.type, f)],
                                      bases=(FairseqDataclass,))


def _wrap_add_args(task_cls, signature=None):
    """Make ``task_cls.add_args`` (its own, classmethod or staticmethod) also add the added options."""
    own = task_cls.__dict__.get("add_args")
    if own is None:
        return
    if not isinstance(own, (staticmethod, classmethod)):
        raise PatchError(f"{__name__}: {task_cls.__qualname__}.add_args is neither a classmethod nor a staticmethod")

    def make(function):  # the function of the staticmethod or classmethod (wrap makes the replacement one too)
        if isinstance(own, classmethod):
            def add_args(cls, parser):
                function(cls, parser)
                add_missing_arguments(parser)
        else:
            def add_args(parser):
                function(parser)
                add_missing_arguments(parser)
        return add_args

    wrap(task_cls, "add_args", make, __name__, signature)


def _install_parser_hook():
    from fairseq.tasks import TASK_REGISTRY
    from fairseq.tasks.fairseq_task import FairseqTask

    _wrap_add_args(FairseqTask, "(parser)")
    for task_cls in set(TASK_REGISTRY.values()):
        if isinstance(task_cls.__dict__.get("add_args"), (staticmethod, classmethod)):
            _wrap_add_args(task_cls)


def _install_init(common_config):
    """One ``CommonConfig.__init__`` for every added field: fairseq's own, then the added fields' values."""
    def make(original_init):
        def __init__(self, *args, **kwargs):
            extra = {name: kwargs.pop(name) for name in list(kwargs) if name in _ADDED}
            original_init(self, *args, **kwargs)
            for name in _ADDED:
                setattr(self, name, extra.get(name, common_config.__dataclass_fields__[name].default))
        return __init__

    wrap(common_config, "__init__", make, __name__)


def add_fields(patch, fields_cls, after=None):
    """Add every field of the dataclass ``fields_cls`` (plain defaults, a FairseqDataclass with ``help``
    metadata) to fairseq's ``CommonConfig`` -- after the field ``after`` and the fields added there before, else
    at the end -- store fairseq's hydra schema again, and make every task's ``add_args`` add the options a
    parser lacks. Idempotent; tasks registered since the last call get the ``add_args`` hook. Raises
    :class:`PatchError` where ``CommonConfig`` has one of the fields already from elsewhere (fairseq's own)."""
    from fairseq.dataclass.configs import CommonConfig, FairseqConfig
    from fairseq.dataclass.initialize import hydra_init

    new = _own_fields(fields_cls)
    present = [f.name for f in new if f.name in CommonConfig.__dataclass_fields__]
    foreign = [name for name in present if name not in _ADDED]
    if foreign:
        raise PatchError(f"{patch}: fairseq's CommonConfig already has {foreign}; this patch is not needed on this "
                         "fairseq and would replace fairseq's own field(s)")
    if len(present) == len(new):
        _install_parser_hook()  # tasks registered since (idempotent)
        return
    _check_target(CommonConfig, FairseqConfig, patch)
    expect_signature(hydra_init, "(cfg_name='config') -> None", patch)
    for f in new:
        if f.default is dataclasses.MISSING:
            raise PatchError(f"{patch}: the added common option {f.name!r} needs a plain default")

    fields = dict(CommonConfig.__dataclass_fields__)
    names = list(fields)
    if after is not None and after in fields:
        position = names.index(after) + 1
        while position < len(names) and names[position] in _ADDED:  # after the fields added there before
            position += 1
    else:
        position = len(names)
    added = [(f.name, f) for f in new if f.name not in fields]
    items = list(fields.items())
    CommonConfig.__dataclass_fields__ = dict(items[:position] + added + items[position:])
    for name, f in added:
        CommonConfig.__annotations__[name] = f.type  # omegaconf reads the type from the annotations
        setattr(CommonConfig, name, f.default)  # the class default, as dataclasses sets it
        _ADDED[name] = (patch, fields_cls)
    _install_init(CommonConfig)
    # fairseq stored its schema (ConfigStore) when it was imported; every config fairseq composes
    # (convert_namespace_to_omegaconf, fairseq-hydra-train) is checked against it
    hydra_init()
    _install_parser_hook()
