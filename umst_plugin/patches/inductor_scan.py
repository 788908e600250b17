"""Patch: in programs compiled for a GPU, inductor lowers ``cumsum`` to ATen's scan kernel, not to a Triton scan.

Seen in the speed table on an NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6; docs/results/gpu-speed-nvidia-h200-af33e1d):
TranSFormer's compiled warm-up was stopped at the warm-up cap in both calls (about 150 s and 114 s) before its first
compiled region, ``SlowFastInput``, had finished compiling, so the speed table has no compiled TranSFormer row.

The cause, reproduced on a CPU (inductor's program for a simulated H200, each of its Triton kernels then compiled
for sm_90 with Triton and ptxas: ``python -m umst_dev.triton_compile_times``): ``SlowFastInput`` holds the
integer prefix sums of the character layout and the positions (``CharTable._layout``, ``word_ids_from_tokens``,
fairseq's ``make_positions``). Inductor fuses them into two persistent Triton scans over the whole padded source
length, whose bound is ``max_source_positions`` (R0_BLOCK 1024), and autotunes each over three XBLOCKs. Triton
unrolls the scan: the XBLOCK 32 configs (32 x 1024 int64 per program) took 161 s and 212 s to compile, every
other kernel of TranSFormer's program under 4 s (docs/results/triton-compile-transformer-sf-cpu.json).

With this patch a ``cumsum`` in a program compiled for a CUDA device is one ATen call: the library scan eager mode
runs, one launch per prefix sum, nothing for Triton to compile. The values are ATen's own (integer sums: exact).
Programs compiled for a CPU keep inductor's lowering (its C++ backend calls ATen's scan itself). Installed by
``--compile`` (``compilation.dispatch.configure_dynamo``) and by :func:`install` once inductor is loaded; a
fairseq run without ``--compile`` never imports inductor for it.
"""
import inspect
import sys

import torch

from umst_plugin.patches import MARKER, PatchError, installed

TARGET = "torch._inductor.lowering.lowerings[aten.cumsum.default] (programs compiled for CUDA devices)"
SYMPTOM = ("TranSFormer's compiled layers never finish compiling on a GPU: Triton takes 161 s and 212 s for two "
           "scan kernels of its input region (the speed table's warm-up stopped at its cap, twice)")
REMOVE_WHEN = ("a torch/Triton that compiles a persistent 32 x 1024 scan in seconds: python -m "
               "umst_dev.triton_compile_times on the transformer_sf program that python -m benchmarks launches "
               "--compile --simulate-gpu h200 dumps")

NAME = __name__.rsplit(".", 1)[-1]
# devices whose compiled programs get ATen's scan: those inductor writes Triton for
LIBRARY_SCAN_DEVICES = ("cuda",)
TORCH_VERSIONS = "torch 2.11 to 2.14"  # those whose inductor lowering the patch was written for and tested under
EXPECTED_SIGNATURE = "(x, axis=None, dtype=None)"  # that lowering's


def install(load=False):
    """Replace inductor's ``cumsum`` lowering (idempotent). Without ``load`` only where inductor is loaded already
    (``import umst_plugin`` must not load it: 2 s); ``--compile`` calls it with ``load=True``."""
    if not load and "torch._inductor.lowering" not in sys.modules:
        return
    from torch._inductor import lowering
    from torch._prims_common import is_boolean_dtype, is_integer_dtype

    op = torch.ops.aten.cumsum.default
    inductors = lowering.lowerings[op]
    if installed(inductors, NAME):
        return
    found = str(inspect.signature(inductors))
    if found != EXPECTED_SIGNATURE or not hasattr(lowering, "fallback_cumsum"):
        raise PatchError(f"{NAME}: inductor's cumsum lowering is {found} (expected {EXPECTED_SIGNATURE}, with "
                         f"lowering.fallback_cumsum) under torch {torch.__version__}; the patch was written for "
                         f"{TORCH_VERSIONS}. Run without --compile, or update the patch")

    def cumsum(x, axis=None, dtype=None):
        device = x.get_device()
        if device is None or device.type not in LIBRARY_SCAN_DEVICES:
            return inductors(x, axis, dtype)
        if dtype is None and (is_integer_dtype(x.get_dtype()) or is_boolean_dtype(x.get_dtype())):
            dtype = torch.int64  # inductor's lowering's own rule (and ATen's) for an integer or boolean prefix sum
        return lowering.fallback_cumsum(x, dim=axis, dtype=dtype)

    setattr(cumsum, MARKER, NAME)
    cumsum.__wrapped__ = inductors
    lowering.lowerings[op] = cumsum
