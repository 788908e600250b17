"""The suite's C++ compiler (tests/fast_cxx/g++, which conftest.py puts in CXX): inductor's kernels built by it
compute what the same kernels built with inductor's own flags compute, bit for bit."""
import os

import conftest
import torch
import torch.nn.functional as F

WRAPPER = conftest.SUITE_CXX


def _layer(x, w, b):
    """Reductions, transcendental functions and a chain of elementwise products: what -O3 could reorder or contract
    into fused multiply-adds if inductor let it."""
    y = F.layer_norm(x, (x.shape[-1],), w, b)
    return torch.softmax(F.gelu(y) * 1.7 + x.exp().sum(-1, keepdim=True).log() * y, -1)


def _compiled_with(cxx, *args):
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    with fresh_cache(), inductor_config.patch({"cpp.cxx": (cxx,)}):
        assert cpp_builder.get_cpp_compiler() == cxx
        out = torch.compile(_layer, backend="inductor", fullgraph=True)(*args)
    torch._dynamo.reset()
    return out


def test_the_suite_compiles_with_the_wrapper_unless_cxx_was_set():
    assert os.access(WRAPPER, os.X_OK) and os.path.basename(WRAPPER) == "g++"  # (inductor: "is gcc" by name)
    assert os.environ["CXX"] == WRAPPER or conftest.CXX_FROM_ENVIRONMENT


def test_kernels_built_by_the_wrapper_equal_those_built_with_inductors_flags():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 53, generator=gen) * 3
    w, b = torch.randn(53, generator=gen), torch.randn(53, generator=gen)
    fast = _compiled_with(WRAPPER, x, w, b)
    optimised = _compiled_with("g++", x, w, b)
    assert torch.equal(fast, optimised), (fast - optimised).abs().max()
    # and both are the layer's eager values to float32 rounding (not the same bits: other summation orders)
    torch.testing.assert_close(fast, _layer(x, w, b), atol=1e-6, rtol=1e-5)
