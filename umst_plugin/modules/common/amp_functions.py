"""Custom autograd functions that follow autocast on whatever device their inputs live.

``torch.amp.custom_fwd`` / ``custom_bwd`` bind one device type at decoration time; the plugin's functions run on
CUDA and on CPUs. :func:`amp_forward` records, in the forward pass, whether autocast is on for the first tensor
argument's device and in which dtype; :func:`amp_backward` runs the backward pass under that same autocast, so
its matrix products take the autocast dtype (the autograd engine runs backward with autocast off otherwise:
every matmul of a custom backward would run in fp32 inside a bf16 step). Gradients are returned in the dtype of
their inputs by the autograd engine.
"""
import functools

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the products on ``x`` run in: the autocast dtype where autocast is on for ``x``'s device, else
    ``x``'s own (what masks and per-batch operators that meet those products are built in)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def autocast_cast(t: torch.Tensor, device_type: str = None) -> torch.Tensor:
    """A parameter in the autocast dtype where autocast is on (for ``device_type``, default ``t``'s device), cast
    whole before it is used -- concatenated with others, viewed, handed to a custom autograd function -- as
    autocast would cast it inside the op that reads it: the same values, and the plugin's parameter cast cache
    (``umst_plugin/amp_weights.py``) then makes that cast once per update for all parameters together. Unchanged
    without autocast."""
    device_type = t.device.type if device_type is None else device_type
    if torch.is_autocast_enabled(device_type):
        return t.to(torch.get_autocast_dtype(device_type))
    return t


def amp_forward(forward):
    @functools.wraps(forward)
    def wrapper(ctx, *args, **kwargs):
        device_type = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        ctx.amp_device_type = device_type
        ctx.amp_enabled = torch.is_autocast_enabled(device_type)
        ctx.amp_dtype = torch.get_autocast_dtype(device_type)
        return forward(ctx, *args, **kwargs)
    return wrapper


def amp_backward(backward):
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.autocast(ctx.amp_device_type, dtype=ctx.amp_dtype, enabled=ctx.amp_enabled):
            return backward(ctx, *grads)
    return wrapper


def distinct_output(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a custom autograd function's forward returns it when ``t`` is what an op that returns its own input
    gave: an in-place op (``zeros(...).index_add_(...)``) or ``.to`` the dtype ``t`` already has. A view (no
    kernel, no copy) gives the output a tensor of its own. torch 2.11's dynamo traces an autograd function's
    forward with its intermediates as extra outputs; the tensor before such an op is the returned tensor itself,
    and autograd then routes the output's gradient to the extra output's slot: under ``--compile`` the function's
    gradients were silently wrong (pytorch/pytorch#180642, a regression of 2.11, fixed in 2.12; Prime's
    convolution on the H200's torch 2.11). Eager code and torch 2.12+ give the same values either way."""
    return t.view_as(t)
