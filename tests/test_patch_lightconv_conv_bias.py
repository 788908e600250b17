"""fairseq's lightconv models allocate an unused ``conv_bias`` without initializing it
(umst_plugin/patches/lightconv_conv_bias.py); the plugin makes it zero so checkpoints hold finite weights."""
import torch

import umst_plugin  # noqa: F401  (installs the fix)
from fairseq.modules.dynamic_convolution import DynamicConv_scripatable


def _after_freeing_nan(size):
    # The CPU allocator hands a just-freed block of the same size straight back: without the fix
    # the new parameter would hold these NaNs (18 of 20 constructions did, on this project's CI box).
    poison = torch.full((size,), float("nan"))
    del poison


def test_unused_conv_bias_is_zero_not_leftover_memory():
    for _ in range(20):
        _after_freeing_nan(64)
        conv = DynamicConv_scripatable(64, kernel_size=3, padding_l=1, num_heads=4, conv_bias=False)
        assert torch.equal(conv.conv_bias, torch.zeros_like(conv.conv_bias))


def test_reset_parameters_zeroes_a_poisoned_bias_and_forward_ignores_it():
    torch.manual_seed(0)
    conv = DynamicConv_scripatable(16, kernel_size=3, padding_l=2, num_heads=2, conv_bias=False)
    x = torch.randn(5, 2, 16)
    expected = conv(x)
    with torch.no_grad():
        conv.conv_bias.fill_(float("nan"))
    assert torch.equal(conv(x), expected)  # unused in forward, as in fairseq
    conv.reset_parameters()
    assert torch.equal(conv.conv_bias, torch.zeros_like(conv.conv_bias))


def test_used_conv_bias_still_starts_at_zero_and_is_added():
    conv = DynamicConv_scripatable(16, kernel_size=3, padding_l=2, num_heads=2, conv_bias=True)
    assert torch.equal(conv.conv_bias, torch.zeros_like(conv.conv_bias))
    x = torch.randn(5, 2, 16)
    base = conv(x)
    with torch.no_grad():
        conv.conv_bias.fill_(1.0)
    assert torch.allclose(conv(x), base + 1.0)


def test_install_is_idempotent():
    before = DynamicConv_scripatable.reset_parameters
    umst_plugin.patches.lightconv_conv_bias.install()
    assert DynamicConv_scripatable.reset_parameters is before
