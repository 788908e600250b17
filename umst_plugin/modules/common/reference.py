"""The switch between a family's fast default path and its reference path.

A module class that has a plain reference form of its computation sets ``reference_switch = True`` and reads
``self.reference`` (False by default): UMST's blocks and rectified attention (separate Q/K/V projections,
index-based pooling, gather and segment means, ``F.dropout``), MSC's layers, encoder and decoder (fairseq's
attention modules one by one, masks and cross-attention keys/values per layer, fairseq's incremental state).
Both forms are the same math with the same dropout masks (tested in float64); the reference launches more
kernels."""
from torch import nn


def use_reference_path(module: nn.Module, on: bool = True) -> nn.Module:
    """Run every module under ``module`` that has a reference form (``reference_switch``) in it, or back in the
    default form (``on=False``); returns ``module``."""
    for m in module.modules():
        if getattr(type(m), "reference_switch", False):
            m.reference = on
    return module
