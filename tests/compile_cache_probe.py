"""One process of tests/test_compile_cache.py: with ``--compile``'s dynamo settings, for each SCALE compile a
function whose custom autograd Function's backward scales the gradient by SCALE (the same forward for every
SCALE), run its backward, and write each gradient with AOTAutograd's cache counters after it.

    python tests/compile_cache_probe.py OUT.pt SCALE...     # TORCHINDUCTOR_CACHE_DIR names the cache to use
"""
import sys

import torch

from umst_plugin.compilation import dispatch


def scaled_gradient(scale):
    class ScaledGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * scale  # (a Python float: dynamo bakes it into the traced backward graph)

    def loss(x):
        return ScaledGradient.apply(x * 2).sin().sum()
    return loss


def main(out, scales):
    from torch._dynamo.utils import counters

    dispatch.configure_dynamo()
    runs = []
    for scale in scales:
        x = torch.linspace(-1, 1, 5, requires_grad=True)
        torch.compile(scaled_gradient(scale), backend="inductor", fullgraph=True)(x).backward()
        runs.append({"scale": scale, "grad": x.grad, "counters": dict(counters["aot_autograd"])})
    torch.save(runs, out)


if __name__ == "__main__":
    main(sys.argv[1], [float(s) for s in sys.argv[2:]])
