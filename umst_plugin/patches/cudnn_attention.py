"""Patch: torch's cuDNN backend of ``scaled_dot_product_attention`` is switched off.

Seen on an NVIDIA H100 with torch 2.11.0+cu130 (``umst_dev/find_nonfinite.py``, ``docs/results/gpu-*``): for
bf16/fp16 attention with a padding mask (UMST, 372 sentences of up to 9 tokens), torch picks the cuDNN backend,
whose backward either fails (``RuntimeError: Expected mha_graph.execute(...).is_good() to be true``), or returns
wrong gradients (largest |gradient| of the embeddings 1.85e3 instead of 0.57 with the other backends), or faults
(``CUDA error: an illegal memory access``) -- so bf16 ``--amp`` training met a non-finite gradient at its first
update. With cuDNN excluded the same step is finite and matches fp32. Flash and memory-efficient attention stay
on; only the cuDNN backend is switched off, process-wide, when the plugin is imported (also for fairseq's own
attention in the same process). ``UMST_CUDNN_ATTENTION=1`` keeps it on (to test a newer torch:
``python -m umst_dev.find_nonfinite --sdpa CUDNN_ATTENTION,...``).
"""
import logging
import os

import torch

logger = logging.getLogger(__name__)

TARGET = "torch.backends.cuda cuDNN scaled-dot-product attention (enable_cudnn_sdp)"
SYMPTOM = ("bf16/fp16 attention with padding masks on an H100: backward fails, gives wrong gradients or an "
           "illegal memory access; bf16 --amp training stops at its first update")
REMOVE_WHEN = "a torch whose cuDNN attention passes python -m umst_dev.find_nonfinite --sdpa CUDNN_ATTENTION on a GPU"


def install():
    enable = getattr(torch.backends.cuda, "enable_cudnn_sdp", None)
    if enable is None or os.environ.get("UMST_CUDNN_ATTENTION") == "1":
        return
    enable(False)
