"""umst_plugin/modules/prime/dynamic_conv.py equals fairseq's DynamicConv1dTBC (the training path Prime used), in
float64, forward and gradients, and keeps only the input and the kernels for backward."""
import pytest
import torch
from fairseq.modules.dynamic_convolution import DynamicConv1dTBC

from umst_plugin.modules.prime.dynamic_conv import DynamicConv1d


def pair(channels, kernel, heads, padding_l, seed=0):
    torch.manual_seed(seed)
    ours = DynamicConv1d(channels, kernel, padding_l, heads, weight_softmax=True).double()
    torch.manual_seed(seed)
    theirs = DynamicConv1dTBC(channels, kernel, padding_l, heads, weight_softmax=True).double()
    return ours, theirs


@pytest.mark.parametrize("kernel,causal,length", [(3, False, 9), (15, False, 9), (15, True, 9), (4, False, 20),
                                                 (7, True, 3), (2, True, 1)])
def test_equals_fairseq_forward_and_gradients(kernel, causal, length):
    ours, theirs = pair(16, kernel, 4, kernel - 1 if causal else kernel // 2)
    assert torch.equal(ours.weight_linear.weight, theirs.weight_linear.weight)  # same init from the same seed
    x = torch.randn(length, 3, 16, dtype=torch.float64)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [ours(xs[0]), theirs(xs[1], unfold=False)]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(outs[0])
    for o in outs:
        o.backward(grad)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.weight_linear.weight.grad, theirs.weight_linear.weight.grad, rtol=1e-12,
                               atol=1e-12)


def test_state_dicts_are_interchangeable():
    ours, theirs = pair(16, 5, 4, 2)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    other = DynamicConv1d(16, 5, 2, 4).double()
    other.load_state_dict(theirs.state_dict())
    x = torch.randn(6, 2, 16, dtype=torch.float64)
    torch.testing.assert_close(other(x), theirs(x, unfold=False))


def test_incremental_decoding_equals_the_causal_convolution():
    ours, _ = pair(16, 4, 2, 3)
    ours.eval()
    x = torch.randn(7, 2, 16, dtype=torch.float64)
    full = ours(x)
    state, steps = {}, []
    for t in range(7):
        steps.append(ours(x[t:t + 1], incremental_state=state))
        if t == 3:  # a beam reorder that keeps the order
            ours.reorder_incremental_state(state, torch.arange(2))
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-12, atol=1e-12)


def test_backward_keeps_the_input_and_kernels_not_a_band_matrix():
    """Saved for backward, per call: about the padded input and the T x B x H x K kernels (fairseq's
    training path keeps a B*H x T x T band matrix)."""
    channels, kernel, heads, length, batch = 64, 15, 4, 100, 8
    ours, theirs = pair(channels, kernel, heads, kernel // 2)
    x = torch.randn(length, batch, channels, dtype=torch.float64, requires_grad=True)

    def saved_bytes(fn):
        seen = {}

        def pack(t):
            s = t.untyped_storage()
            seen.setdefault(s.data_ptr(), s.nbytes())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(seen.values())

    params = sum(p.numel() for p in ours.parameters()) * 8
    mine = saved_bytes(lambda: ours(x)) - params
    fairseqs = saved_bytes(lambda: theirs(x, unfold=False)) - params
    inputs = (length + kernel - 1) * batch * channels * 8 + 2 * length * batch * heads * kernel * 8
    assert mine <= 1.05 * inputs + x.numel() * 8, (mine, inputs)
    assert fairseqs > 2 * mine


def test_the_lean_function_has_the_gradients_of_its_formula_with_dropconnect():
    """gradcheck (float64) of softmax -> DropConnect mask -> K-tap convolution, causal and centred."""
    from umst_plugin.modules.prime.dynamic_conv import DynamicConvolution

    torch.manual_seed(3)
    for padding_l in (1, 3):
        x = torch.randn(6, 2, 8, dtype=torch.float64, requires_grad=True)
        logits = torch.randn(6, 2, 2, 4, dtype=torch.float64, requires_grad=True)
        keep = torch.rand(6, 2, 2, 4) >= 0.25
        assert torch.autograd.gradcheck(lambda a, b: DynamicConvolution.apply(a, b, keep, 0.25, padding_l),
                                        (x, logits))
