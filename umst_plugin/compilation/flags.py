"""``--compile`` (regional torch.compile of every encoder and decoder layer) and ``--tf32``, as fairseq common
options, so every task and every CLI has them (fairseq-train, -validate, -generate, -interactive).

The fields ``compile`` and ``tf32`` join fairseq's ``CommonConfig`` (``umst_plugin/common_options.py``, shared with
``--amp-dtype``). What they do is :mod:`umst_plugin.compilation`; where it happens:

* **training** -- ``fairseq.trainer.Trainer.__init__``: after fairseq's own, which has moved the model to its
  device and dtype, with the full config of the run (``cfg.common``). Every training entry builds its Trainer
  (fairseq-train, fairseq-hydra-train, ``fairseq_cli.train.main`` called in-process, each worker process of a
  multi-GPU run), and the Trainer's model is the one trained and validated. ``--compile`` checks that
  torch.compile runs on the Trainer's device before the first update (a clear error where it cannot), keeps
  inductor's caches in ``SAVE_DIR/compile_cache`` (a resumed or requeued run compiles from them), then compiles
  the layers; ``--tf32`` switches TF32 on for the Trainer's device. ``Trainer.train_step`` logs the compile
  seconds of each update that compiled (cache hits and misses) and retries an update whose compiled backward
  failed, with that layer variant eager (``umst_plugin/compilation/retry.py``).
* **fairseq-validate, -generate, -interactive** -- their ``main`` (``generate``: ``_main``, which ``main`` calls
  either way) records the command line's ``common.compile`` / ``common.tf32`` while it runs, and
  ``FairseqTask.build_model`` compiles each model built meanwhile (the checkpoint's config is not asked: a model
  trained with ``--compile`` is not compiled where it is only loaded, e.g. by ``from_pretrained``), and
  ``FairseqTask.build_criterion`` compiles the loss of each criterion built meanwhile (fairseq-validate's). In decoding
  only full-sequence calls run compiled (the encoder); incremental decoding steps stay eager. The wrappers are
  module-level functions of this module, so a multi-GPU fairseq-validate's spawned workers, which unpickle
  ``main`` by name, import the plugin and run them too.

Why not one hook for everything: ``task.build_model`` has no run config (``cfg.common``) and runs before the model
is on its device; the Trainer has both but only training builds one.
"""
import dataclasses
import logging
import os

import fairseq_cli.generate as generate_cli
import fairseq_cli.interactive as interactive_cli
import fairseq_cli.validate as validate_cli
import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks.fairseq_task import FairseqTask
from fairseq.trainer import Trainer

from umst_plugin import common_options, compilation
from umst_plugin.compilation import graph_shapes, retry, telemetry
from umst_plugin.compilation.dispatch import CUDAGRAPHS_MODE
from umst_plugin.compilation.state import STATE
from umst_plugin.patches import as_config, original, wrap

logger = logging.getLogger(__name__)

OPTIONS = "`--compile`, `--compile-cudagraphs`, `--compile-cudagraph-shapes`, `--tf32`"
TARGET = ("fairseq.dataclass.configs.CommonConfig (common_options); fairseq.trainer.Trainer.__init__, .train_step and "
          ".valid_step; "
          "fairseq_cli.validate.main, fairseq_cli.generate._main, fairseq_cli.interactive.main; "
          "fairseq.tasks.FairseqTask.build_model and .build_criterion")
SYMPTOM = ("fairseq has no torch.compile path (fairseq issue #5040) and leaves fp32 matmuls off the tensor cores "
           "(no TF32 switch)")
REMOVE_WHEN = "fairseq's common options have --compile and --tf32"

COMPILE_HELP = ("compile every encoder and decoder layer with torch.compile (regional compilation: layers of a class "
                "share compiled code; dynamic batch size and lengths; incremental decoding steps stay eager), and in "
                "fairseq-train and fairseq-validate the loss of --criterion label_smoothed_cross_entropy. "
                "Stops at start-up where torch.compile cannot run; a compile that fails later runs that layer "
                "variant eager, with a warning; compiled code is kept in SAVE_DIR/compile_cache for a resumed run; "
                "the compile time is logged (docs/compile.md)")
CUDAGRAPHS_HELP = ("with --compile, in fairseq-train on a GPU: replay each compiled layer's kernels as CUDA graphs "
                   "(torch.compile's mode 'reduce-overhead', CUDA graph trees), one graph recorded per batch shape, so "
                   "that the host launches one graph where it launched every kernel; bound the batch shapes with "
                   "--num-batch-buckets N (each new shape records graphs anew, up to --compile-cudagraph-shapes per "
                   "layer class). Its updates and validation; no effect on a CPU (a warning) nor in fairseq-validate, "
                   "-generate and -interactive (docs/compile.md)")
CUDAGRAPH_SHAPES_HELP = ("with --compile-cudagraphs: each layer class records at most this many batch shapes as "
                         "CUDA graphs (train / eval and every input's sizes), the first it meets; every other shape "
                         "runs compiled without CUDA graphs, with a warning at the first (0: no cap, every shape "
                         f"recorded). Default {graph_shapes.DEFAULT_SHAPES}: a run on 8 or 16 length buckets meets "
                         "16-28 shapes per class (docs/compile.md)")
TF32_HELP = ("fp32 matmuls on TensorFloat-32 tensor cores (NVIDIA Ampere or newer): sets "
             "torch.backends.cuda.matmul.allow_tf32, False in PyTorch by default, and "
             "torch.backends.cudnn.allow_tf32, which PyTorch already sets True (cuDNN convolutions use TF32 without "
             "this flag); validation and decoding restore both afterwards; a warning where the device has none")


@dataclasses.dataclass
class _CompileFields(FairseqDataclass):
    """Only here to have dataclasses build the fields that CommonConfig receives."""
    compile: bool = dataclasses.field(default=False, metadata={"help": COMPILE_HELP})
    compile_cudagraphs: bool = dataclasses.field(default=False, metadata={"help": CUDAGRAPHS_HELP})
    compile_cudagraph_shapes: int = dataclasses.field(default=graph_shapes.DEFAULT_SHAPES,
                                                      metadata={"help": CUDAGRAPH_SHAPES_HELP})
    tf32: bool = dataclasses.field(default=False, metadata={"help": TF32_HELP})


# ---- training: the Trainer ------------------------------------------------------------------------------------

def _setup_training(trainer):
    cfg = trainer.cfg
    common = cfg.common
    if getattr(common, "tf32", False):
        compilation.set_tf32(True, trainer.device)
    cudagraphs = _cudagraphs(cfg, trainer.device)
    if not getattr(common, "compile", False):
        return
    backend = getattr(cfg.distributed_training, "ddp_backend", None)
    if backend in ("fully_sharded",) or getattr(common, "tpu", False) or \
            getattr(cfg.distributed_training, "pipeline_model_parallel", False):
        what = "--tpu" if getattr(common, "tpu", False) else (
            "--pipeline-model-parallel" if backend != "fully_sharded" else "--ddp-backend fully_sharded")
        raise compilation.CompileUnavailable(f"--compile is not supported with {what}; drop one of them")
    checkpoint = cfg.checkpoint
    if not getattr(checkpoint, "no_save", False) and getattr(checkpoint, "save_dir", None):
        # compiled code kept with the run: a resumed or requeued run of the same command reuses it
        directory, graphs = compilation.use_cache_dir(os.path.join(checkpoint.save_dir, compilation.CACHE_DIRNAME))
        logger.info("--compile: compiled code cached in %s (%s)", directory,
                    f"{graphs} graph(s) from an earlier run" if graphs else "empty: compiling from scratch")
    names = compilation.compile_layers(trainer._model, device=trainer.device,
                                       mode=CUDAGRAPHS_MODE if cudagraphs else None,
                                       graph_shapes_cap=_shape_cap(common) if cudagraphs else 0)
    trainer._umst_cudagraphs = cudagraphs
    loss = ("and the criterion's loss" if compilation.compile_criterion(trainer._criterion) else
            _eager_loss(trainer._criterion))
    logger.info("--compile: %d layers compiled on %s (%s), %s; the first updates compile them (logged)", len(names),
                trainer.device, compilation.describe(trainer._model), loss)
    trainer._umst_compile_log = [compilation.compile_seconds(), *telemetry.cache_counts()]
    retry.catch_compiled_backward(trainer.task)


def _cudagraphs(cfg, device):
    """Whether the compiled layers replay as CUDA graphs (``--compile-cudagraphs``): the flag, with ``--compile``, on a
    CUDA device. A clear error without ``--compile``; a warning on another device (inductor records CUDA graphs of
    CUDA programs only), and where nothing bounds the batch shapes."""
    if not getattr(cfg.common, "compile_cudagraphs", False):
        return False
    if not getattr(cfg.common, "compile", False):
        raise compilation.CompileUnavailable("--compile-cudagraphs replays the compiled layers: give --compile too")
    _shape_cap(cfg.common)  # a bad cap is an error on any device
    if torch.device(device).type != "cuda":
        logger.warning("--compile-cudagraphs: CUDA graphs need a CUDA device; the layers run compiled on %s without "
                       "them", device)
        return False
    task = cfg.task
    if not getattr(task, "num_batch_buckets", 0) and getattr(task, "required_seq_len_multiple", 1) <= 1:
        logger.warning("--compile-cudagraphs: every new batch shape records its layers' CUDA graphs anew (time and "
                       "memory); bound the shapes with --num-batch-buckets N (docs/compile.md)")
    return True


def _shape_cap(common):
    """``--compile-cudagraph-shapes``: a clear error for a negative number."""
    try:
        return graph_shapes.check_limit(getattr(common, "compile_cudagraph_shapes", graph_shapes.DEFAULT_SHAPES))
    except ValueError as e:
        raise compilation.CompileUnavailable(str(e)) from None


def _eager_loss(criterion):
    """What the compile log says of a criterion whose loss ``--compile`` leaves eager."""
    return f"the loss of --criterion {type(criterion).__name__} eager: only label_smoothed_cross_entropy's is compiled"


def _log_compiling(trainer):
    """After an update that compiled something: its compile seconds and the cache's hits and misses."""
    seconds, hits, misses = compilation.compile_seconds(), *telemetry.cache_counts()
    last = trainer._umst_compile_log
    if seconds - last[0] > 0.05 or hits != last[1] or misses != last[2]:
        new_hits, new_misses = hits - last[1], misses - last[2]
        logger.info("--compile: update %d: compile: %.1f s (%s: %d hit(s), %d miss(es)); %.1f s in this process",
                    trainer.get_num_updates(), seconds - last[0], telemetry.cache_word(new_hits, new_misses),
                    new_hits, new_misses, seconds)
        trainer._umst_compile_log = [seconds, hits, misses]


def _train_step(trainer, original_step, samples, raise_oom):
    """fairseq's ``Trainer.train_step`` under ``--compile``: an update whose compiled backward failed retried with
    that variant eager (``compilation/retry.py``: every step of it), then the update's compile seconds logged."""
    if trainer._umst_cudagraphs:
        # an update is a new generation of CUDA graph trees: the last update's graph outputs are not read again
        torch.compiler.cudagraph_mark_step_begin()
    try:
        return retry.train_step(trainer, original_step, samples, raise_oom)
    finally:
        _log_compiling(trainer)


def _install_trainer():
    def make_init(original_init):
        def __init__(self, cfg, task, model, criterion, quantizer=None):
            original_init(self, cfg, task, model, criterion, quantizer)
            _setup_training(self)
        return __init__

    def make_train_step(original_step):
        def train_step(self, samples, raise_oom=False):
            if "_umst_compile_log" not in self.__dict__:  # not compiling
                return original_step(self, samples, raise_oom)
            return _train_step(self, original_step, samples, raise_oom)
        return train_step

    wrap(Trainer, "__init__", make_init, __name__,
         "(self, cfg: fairseq.dataclass.configs.FairseqConfig, task, model, criterion, quantizer=None)")
    wrap(Trainer, "train_step", make_train_step, __name__, "(self, samples, raise_oom=False)")

    def make_valid_step(original_step):
        def valid_step(self, sample, raise_oom=False):
            if self.__dict__.get("_umst_cudagraphs"):
                torch.compiler.cudagraph_mark_step_begin()  # each validation batch a generation of its own
            return original_step(self, sample, raise_oom)
        return valid_step

    wrap(Trainer, "valid_step", make_valid_step, __name__, "(self, sample, raise_oom=False)")


# ---- fairseq-validate, -generate, -interactive: the command line while main runs ------------------------------

def _device(cfg):
    common = cfg.common
    return "cuda" if torch.cuda.is_available() and not getattr(common, "cpu", False) else "cpu"


def _checkpoint_cache(cfg):
    """``compile_cache`` next to the (first) checkpoint of ``--path``, where its training run kept its compiled code;
    None where there is none."""
    path = getattr(getattr(cfg, "common_eval", None), "path", None)
    if not path:
        return None
    directory = os.path.join(os.path.dirname(os.path.abspath(path.split(os.pathsep)[0])), compilation.CACHE_DIRNAME)
    return directory if os.path.isdir(directory) else None


class _CommandLine:
    """While a CLI main runs: its ``--compile`` / ``--tf32`` (TF32 set at the start)."""

    def __init__(self, cfg):
        self.cfg = cfg
        common = getattr(cfg, "common", None)
        self.entry = (bool(getattr(common, "compile", False)), bool(getattr(common, "tf32", False)),
                      _device(cfg) if common is not None else "cpu")

    def __enter__(self):
        compile_, tf32, device = self.entry
        if tf32:
            # the setting is process-wide: a main called in a longer process (a test, a notebook) gives it back
            self.tf32_before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
            compilation.set_tf32(True, device)
        if compile_:
            cache = _checkpoint_cache(self.cfg)
            if cache:  # the training run's compiled code, next to the checkpoint
                directory, graphs = compilation.use_cache_dir(cache)
                logger.info("--compile: compiled code cached in %s (%d graph(s))", directory, graphs)
            compilation.check_available(device)  # before any model is loaded: a clear error first
            self.log = compilation.CompileTimeLog()
        STATE.requests.append(self.entry)
        return self

    def __exit__(self, *exc):
        STATE.requests.pop()
        if self.entry[1]:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.tf32_before
        if self.entry[0] and exc[0] is None:
            self.log.summary("this run")
        return False


def validate_main(cfg, override_args=None):
    """fairseq-validate's ``main`` with ``--compile`` / ``--tf32`` (see the module docstring)."""
    cfg = as_config(cfg)
    with _CommandLine(cfg):
        return original(validate_main)(cfg, override_args)


def interactive_main(cfg):
    """fairseq-interactive's ``main`` with ``--compile`` / ``--tf32``."""
    cfg = as_config(cfg)
    with _CommandLine(cfg):
        return original(interactive_main)(cfg)


def generate_main(cfg, output_file):
    """fairseq-generate's ``_main`` with ``--compile`` / ``--tf32``."""
    with _CommandLine(cfg):
        return original(generate_main)(cfg, output_file)


def _install_cli():
    wrap(validate_cli, "main", lambda _: validate_main, __name__,
         "(cfg: omegaconf.dictconfig.DictConfig, override_args=None)")
    wrap(interactive_cli, "main", lambda _: interactive_main, __name__,
         "(cfg: fairseq.dataclass.configs.FairseqConfig)")
    wrap(generate_cli, "_main", lambda _: generate_main, __name__,
         "(cfg: omegaconf.dictconfig.DictConfig, output_file)")


def _compile_request():
    """The innermost running CLI main's (compile, tf32, device) where it asked for ``--compile``, else None."""
    return STATE.requests[-1] if STATE.requests and STATE.requests[-1][0] else None


def _install_build_model():
    def make(original_build):
        def build_model(self, cfg, from_checkpoint=False):
            model = original_build(self, cfg, from_checkpoint)
            request = _compile_request()
            if request:
                names = compilation.compile_layers(model, device=request[2])
                logger.info("--compile: %d layers compiled (%s); full-sequence calls compile on first use, "
                            "incremental decoding steps stay eager", len(names), compilation.describe(model))
            return model
        return build_model

    wrap(FairseqTask, "build_model", make, __name__,
         "(self, cfg: fairseq.dataclass.configs.FairseqDataclass, from_checkpoint=False)")


def _install_build_criterion():
    """Inside a CLI main with ``--compile`` (fairseq-validate's), the criterion a task builds has its loss compiled,
    as fairseq-train's Trainer has (``_setup_training``); outside one (fairseq-train builds its criterion before
    its Trainer), the criterion is built as it is."""
    def make(original_build):
        def build_criterion(self, cfg, from_checkpoint=False):
            criterion = original_build(self, cfg, from_checkpoint)
            if _compile_request():
                logger.info("--compile: %s", "the criterion's loss compiled"
                            if compilation.compile_criterion(criterion) else _eager_loss(criterion))
            return criterion
        return build_criterion

    wrap(FairseqTask, "build_criterion", make, __name__,
         "(self, cfg: omegaconf.dictconfig.DictConfig, from_checkpoint=False)")


def install():
    common_options.add_fields(__name__, _CompileFields, after="amp_scale_window")
    _install_trainer()
    _install_cli()
    _install_build_model()
    _install_build_criterion()

