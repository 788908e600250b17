"""Patch: fairseq's ``--bf16`` means bf16 on a GPU or CPU, not a TPU; and record whether ``--amp`` is on.

fairseq's ``options.py`` turns ``--bf16`` into ``--tpu``, so on a GPU or a CPU ``fairseq-train --bf16`` dies in
``get_tpu_device``. The patch wraps ``distributed_utils.call_main`` (the entry of fairseq-train,
fairseq-hydra-train, fairseq-validate and fairseq-interactive, called after the plugin is imported): where that
crash would happen -- torch_xla not installed, ``--tpu`` not asked for -- ``--bf16`` means what
fairseq-hydra-train's ``common.bf16=true`` already means on those devices: bf16 weights with an fp32 master copy.
The same entry tells ``umst_plugin.mixed_precision`` whether this command line asked for ``--amp`` and which
``--amp-dtype`` it named: the precision of validation and decoding (``inference_amp``, ``inference_amp_dtype``;
fairseq-generate, which does not pass through ``call_main``, tells it in ``patches/generate_cli.py``).
"""
import logging

import torch

from umst_plugin import mixed_precision
from umst_plugin.patches import wrap

logger = logging.getLogger(__name__)

TARGET = "fairseq.distributed.utils.call_main"
SYMPTOM = ("fairseq-train --bf16 dies in get_tpu_device on a GPU or CPU; a checkpoint trained with --amp "
           "validated under autocast wherever it was loaded")
REMOVE_WHEN = "fairseq keeps --bf16 apart from --tpu (upstream fairseq after 0.12)"


def _tpu_explicitly_requested(argv):
    return any(a == "--tpu" or a.lstrip("+").startswith("common.tpu=") for a in argv)


def plain_bf16_means_bf16(cfg, argv=None):
    """fairseq's options.py turns ``--bf16`` into ``--tpu``, so on a GPU or a CPU ``fairseq-train --bf16`` dies in
    ``get_tpu_device``. Where that would happen -- torch_xla not installed, ``--tpu`` not asked for -- make it
    mean what fairseq-hydra-train's ``common.bf16=true`` already means on those devices: bf16 weights with an
    fp32 master copy (fairseq's FP16Optimizer, no loss scaling). With torch_xla present nothing changes, so
    TPUs keep fairseq's behaviour. Returns whether the config was changed."""
    import importlib.util
    import sys

    from omegaconf import open_dict

    common = cfg.common
    if not (getattr(common, "bf16", False) and getattr(common, "tpu", False)):
        return False
    if importlib.util.find_spec("torch_xla") is not None or _tpu_explicitly_requested(sys.argv if argv is None
                                                                                      else argv):
        return False
    for group in ("common", "distributed_training"):
        node = getattr(cfg, group, None)
        if node is not None and "tpu" in node:
            with open_dict(node):
                node.tpu = False
    logger.info("--bf16 without torch_xla: bf16 weights on %s (fp32 master copy), not a TPU",
                "CPU" if getattr(common, "cpu", False) or not torch.cuda.is_available() else "CUDA")
    return True


def install():
    """Route fairseq's CLI entry through ``plain_bf16_means_bf16`` and the ``--amp`` / ``--amp-dtype`` record."""
    from fairseq.distributed import utils as distributed_utils

    def make(call_main):
        def call_main_with_bf16_on_any_device(cfg, main, **kwargs):
            plain_bf16_means_bf16(cfg)
            mixed_precision.record_command_line(cfg)
            return call_main(cfg, main, **kwargs)
        return call_main_with_bf16_on_any_device

    wrap(distributed_utils, "call_main", make, __name__,
         "(cfg: fairseq.dataclass.configs.FairseqConfig, main, **kwargs)")
