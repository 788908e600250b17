"""Patch: ``--compile`` (regional torch.compile of every encoder and decoder layer) and ``--tf32``, as fairseq common
options, so every task and every CLI has them (fairseq-train, -validate, -generate, -interactive).

The fields ``compile`` and ``tf32`` join fairseq's ``CommonConfig`` (``patches/common_options.py``, shared with
``--amp-dtype``). What they do is :mod:`umst_plugin.compile`; where it happens:

* **training** -- ``fairseq.trainer.Trainer.__init__``: after fairseq's own, which has moved the model to its
  device and dtype, with the full config of the run (``cfg.common``). Every training entry builds its Trainer
  (fairseq-train, fairseq-hydra-train, ``fairseq_cli.train.main`` called in-process, each worker process of a
  multi-GPU run), and the Trainer's model is the one trained and validated. ``--compile`` checks that
  torch.compile runs on the Trainer's device before the first update (a clear error where it cannot), then
  compiles the layers; ``--tf32`` switches TF32 on for the Trainer's device.
* **fairseq-validate, -generate, -interactive** -- their ``main`` (``generate``: ``_main``, which ``main`` calls
  either way) records the command line's ``common.compile`` / ``common.tf32`` while it runs, and
  ``FairseqTask.build_model`` compiles each model built meanwhile (the checkpoint's config is not asked: a model
  trained with ``--compile`` is not compiled where it is only loaded, e.g. by ``from_pretrained``). In decoding
  only full-sequence calls run compiled (the encoder); incremental decoding steps stay eager. The wrappers are
  module-level functions of this module, so a multi-GPU fairseq-validate's spawned workers, which unpickle
  ``main`` by name, import the plugin and run them too.

Why not one hook for everything: ``task.build_model`` has no run config (``cfg.common``) and runs before the model
is on its device; the Trainer has both but only training builds one.
"""
import dataclasses
import logging
from fairseq.dataclass import FairseqDataclass

from umst_plugin.patches import as_config, common_options, expect_signature

logger = logging.getLogger(__name__)

TARGET = ("fairseq.dataclass.configs.CommonConfig (common_options); fairseq.trainer.Trainer.__init__; "
          "fairseq_cli.validate.main, fairseq_cli.generate._main, fairseq_cli.interactive.main; "
          "fairseq.tasks.FairseqTask.build_model")
SYMPTOM = ("fairseq has no torch.compile path (fairseq issue #5040) and leaves fp32 matmuls off the tensor cores "
           "(no TF32 switch)")
REMOVE_WHEN = "fairseq's common options have --compile and --tf32"

COMPILE_HELP = ("compile every encoder and decoder layer with torch.compile (regional compilation: layers of a class "
                "share compiled code; dynamic batch size and lengths; incremental decoding steps stay eager). "
                "Stops at start-up where torch.compile cannot run; the compile time is logged (docs/compile.md)")
TF32_HELP = ("fp32 matmuls and convolutions on TensorFloat-32 tensor cores (NVIDIA Ampere or newer); off by default, "
             "as in PyTorch; a warning where the device has none")


@dataclasses.dataclass
class _CompileFields(FairseqDataclass):
    """Only here to have dataclasses build the fields that CommonConfig receives."""
    compile: bool = dataclasses.field(default=False, metadata={"help": COMPILE_HELP})
    tf32: bool = dataclasses.field(default=False, metadata={"help": TF32_HELP})


# ---- training: the Trainer ------------------------------------------------------------------------------------

def _setup_training(trainer):
    from umst_plugin import compile as compiling

    cfg = trainer.cfg
    common = cfg.common
    if getattr(common, "tf32", False):
        compiling.set_tf32(True, trainer.device)
    if not getattr(common, "compile", False):
        return
    backend = getattr(cfg.distributed_training, "ddp_backend", None)
    if backend in ("fully_sharded",) or getattr(common, "tpu", False) or \
            getattr(cfg.distributed_training, "pipeline_model_parallel", False):
        what = "--tpu" if getattr(common, "tpu", False) else (
            "--pipeline-model-parallel" if backend != "fully_sharded" else "--ddp-backend fully_sharded")
        raise compiling.CompileUnavailable(f"--compile is not supported with {what}; drop one of them")
    names = compiling.compile_layers(trainer._model, device=trainer.device)
    logger.info("--compile: %d layers compiled on %s (%s); the first updates compile them (logged)", len(names),
                trainer.device, compiling.describe(trainer._model))


def _install_trainer():
    from fairseq.trainer import Trainer

    if getattr(Trainer.__init__, "_umst_compile", False):
        return
    original = Trainer.__init__
    expect_signature(original, "(self, cfg: fairseq.dataclass.configs.FairseqConfig, task, model, criterion, "
                               "quantizer=None)", __name__)

    def __init__(self, cfg, task, model, criterion, quantizer=None):
        original(self, cfg, task, model, criterion, quantizer)
        _setup_training(self)

    __init__._umst_compile = True
    __init__.__doc__ = original.__doc__
    __init__.__wrapped__ = original
    Trainer.__init__ = __init__


# ---- fairseq-validate, -generate, -interactive: the command line while main runs ------------------------------

_request = []  # stack of (compile, tf32, device) of the CLI mains running in this process


def _device(cfg):
    import torch

    common = cfg.common
    return "cuda" if torch.cuda.is_available() and not getattr(common, "cpu", False) else "cpu"


class _CommandLine:
    """While a CLI main runs: its ``--compile`` / ``--tf32`` (TF32 set at the start)."""

    def __init__(self, cfg):
        common = getattr(cfg, "common", None)
        self.entry = (bool(getattr(common, "compile", False)), bool(getattr(common, "tf32", False)),
                      _device(cfg) if common is not None else "cpu")

    def __enter__(self):
        compile_, tf32, device = self.entry
        if tf32:
            from umst_plugin import compile as compiling

            compiling.set_tf32(True, device)
        if compile_:
            from umst_plugin import compile as compiling

            compiling.check_available(device)  # before any model is loaded: a clear error first
            self.log = compiling.CompileTimeLog()
        _request.append(self.entry)
        return self

    def __exit__(self, *exc):
        _request.pop()
        if self.entry[0] and exc[0] is None:
            self.log.summary("this run")
        return False


_originals = {}


def validate_main(cfg, override_args=None):
    """fairseq-validate's ``main`` with ``--compile`` / ``--tf32`` (see the module docstring)."""
    cfg = as_config(cfg)
    with _CommandLine(cfg):
        return _originals["validate"](cfg, override_args)


def interactive_main(cfg):
    """fairseq-interactive's ``main`` with ``--compile`` / ``--tf32``."""
    cfg = as_config(cfg)
    with _CommandLine(cfg):
        return _originals["interactive"](cfg)


def generate_main(cfg, output_file):
    """fairseq-generate's ``_main`` with ``--compile`` / ``--tf32``."""
    with _CommandLine(cfg):
        return _originals["generate"](cfg, output_file)


def _install_cli():
    import fairseq_cli.generate as generate
    import fairseq_cli.interactive as interactive
    import fairseq_cli.validate as validate

    for key, module, name, wrapper, signature in (
            ("validate", validate, "main", validate_main, "(cfg: omegaconf.dictconfig.DictConfig, override_args=None)"),
            ("interactive", interactive, "main", interactive_main,
             "(cfg: fairseq.dataclass.configs.FairseqConfig)"),
            ("generate", generate, "_main", generate_main, "(cfg: omegaconf.dictconfig.DictConfig, output_file)")):
        current = getattr(module, name)
        if current is wrapper:
            continue
        expect_signature(current, signature, __name__)
        _originals[key] = current
        setattr(module, name, wrapper)


def _install_build_model():
    from fairseq.tasks.fairseq_task import FairseqTask

    if getattr(FairseqTask.build_model, "_umst_compile", False):
        return
    original = FairseqTask.build_model
    expect_signature(original, "(self, cfg: fairseq.dataclass.configs.FairseqDataclass, from_checkpoint=False)", __name__)

    def build_model(self, cfg, from_checkpoint=False):
        model = original(self, cfg, from_checkpoint)
        if _request and _request[-1][0]:
            from umst_plugin import compile as compiling

            names = compiling.compile_layers(model, device=_request[-1][2])
            logger.info("--compile: %d layers compiled (%s); full-sequence calls compile on first use, incremental "
                        "decoding steps stay eager", len(names), compiling.describe(model))
        return model

    build_model._umst_compile = True
    build_model.__doc__ = original.__doc__
    build_model.__wrapped__ = original
    FairseqTask.build_model = build_model


def install():
    common_options.add_fields(__name__, _CompileFields, after="amp_scale_window")
    _install_trainer()
    _install_cli()
    _install_build_model()

