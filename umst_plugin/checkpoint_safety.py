"""Allow-list the classes that fairseq checkpoints pickle.

torch>=2.6 loads checkpoints with ``weights_only=True``. fairseq 0.12
checkpoints hold an ``argparse.Namespace`` (legacy args) and omegaconf
containers (the hydra config), so ``fairseq-generate`` would refuse them. We
add exactly those classes to torch's safe globals at plugin import instead of
turning the safety off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``) globally.
"""
import argparse
import collections
import typing

import torch


def fairseq_checkpoint_classes():
    classes = [argparse.Namespace, collections.defaultdict, collections.OrderedDict, typing.Any, dict, list, int]
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode, ValueNode

        classes += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, BooleanNode, EnumNode,
                    FloatNode, IntegerNode, StringNode, ValueNode]
    except ImportError:  # omegaconf missing means fairseq is missing; nothing to allow
        pass
    return classes


def allow_fairseq_checkpoint_classes():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no allow-list and loads without weights_only anyway
        add(fairseq_checkpoint_classes())
