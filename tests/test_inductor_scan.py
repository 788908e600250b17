"""``patches/inductor_scan.py``: under --compile, a prefix sum in a program compiled for a GPU is ATen's scan call,
not a Triton scan (two of TranSFormer's took 161 s and 212 s to compile for an H200); a CPU's program keeps
inductor's own scan. Here, on a CPU, the CPU stands in for the GPU (``LIBRARY_SCAN_DEVICES``)."""
import pytest
import torch

from umst_plugin.compilation import dispatch
from umst_plugin.patches import inductor_scan

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def layout(tokens):
    """The kind of integer bookkeeping TranSFormer's input region does: positions and word starts by prefix sums."""
    real = tokens.ne(1)
    positions = torch.cumsum(real.int(), dim=1) * real + 1  # fairseq's make_positions
    starts = torch.cumsum((tokens % 3 == 0).long() + real.long(), dim=1)
    return positions, starts


def float_sum(tokens):
    """A floating prefix sum: it keeps its dtype (inductor's int64 rule is for integer and boolean inputs)."""
    return torch.cumsum(tokens * 0.5 + 0.25, dim=1)


def compiled_code(fn, *args):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False, force_disable_caches=True):
        out, code = run_and_get_code(torch.compile(fn, dynamic=True, fullgraph=True), *args)
    return out, "\n".join(code)


def test_compile_installs_the_library_scan():
    dispatch.configure_dynamo()  # what --compile runs before compiling the layers
    from torch._inductor import lowering

    patched = lowering.lowerings[torch.ops.aten.cumsum.default]
    assert getattr(patched, "_umst_patch", None) == "inductor_scan"
    inductor_scan.install(load=True)  # idempotent: not wrapped twice
    assert lowering.lowerings[torch.ops.aten.cumsum.default] is patched


def test_a_prefix_sum_compiled_for_a_gpu_is_atens_scan_with_atens_values(monkeypatch):
    """Inductor's own lowering asks for a generated scan (``ir.Scan.create``, which a CPU's C++ backend declines,
    so a CPU's program calls ATen either way); the patched one, for a device in ``LIBRARY_SCAN_DEVICES``, never
    asks and calls ATen's scan, whose integers equal eager's."""
    from torch._inductor import ir

    dispatch.configure_dynamo()
    asked = []
    scan_create = ir.Scan.create.__func__

    def counting_create(cls, *args, **kwargs):
        asked.append(kwargs.get("device"))
        return scan_create(cls, *args, **kwargs)

    monkeypatch.setattr(ir.Scan, "create", classmethod(counting_create))
    batches = [torch.randint(0, 9, (3, 17)), torch.randint(0, 9, (5, 40))]
    for batch in batches:
        batch[0, -4:] = 1  # padding
    compiled_code(layout, batches[0])
    assert len(asked) == 2  # a device not listed: inductor's lowering, a generated scan asked for each prefix sum
    asked.clear()
    monkeypatch.setattr(inductor_scan, "LIBRARY_SCAN_DEVICES", ("cpu",))  # the CPU stands in for a GPU
    for batch in batches:
        out, code = compiled_code(layout, batch)
        assert not asked and code.count("aten.cumsum.default(") == 2, code
        for got, want in zip(out, layout(batch)):
            assert got.dtype == want.dtype and torch.equal(got, want)
        out, code = compiled_code(float_sum, batch.float())
        want = float_sum(batch.float())
        assert code.count("aten.cumsum.default(") == 1 and out.dtype == want.dtype == torch.float32, code
        torch.testing.assert_close(out, want, rtol=0, atol=0)  # ATen's own scan on both sides


def test_a_torch_whose_lowering_differs_is_refused_with_a_clear_error(monkeypatch):
    from torch._inductor import lowering

    from umst_plugin.patches import PatchError

    def other_lowering(x, dim, dtype=None, reverse=False):
        raise AssertionError("never called")

    monkeypatch.setitem(lowering.lowerings, torch.ops.aten.cumsum.default, other_lowering)
    with pytest.raises(PatchError, match=r"inductor's cumsum lowering is \(x, dim, dtype=None, reverse=False\)"):
        inductor_scan.install(load=True)


def test_importing_the_plugin_leaves_inductor_unloaded_and_a_loaded_one_patched(monkeypatch):
    """``import umst_plugin`` installs the patch only where inductor is loaded already (loading it costs seconds
    a run without --compile would pay for nothing): a fresh process that imports the plugin has not loaded
    inductor's lowerings; in a process that has, a plain ``install()`` patches them."""
    import e2e

    from torch._inductor import lowering

    probe = "import sys, umst_plugin; print('torch._inductor.lowering' in sys.modules)"
    out = e2e.fresh_python(probe)
    assert out == "False", out
    op = torch.ops.aten.cumsum.default
    patched = lowering.lowerings[op] if getattr(lowering.lowerings[op], "_umst_patch", None) else None
    if patched is None:
        inductor_scan.install(load=True)
        patched = lowering.lowerings[op]
    monkeypatch.setitem(lowering.lowerings, op, patched.__wrapped__)  # inductor's own, as before the patch
    inductor_scan.install()
    assert getattr(lowering.lowerings[op], "_umst_patch", None) == "inductor_scan"
