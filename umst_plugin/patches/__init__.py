"""The plugin's fixes of fairseq's (and torch's) internals, in one place: one module per target.

Each module names its ``TARGET`` (what it replaces or wraps), the ``SYMPTOM`` users saw without it, and
``REMOVE_WHEN`` (the upstream change that makes it unnecessary), and has an idempotent ``install()``. Every
function or method a patch replaces is replaced through :func:`wrap`, which

* checks the signature of what it replaces (:func:`expect_signature`) and raises :class:`PatchError` on a fairseq
  whose code differs, instead of silently patching something else;
* marks the replacement with the patch's name (``_umst_patch``), so a second ``install()`` changes nothing, even
  after another patch wrapped the same function since;
* keeps the original as the replacement's ``__wrapped__`` (:func:`original`), as ``functools.wraps`` does: what
  the replacement calls, what ``inspect.signature`` reports, what a test compares with.

The patches were written against fairseq-fixed ``FAIRSEQ_VERSION``; on another version :func:`install_all`
logs a warning and relies on the signature checks.

The plugin's features with their own options (``--amp-dtype``, ``--compile``, ``--stop-on-signals``, fairseq's adam
in one kernel, ...) live with what they serve and change fairseq's code through :func:`wrap` too; they are listed,
in install order, in ``umst_plugin/features.py``, and installed after the fixes.

Importing the plugin installs every patch for every fairseq run in the process, stock ``--task translation
--arch transformer`` runs included. :data:`STOCK_NUMBERS` says, per patch, whether it changes such a run's numbers
(losses, weights, outputs): no, or yes because it fixes a named fairseq bug. ``tests/test_resume_matrix.py``
holds a stock fp32 transformer's 50-update losses with and without the plugin to float32 rounding.

``python -m umst_plugin.patches`` prints the table of the fixes, then that of the features (docs/install.md,
"What the plugin changes in fairseq").
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
    "bf16_cli_flag",
    "generate_cli",
    "checkpoint_precision",
    "amp_optimizer",
    "task_autocast",
    "cudnn_attention",
    "pair_dataset_sizes",
    "collate_tokens",
    "resume_batch_order",
    "incremental_state_lookup",
    "broadcast_checkpoint_load",
    "partition_symbols",
    "encoder_padding_mask",
    "decoder_padding_mask",
    "inductor_scan",
    "saved_activation_strides",
)


# patch -> does it change the numbers of a stock fairseq run (no --user-dir needed for the run itself) once the
# plugin is loaded: "no", or "yes, because <the fairseq bug it fixes>"
STOCK_NUMBERS = {
    "checkpoint_classes": "no: torch loads the same values (without it, fairseq 0.12 resumes no legacy-arch "
                          "checkpoint under torch>=2.6)",
    "hydra_legacy_models": "no: only runs stock fairseq-hydra-train cannot build",
    "prefetch_thread_exit": "no: only how the prefetch thread ends at exit",
    "lightconv_conv_bias": "no: the unused conv_bias of lightconv/dynamicconv holds zeros instead of "
                           "uninitialized memory; the forward pass never reads it",
    "bf16_cli_flag": "yes with --bf16 off TPUs, because fairseq died there (get_tpu_device); no otherwise",
    "generate_cli": "no: records the command line's --amp / --amp-dtype for decoding",
    "checkpoint_precision": "yes with --amp at decoding and a bf16-trained checkpoint, because fairseq autocast it "
                            "in fp16; no otherwise",
    "amp_optimizer": "yes under --amp, because fairseq divided every update by the loss scale (GPU), left fp16 "
                     "gradients unscaled on a CPU, read --fp16-init-scale for --amp-init-scale and --amp-init-scale "
                     "for --amp-scale-window (the defaults give fairseq's scale, 128); no without --amp",
    "task_autocast": "yes under --amp on a CPU, because fairseq trained in fp32 there (its autocast is CUDA-only), "
                     "and validation/decoding autocast under --amp; no without --amp",
    "cudnn_attention": "yes for fp16/bf16 attention on a GPU where torch picked cuDNN's backend, because its "
                       "backward gave wrong gradients or failed; no on a CPU and for fp32",
    "pair_dataset_sizes": "no: the same sizes, without numpy's warning; runs with --num-batch-buckets, which "
                          "stopped at start-up under numpy 2, get fairseq's buckets",
    "collate_tokens": "no: the same padded tensors (tests/test_collate_tokens.py compares them with fairseq's own)",
    "resume_batch_order": "yes for a run resumed in epoch 2 or later, because fairseq cut its batches from another "
                          "example order than the run it resumes (some sentences twice in the epoch, others not "
                          "at all); no for uninterrupted runs and resumes in epoch 1",
    "incremental_state_lookup": "no: the same lookup result, tested for a missing state first",
    "broadcast_checkpoint_load": "no: the same bytes loaded on every rank (without it, a multi-rank resume stopped)",
    "encoder_padding_mask": "no: the encoder's layers get an all-False padding mask where they got none (a batch "
                            "without source padding), which masks nothing: the same outputs (tested to float32 "
                            "rounding; a GPU may pick another attention kernel for it)",
    "decoder_padding_mask": "no: in training the decoder's layers get an all-False self-attention padding mask "
                            "where they got none (a batch without target padding), which masks nothing: the same "
                            "outputs (tested to float32 rounding); incremental decoding is unchanged",
    "partition_symbols": "no: only torch.compile's split of a graph that torch < 2.13 failed to split (a layer "
                         "that fell back to eager is compiled instead); not installed on torch >= 2.13",
    "inductor_scan": "no: only programs compiled for a GPU (--compile): a prefix sum runs as ATen's scan, not a "
                     "Triton one (integer sums, the same values)",
    "saved_activation_strides": "no: only a compiled backward (--compile) whose saved activation inductor laid out "
                                "otherwise than the traced graph: it runs compiled for every batch size instead of "
                                "failing and falling back to eager (the same values)",
}


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


MARKER = "_umst_patch"  # a replacement's attribute: the name of the patch that installed it


def installed(function, patch):
    """Whether ``function`` is ``patch``'s replacement, or wraps it (another patch wrapped the same target since)."""
    while function is not None:
        if getattr(function, MARKER, None) == patch:
            return True
        function = getattr(function, "__wrapped__", None)
    return False


def original(function):
    """What the replacement ``function`` replaced (its ``__wrapped__``): fairseq's or torch's own, or the
    replacement of a patch installed before."""
    return function.__wrapped__


def wrap(owner, name, make, patch, signature=None):
    """Replace ``owner.name`` -- a function of a module, or a method of a class (a staticmethod or classmethod of its
    own stays one) -- by ``make(original)``, where ``original`` is the function found there now; once per
    ``patch``. Before replacing it, its signature must print as ``signature`` (:func:`expect_signature`; None: not
    checked, for a target whose arguments the patch does not depend on). The replacement is marked with ``patch``,
    keeps ``original`` as ``__wrapped__`` and takes its docstring where it has none of its own. Returns the
    replacement, or None where ``patch`` had installed it already."""
    raw = owner.__dict__.get(name) if isinstance(owner, type) and name in owner.__dict__ else getattr(owner, name)
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    current = raw.__func__ if kind is not None else raw
    if installed(current, patch):
        return None
    if signature is not None:
        expect_signature(getattr(owner, name), signature, patch)
    replacement = make(current)
    setattr(replacement, MARKER, patch)
    replacement.__wrapped__ = current
    if replacement.__doc__ is None:
        replacement.__doc__ = current.__doc__
    setattr(owner, name, kind(replacement) if kind is not None else replacement)
    return replacement


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
    """(module, target, symptom, changes a stock run's numbers, remove when) of every patch, in install order."""
    rows = []
    for m in modules():
        name = m.__name__.rsplit(".", 1)[-1]
        rows.append((name, m.TARGET, m.SYMPTOM, STOCK_NUMBERS[name], m.REMOVE_WHEN))
    return rows


def markdown_table():
    lines = [f"Written for fairseq-fixed {FAIRSEQ_VERSION}.", "",
             "| patch | target | symptom without it | changes a stock run's numbers | remove when |",
             "|---|---|---|---|---|"]
    lines += [f"| `{name}` | `{target}` | {symptom} | {stock} | {remove} |"
              for name, target, symptom, stock, remove in table()]
    return "\n".join(lines)
