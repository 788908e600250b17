"""Every change the plugin makes to fairseq's (and torch's) internals, in one place: one module per target.

Each module names its ``TARGET`` (what it replaces or wraps), the ``SYMPTOM`` users saw without it, and
``REMOVE_WHEN`` (the upstream change that makes it unnecessary), and has an idempotent ``install()``. Before
replacing anything, ``install()`` checks the signature of what it replaces (:func:`expect_signature`) and
raises :class:`PatchError` on a fairseq whose code differs, instead of silently patching something else.
The patches were written against fairseq-fixed ``FAIRSEQ_VERSION``; on another version :func:`install_all`
logs a warning and relies on the signature checks.

``python -m umst_plugin.patches`` prints the table (docs/install.md, "What the plugin changes in fairseq").
"""
import importlib
import inspect
import logging

logger = logging.getLogger(__name__)

FAIRSEQ_VERSION = "0.12.3.1"

# In install order. Names say what each fixes.
PATCHES = (
    "checkpoint_classes",
    "hydra_legacy_models",
    "prefetch_thread_exit",
    "lightconv_conv_bias",
    "amp_dtype_flag",
    "bf16_cli_flag",
    "generate_cli",
    "checkpoint_precision",
    "amp_optimizer",
    "task_autocast",
    "cudnn_attention",
    "fused_adam",
    "grad_norm",
    "pair_dataset_sizes",
    "incremental_state_lookup",
    "compile_flags",
    "broadcast_checkpoint_load",
    "preemption",
)


class PatchError(RuntimeError):
    """A patch's target is not the code it was written for."""


def expect_signature(func, expected, patch):
    """Raise PatchError unless ``func``'s signature prints as ``expected``."""
    found = str(inspect.signature(func))
    if found != expected:
        import fairseq

        raise PatchError(
            f"{patch}: {getattr(func, '__qualname__', func)} has signature {found}, expected {expected} "
            f"(written for fairseq-fixed {FAIRSEQ_VERSION}, found fairseq {fairseq.__version__}). "
            "The plugin does not know this fairseq; install fairseq-fixed==0.12.3.1 (docs/install.md).")


def as_config(cfg):
    """A fairseq CLI main's argument as the DictConfig it works on: fairseq's mains still take an argparse
    Namespace from older callers and convert it first (``convert_namespace_to_omegaconf``); a wrapper that reads
    the config before calling them does the same."""
    from argparse import Namespace

    if isinstance(cfg, Namespace):
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        return convert_namespace_to_omegaconf(cfg)
    return cfg


def modules():
    return [importlib.import_module(f"{__name__}.{name}") for name in PATCHES]


def install_all():
    """Install every patch (idempotent). Called once, on ``import umst_plugin``."""
    import fairseq

    if fairseq.__version__ != FAIRSEQ_VERSION:
        logger.warning("umst_plugin's fairseq patches were written for fairseq-fixed %s; this is fairseq %s "
                       "(each patch checks the code it replaces and stops with an error if it differs)",
                       FAIRSEQ_VERSION, fairseq.__version__)
    for module in modules():
        module.install()


def table():
    """(module, target, symptom, remove when) of every patch, in install order."""
    return [(m.__name__.rsplit(".", 1)[-1], m.TARGET, m.SYMPTOM, m.REMOVE_WHEN) for m in modules()]


def markdown_table():
    lines = [f"Written for fairseq-fixed {FAIRSEQ_VERSION}.", "",
             "| patch | target | symptom without it | remove when |", "|---|---|---|---|"]
    lines += [f"| `{name}` | `{target}` | {symptom} | {remove} |" for name, target, symptom, remove in table()]
    return "\n".join(lines)
