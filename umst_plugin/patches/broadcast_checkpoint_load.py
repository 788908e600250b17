"""Patch: a checkpoint that rank 0 loads and broadcasts loads on the other ranks under torch>=2.6.

When several ranks resume (``checkpoint_last.pt`` of a multi-GPU or multi-node run), fairseq's
``Trainer.load_checkpoint`` loads the file on rank 0 only and sends its state to the others with
``distributed_utils.broadcast_object``: the tensors directly, the rest pickled by ``torch.save`` and read back by
``_broadcast_object_slow`` with a plain ``torch.load``, which torch>=2.6 runs with ``weights_only=True``. That rest
holds the run's config as omegaconf objects (``load_checkpoint_to_cpu`` makes a ``DictConfig`` of it), which torch
refuses: every rank but 0 stops with "Weights only load failed ... omegaconf.dictconfig.DictConfig". Seen when a
2-node run requeued after preemption resumed (scripts/rehearse-wmt.sh); no resume of a multi-rank run worked.

The bytes are rank 0's own ``torch.save`` of a state it loaded with ``weights_only=True``. The patch allows
exactly the classes of that state (found by loading real checkpoints' broadcast states: omegaconf's containers and
nodes, ``typing.Any``, ``collections.defaultdict``, fairseq's ``_TensorPlaceholder``) for the duration of the
call only (``torch.serialization.safe_globals``), instead of switching the check off.
"""
import collections
import typing

from umst_plugin.patches import wrap

TARGET = "fairseq.distributed.utils._broadcast_object_slow (the torch.load of Trainer.load_checkpoint's broadcast)"
SYMPTOM = ("resuming a multi-GPU or multi-node run: every rank but 0 stops with 'Weights only load failed ... "
           "Unsupported global: omegaconf.dictconfig.DictConfig' (torch>=2.6)")
REMOVE_WHEN = "fairseq loads its broadcast objects with weights_only=False or torch's allow-list, or stores plain containers"


def broadcast_classes():
    """The globals of a broadcast checkpoint state: omegaconf's containers and value nodes and their metadata."""
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import base, dictconfig, listconfig, nodes

    node_classes = [getattr(nodes, name) for name in ("AnyNode", "StringNode", "IntegerNode", "FloatNode",
                                                       "BooleanNode", "EnumNode") if hasattr(nodes, name)]
    return [dictconfig.DictConfig, listconfig.ListConfig, base.ContainerMetadata, base.Metadata, *node_classes,
            typing.Any, dict, list, int, collections.defaultdict, distributed_utils._TensorPlaceholder]


def install():
    import torch
    from fairseq.distributed import utils as distributed_utils

    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:  # torch < 2.5: no weights_only default to work around
        return

    def make(original):
        classes = broadcast_classes()

        def _broadcast_object_slow(obj, src_rank, group, dist_device):
            with safe_globals(classes):
                return original(obj, src_rank, group, dist_device)
        return _broadcast_object_slow

    wrap(distributed_utils, "_broadcast_object_slow", make, __name__,
         "(obj: Any, src_rank: int, group: object, dist_device: torch.device) -> Any")
