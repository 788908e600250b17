"""``patches/saved_activation_strides.py``: a compiled backward takes the strides of what its forward saved as
expressions of the sizes. torch's own code froze them at the first batch's sizes, wherever inductor laid a saved
activation out otherwise than the traced graph (MSC's encoder layer on an H200: ``AssertionError: expected size
64==64, stride 425984==565248 at dim=2``, 565248 = 1024 x the first batch's 552 sentences).

On a CPU, Prime's convolution with its backward windows as they were before issue 63's fix meets the bug (the
last test). The other tests plant the divergence in a small function: inductor's stride padding, which torch applies
on GPUs and to static shapes only, switched on for the CPU and for dynamic shapes. A saved activation of ``size``
float64 columns then gets the stride ``size`` rounded up to 16 elements (128 bytes), where the traced graph says
``size``."""
import inspect

import pytest
import torch

import umst_plugin  # noqa: F401  (installs the patches)
import unpatched_torch
from umst_plugin.compilation import dispatch
from umst_plugin.patches import PatchError, saved_activation_strides

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# the first batch compiles; 416 is a multiple of the padding's 16 elements (its padded stride equals the traced
# one there: torch's code keeps the traced stride, wrong for the batches after it), the others are not
SIZES = (552, 416, 300, 123, 64)


def saves_a_padded_activation(x, w):
    """The activation ``h`` (3 x size) is saved for the backward of the product; its stride is the padded one."""
    h = torch.relu(x * 2.0 + 1.0)
    return (w @ h).sin().sum()


def run_sizes(function):
    """(size, outcome) for each of SIZES: None where the compiled loss and gradients equal eager's (float64),
    else the error."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(function, dynamic=True)
    w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True, generator=torch.Generator().manual_seed(0))
    outcomes = []
    for size in SIZES:
        x = torch.randn(3, size, dtype=torch.float64, requires_grad=True,
                        generator=torch.Generator().manual_seed(size))
        try:
            loss = compiled(x, w)
            grads = torch.autograd.grad(loss, (x, w))
        except Exception as error:  # noqa: BLE001 -- what torch's own code raises is the point
            outcomes.append((size, error))
            continue
        ref_loss = function(x, w)
        ref_grads = torch.autograd.grad(ref_loss, (x, w))
        # float64, another order of sums: measured (this file's sizes, with and without SIMD) losses within 7.7e-16
        # relative, gradients within 8.9e-16 absolute where small and 5.9e-16 relative where large; bounds ~5x
        torch.testing.assert_close(loss, ref_loss, rtol=4e-15, atol=0)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, rtol=4e-15, atol=4e-15)
        outcomes.append((size, None))
    return outcomes, counters["stats"]["unique_graphs"]


def test_compile_installs_the_patch_once():
    from torch._functorch._aot_autograd import graph_compile
    from torch._inductor import output_code, utils

    dispatch.configure_dynamo()  # what --compile runs before compiling the layers
    backward_compile = graph_compile._aot_stage2b_bw_compile
    assert getattr(backward_compile, "_umst_patch", None) == "saved_activation_strides"
    assert output_code.set_tracing_context_output_strides is utils.set_tracing_context_output_strides
    assert output_code.set_tracing_context_output_strides is saved_activation_strides.set_tracing_context_output_strides
    saved_activation_strides.install(load=True)  # idempotent: not replaced twice
    assert graph_compile._aot_stage2b_bw_compile is backward_compile
    assert saved_activation_strides.LINE in inspect.getsource(backward_compile.__wrapped__)  # torch's own
    # a traceback through the patched function names torch's file at torch's lines
    assert (backward_compile.__code__.co_filename, backward_compile.__code__.co_firstlineno) == \
        (backward_compile.__wrapped__.__code__.co_filename, backward_compile.__wrapped__.__code__.co_firstlineno)


def test_torch_own_code_freezes_a_saved_stride_at_the_first_batch_and_fails_the_next():
    """The symptom, planted on a CPU: the backward's input check fails for every later size whose padded stride
    differs from the first batch's (416's equals its unpadded one), naming the first batch's padded 560."""
    dispatch.configure_dynamo()
    if not saved_activation_strides.applies():
        pytest.skip("this torch compares saved strides symbolically (pytorch/pytorch#191885): nothing to patch")
    with unpatched_torch.planted_layout(), unpatched_torch.saved_activation_strides():
        outcomes, _ = run_sizes(saves_a_padded_activation)
    assert outcomes[0] == (SIZES[0], None)
    failed = {size: error for size, error in outcomes[1:] if error is not None}
    assert set(failed) == set(SIZES[1:]), outcomes
    for size, error in failed.items():
        assert isinstance(error, AssertionError) and "==560 at dim=0" in str(error), (size, error)


def test_the_patched_backward_compiles_every_size_and_equals_eager():
    """The same sizes with the patch: every batch runs compiled, loss and gradients equal eager's. One more compile
    at most (a stride expression of the sizes may add a guard: the padded stride equal to the unpadded one or
    not), not one per size."""
    dispatch.configure_dynamo()
    with unpatched_torch.planted_layout():
        outcomes, graphs = run_sizes(saves_a_padded_activation)
    assert all(error is None for _, error in outcomes), outcomes
    assert graphs <= 2, graphs


def test_without_a_divergent_layout_the_patch_changes_nothing():
    """Inductor's layouts as torch sets them on a CPU: the saved strides are the traced ones, one compile serves
    every size, with and without the patch."""
    dispatch.configure_dynamo()
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False, force_disable_caches=True):
        patched = run_sizes(saves_a_padded_activation)
        with unpatched_torch.saved_activation_strides():
            own = run_sizes(saves_a_padded_activation)
    assert patched == own and all(error is None for _, error in patched[0]) and patched[1] == 1, (patched, own)


def test_a_torch_whose_backward_compile_differs_is_refused_with_a_clear_error(monkeypatch):
    from torch._functorch._aot_autograd import graph_compile

    def _aot_stage2b_bw_compile(bw_module):
        if guard_or_true(ph_arg.stride()[k] != int(real_stride[k])):  # noqa: F821
            pass
        if guard_or_true(ph_arg.stride()[k] != int(real_stride[k])):  # noqa: F821 -- twice: not torch's function
            pass

    monkeypatch.setattr(graph_compile, "_aot_stage2b_bw_compile", _aot_stage2b_bw_compile)
    with pytest.raises(PatchError, match=r"_aot_stage2b_bw_compile is not the function the patch was written for"):
        saved_activation_strides.install(load=True)


def test_a_torch_that_compares_strides_symbolically_is_left_as_it_is(monkeypatch):
    """A torch whose backward compile no longer has the line the patch replaces (the bug fixed upstream) gets no
    patch and no error: ``install`` leaves its function and torch's stride function as they are."""
    from torch._functorch._aot_autograd import graph_compile
    from torch._inductor import output_code, utils

    def _aot_stage2b_bw_compile(bw_module):
        return bw_module  # (no frozen comparison in it)

    def set_tracing_context_output_strides(example_inputs, compiled_graph):
        return None

    monkeypatch.setattr(graph_compile, "_aot_stage2b_bw_compile", _aot_stage2b_bw_compile)
    monkeypatch.setattr(utils, "set_tracing_context_output_strides", set_tracing_context_output_strides)
    monkeypatch.setattr(output_code, "set_tracing_context_output_strides", set_tracing_context_output_strides)
    assert not saved_activation_strides.applies()
    saved_activation_strides.install(load=True)
    assert graph_compile._aot_stage2b_bw_compile is _aot_stage2b_bw_compile
    assert utils.set_tracing_context_output_strides is output_code.set_tracing_context_output_strides is \
        set_tracing_context_output_strides


def test_importing_the_plugin_leaves_inductor_unloaded_and_a_loaded_one_patched(monkeypatch):
    """``import umst_plugin`` installs the patch only where inductor is loaded already (a run without --compile
    does not pay seconds to load it): a fresh process that imports the plugin has not loaded inductor's
    ``output_code``; in a process that has, a plain ``install()`` patches torch's functions."""
    import e2e

    from torch._functorch._aot_autograd import graph_compile
    from torch._inductor import output_code, utils

    probe = "import sys, umst_plugin; print('torch._inductor.output_code' in sys.modules)"
    out = e2e.fresh_python(probe)
    assert out == "False", out
    saved_activation_strides.install(load=True)
    for owner, name in ((graph_compile, "_aot_stage2b_bw_compile"), (utils, "set_tracing_context_output_strides"),
                        (output_code, "set_tracing_context_output_strides")):
        monkeypatch.setattr(owner, name, getattr(owner, name).__wrapped__)  # torch's own, as before the patch
    saved_activation_strides.install()
    assert getattr(graph_compile._aot_stage2b_bw_compile, "_umst_patch", None) == "saved_activation_strides"
    assert output_code.set_tracing_context_output_strides is saved_activation_strides.set_tracing_context_output_strides


def test_prime_s_convolution_with_its_old_backward_windows_runs_compiled_at_every_size(monkeypatch):
    """A real layer that met the bug on a CPU: Prime's two-cell dynamic convolution (kernels 3 and 15) with its
    backward windows built by the forward's ops, as before the fix of issue 63, whose compiled backward failed
    inductor's check at the first short batch of another batch size. That fix changed the layer; the failure was
    this one (torch's code still fails there, ``tests/test_compile_stream.py`` uses it as its real failing
    backward). With the patch every size runs compiled, nothing falls back, and the gradients equal eager's."""
    from test_compile_stream import OLD_WINDOWS_MEET_THE_BUG, _old_backward_windows, conv_gradients, conv_layer

    from umst_dev import compiled_layers
    from umst_plugin import compilation
    from umst_plugin.compilation.state import STATE
    from umst_plugin.modules.prime.dynamic_conv import DynamicConvolution

    # float32, another order of sums: measured 6.3e-7 of the largest element apart at most (with and without SIMD)
    BOUND = 2.5e-6

    def compiled_layer():
        torch._dynamo.reset()
        STATE.eager_variants.clear()
        model = torch.nn.Sequential(conv_layer())
        compilation.compile_layers(model)
        return model[0]

    import torch._inductor.config as inductor_config

    monkeypatch.setattr(DynamicConvolution, "_backward_windows", staticmethod(_old_backward_windows))
    monkeypatch.setattr(STATE, "eager_variants", {})
    with inductor_config.patch(fx_graph_cache=False, force_disable_caches=True):
        layer, eager = compiled_layer(), conv_layer()
        apart = 0.0
        for T, B in ((10, 5), (5, 4), (12, 3), (4, 6), (9, 2)):
            for got, want in zip(conv_gradients(layer, T, B), conv_gradients(eager, T, B)):
                apart = max(apart, ((got - want).abs().max() / want.abs().max()).item())
        print(f"compiled gradients apart from eager's by {apart:.1e} of their largest element at most")
        assert apart < BOUND
        assert compiled_layers.eager_variants() == {}

        with unpatched_torch.saved_activation_strides():
            layer = compiled_layer()
            conv_gradients(layer, 10, 5)
            if not OLD_WINDOWS_MEET_THE_BUG:
                # torch 2.14's inductor lays these windows out as traced: its own code runs every size
                # (tests/test_compile_stream.py then plants the layout for its failing backward)
                conv_gradients(layer, 5, 4)
                assert compiled_layers.eager_variants() == {}
                return
            with pytest.raises(AssertionError, match=r"expected size \d+==\d+, stride \d+==\d+ at dim"):
                conv_gradients(layer, 5, 4)
