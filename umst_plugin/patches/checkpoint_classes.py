"""Patch: allow-list the classes that fairseq checkpoints pickle.

torch>=2.6 loads checkpoints with ``weights_only=True``. fairseq 0.12 saves its
config with ``OmegaConf.to_container`` (plain dicts), but a legacy (argparse)
architecture's model config -- every arch registered with
``register_model_architecture``, fairseq's transformer included -- stays an
``argparse.Namespace``, which torch refuses. Found by loading real checkpoints
(training with validation, best/last checkpoints, optimizer and meter state)
and adding what torch reported until the load succeeded: that class alone.
We allow exactly it at plugin import instead of switching the safety off
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``) for the whole process.
"""
import argparse

import torch

TARGET = "torch.serialization safe globals (torch.load weights_only=True)"
SYMPTOM = "fairseq checkpoints of legacy archs do not load under torch>=2.6: argparse.Namespace refused"
REMOVE_WHEN = "fairseq stores model configs as plain containers"

FAIRSEQ_CHECKPOINT_CLASSES = [argparse.Namespace]


def install():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no allow-list (and does not default to weights_only)
        add(FAIRSEQ_CHECKPOINT_CLASSES)
