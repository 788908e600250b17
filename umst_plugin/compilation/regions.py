"""Which modules ``--compile`` compiles: the compile regions of a model.

A region is compiled as one program. The regions are fairseq's transformer encoder and decoder layers (the
transformer's, UMST's, TranSFormer's and MSMSA's decoders, MSMSA's encoder) and every class that declares itself one
with the class attribute ``compile_region = True`` -- each family's layers (UMST's ``UMSTEncoderLayer``,
TranSFormer's ``SlowFastLayer`` and its encoder input ``SlowFastInput``, MSC's layers, Prime's ``PrimeLayer``).
A new layer class says so where it is defined; this package does not import the families.
"""
import collections

from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

FAIRSEQ_REGIONS = (TransformerEncoderLayerBase, TransformerDecoderLayerBase)
KNOWN = ("fairseq's TransformerEncoderLayerBase and TransformerDecoderLayerBase, and every class with "
         "compile_region = True: each family's layers")


def is_compile_region(module):
    """Whether ``module`` is a layer ``--compile`` compiles (of a subclass of one too)."""
    return isinstance(module, FAIRSEQ_REGIONS) or bool(getattr(type(module), "compile_region", False))


def find_layers(model):
    """(name, module) of every encoder / decoder layer of ``model`` (outermost only), in module order."""
    found, inside = [], []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if is_compile_region(module):
            found.append((name, module))
            inside.append(name)
    return found


def describe(model):
    """'encoder: 6 x UMSTEncoderLayer, decoder: 6 x TransformerDecoderLayerBase' (compiled layers by part)."""
    counts = collections.Counter()
    for name, layer in find_layers(model):
        counts[(name.split(".")[0], type(layer).__name__)] += 1
    return ", ".join(f"{part}: {n} x {cls}" for (part, cls), n in counts.items())
