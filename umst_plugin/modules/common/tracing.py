"""Whether torch.compile is tracing the current call, for the blocks that build a different (equal-valued) graph
for the compiler than for eager code."""
import torch


def compiling() -> bool:
    """True while dynamo traces this call (``torch.compiler.is_compiling``); False in eager code and on a torch
    without ``torch.compiler``."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())
