"""Can torch.compile run here? A tiny function compiled and run on the device at start-up, so that a missing C++
compiler (inductor on a CPU) or an unsupported GPU (Triton) stops the run before training, with the cause."""
import sys
import time

import torch

from umst_plugin.compilation.state import STATE


class CompileUnavailable(RuntimeError):
    """torch.compile cannot run here (no C++ compiler for inductor on a CPU, no Triton, an unsupported torch)."""


def _smoke(x):
    return torch.nn.functional.gelu(x * 2.0 + 1.0)


def check_available(device="cpu", backend="inductor"):
    """Compile and run a tiny function on ``device`` with ``backend`` (once per device type and backend); raise
    :class:`CompileUnavailable` with the cause and what to do if that fails. Returns the seconds it took."""
    device = torch.device(device)
    key = (device.type, backend)
    if key in STATE.probed:
        return STATE.probed[key]
    if not hasattr(torch, "compile"):
        raise CompileUnavailable(f"--compile needs torch >= 2.0 with torch.compile; this is torch {torch.__version__}")
    import torch._dynamo as dynamo  # (the compiler: about 1 s to import, so only once --compile asks for it)

    if not dynamo.is_dynamo_supported():
        raise CompileUnavailable(f"--compile: torch {torch.__version__} cannot compile on Python "
                                 f"{sys.version.split()[0]} (torch._dynamo does not support it); drop --compile or "
                                 "use a Python this torch supports")
    start = time.perf_counter()
    try:
        x = torch.randn(3, 5, device=device)
        fn = torch.compile(_smoke, backend=backend, fullgraph=True)
        torch.testing.assert_close(fn(x), _smoke(x))
    except Exception as e:  # noqa: BLE001 -- re-raised with the cause
        hint = ("inductor compiles C++ on a CPU: install a C++ compiler (g++ or clang; $CXX picks one)"
                if device.type == "cpu" else
                "inductor compiles Triton kernels on a GPU: install the triton that matches this torch; Triton "
                "needs an NVIDIA GPU of compute capability 7.0 or newer")
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CompileUnavailable(f"--compile: torch.compile (backend {backend}) cannot run on {device.type} here: "
                                 f"{type(e).__name__}: {message}\n{hint}; or drop --compile") from e
    STATE.probed[key] = time.perf_counter() - start
    return STATE.probed[key]
