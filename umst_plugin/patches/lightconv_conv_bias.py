"""Patch: give fairseq's lightconv/dynamicconv models a defined ``conv_bias``.

fairseq's ``lightconv`` architectures (the DynamicConv rows of the Prime tables)
build their convolutions with ``DynamicConv_scripatable``, which always allocates
``conv_bias = nn.Parameter(torch.Tensor(input_size))`` -- uninitialized memory --
and sets it to zero only when ``conv_bias=True``. With the default
``conv_bias=False`` the parameter is never used in the forward pass, but it is a
real parameter: it is saved in every checkpoint, averaged by
``umst-average-checkpoints``, and counted by parameter checks. Whatever bytes the
allocator handed back end up there, NaN and Inf included (reproduced: 18 of 20
constructions right after freeing a NaN tensor of the same size), so "are all
weights finite?" fails at random on a model that trains correctly.

``install()`` (called on plugin import) wraps ``reset_parameters`` so the unused
bias is zeroed as well. The forward pass is unchanged: it adds ``conv_bias`` only
when ``has_conv_bias`` is set, exactly as before.
"""
import torch

from umst_plugin.patches import wrap

TARGET = "fairseq.modules.dynamic_convolution.DynamicConv_scripatable.reset_parameters"
SYMPTOM = "lightconv/dynamicconv checkpoints hold uninitialized memory (NaN/Inf) in the unused conv_bias"
REMOVE_WHEN = "fairseq initializes conv_bias when conv_bias=False"


def install():
    from fairseq.modules.dynamic_convolution import DynamicConv_scripatable

    def make(original):
        def reset_parameters(self):
            original(self)
            if not self.has_conv_bias:
                with torch.no_grad():
                    self.conv_bias.zero_()
        return reset_parameters

    wrap(DynamicConv_scripatable, "reset_parameters", make, __name__, "(self)")
