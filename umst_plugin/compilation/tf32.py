"""``--tf32``: fp32 matmuls on TensorFloat-32 tensor cores (Ampere and newer GPUs).

PyTorch's defaults are ``torch.backends.cuda.matmul.allow_tf32 = False`` (matmuls in full fp32) and
``torch.backends.cudnn.allow_tf32 = True`` (cuDNN convolutions already in TF32); the flag sets both True.
"""
import logging

import torch

logger = logging.getLogger(__package__)


def tf32_supported(device=None):
    """Whether ``device`` (default: the current CUDA device) has TF32 tensor cores (compute capability >= 8.0)."""
    if not torch.cuda.is_available():
        return False
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def set_tf32(enabled, device=None):
    """``--tf32``: fp32 matmuls and cuDNN convolutions in TensorFloat-32 on a GPU that has it (an info line); a
    warning where asked for without one. ``enabled=False`` changes nothing (PyTorch's defaults: fp32 matmuls in
    full fp32, cuDNN convolutions in TF32). Returns whether TF32 is on."""
    if not enabled:
        return False
    device = torch.device("cuda" if device is None else device)
    if not tf32_supported(device):
        if device.type != "cuda":
            where = f"this run computes on the {device.type}"
        elif not torch.cuda.is_available():
            where = "this process sees no CUDA device"
        else:
            major, minor = torch.cuda.get_device_capability(device)
            where = f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}"
        logger.warning("--tf32: TF32 needs an NVIDIA GPU of compute capability 8.0 or newer (Ampere, Hopper, ...); "
                       "%s, so fp32 matmuls stay in full fp32", where)
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    logger.info("--tf32: fp32 matmuls and convolutions on %s run on TensorFloat-32 tensor cores (inputs rounded to "
                "a 10-bit mantissa, fp32 accumulation)", torch.cuda.get_device_name(device))
    return True
