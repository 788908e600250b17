"""The pieces the families' hand-written backward passes share (umst_plugin/modules/common/lean_ops.py): dropout as
one op and its backward against autograd's, nothing launched where nothing is dropped, LayerNorm's backward in the
weight's dtype, and the reference-path switch reaching only the modules that have one."""
import torch
import torch.nn.functional as F
from torch import nn

from umst_plugin.modules.common import lean_ops


def test_nothing_is_dropped_without_a_kernel():
    """p = 0 or eval: the input itself, and no mask (so the backward is the gradient itself)."""
    x = torch.randn(4, 5)
    for p, training in ((0.0, True), (0.3, False)):
        assert lean_ops.dropout(x, p, training) is x
        out, mask = lean_ops.dropout_and_mask(x, p, training)
        assert out is x and mask is None
        grad = torch.randn(4, 5)
        assert lean_ops.dropout_backward(grad, None, p) is grad


def test_dropout_and_its_backward_are_autograds():
    """The same mask as F.dropout from the same RNG state, and the gradient autograd gives through it."""
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(64, 32, dtype=torch.float64)
    torch.manual_seed(3)
    want = F.dropout(x, 0.25, training=True)
    (want_grad,) = torch.autograd.grad(want, x, grad)
    torch.manual_seed(3)
    out, mask = lean_ops.dropout_and_mask(x.detach(), 0.25, True)
    assert mask is not None and mask.dtype == torch.bool and not mask.all() and mask.any()
    torch.testing.assert_close(out, want.detach(), rtol=0, atol=0)
    torch.testing.assert_close(lean_ops.dropout_backward(grad, mask, 0.25), want_grad, rtol=1e-12, atol=1e-12)
    torch.manual_seed(3)
    torch.testing.assert_close(lean_ops.dropout(x.detach(), 0.25, True), want.detach(), rtol=0, atol=0)


def test_layer_norm_backward_runs_in_the_weights_dtype():
    """A bf16 gradient and input (a matmul's, under autocast) into a float32 LayerNorm: the gradients come out in
    float32 and equal autograd's on the float32 values."""
    norm = nn.LayerNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(6, 16).to(torch.bfloat16)
    grad = torch.randn(6, 16).to(torch.bfloat16)
    x32 = x.float().requires_grad_()
    out, mean, rstd = torch.ops.aten.native_layer_norm(x32.detach(), [16], norm.weight, norm.bias, 1e-5)
    want = torch.autograd.grad(F.layer_norm(x32, [16], norm.weight, norm.bias, 1e-5), (x32, norm.weight, norm.bias),
                               grad.float())
    got = lean_ops.layer_norm_backward(grad, x, mean, rstd, norm.weight, norm.bias, [True, True, True])
    assert [g.dtype for g in got] == [torch.float32] * 3
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_the_reference_switch_reaches_only_modules_that_have_one():
    class WithReference(nn.Module):
        reference_switch = True

        def __init__(self):
            super().__init__()
            self.reference = False

    model = nn.Sequential(WithReference(), nn.Linear(2, 2), nn.Sequential(WithReference()))
    assert lean_ops.use_reference_path(model) is model
    assert model[0].reference and model[2][0].reference and not hasattr(model[1], "reference")
    lean_ops.use_reference_path(model, on=False)
    assert not model[0].reference and not model[2][0].reference and not hasattr(model, "reference")
