"""Patch: torch 2.11's AOTAutograd partition gets the size symbols its backward reads.

``torch.compile`` splits a layer's joint forward + backward graph into a forward and a backward graph
(``torch._functorch.partitioners``): the min-cut chooses what the forward saves, and the backward may recompute
cheap forward nodes (views, expands) from what was saved. A dynamic-shape graph carries its sizes as SymInt
inputs, one per tensor argument that has them, so one size symbol comes in several inputs. Under torch 2.11 the
min-cut can leave out one of those inputs that a recomputed node reads, and the split then stops with
``AssertionError: Node sum_30 was invalid, but is output``. Seen on a CPU under torch 2.11.0 for UMST's encoder
layer (fp32 with attention dropout, and bf16 autocast) and TranSFormer's ``SlowFastLayer`` (bf16 autocast): the
layer fell back to eager, with a warning. torch 2.13 splits the same graphs.

The patch wraps ``_extract_fwd_bwd_modules``: where it raises that error, the size inputs the backward reads and
nothing saved provides are added to what the forward saves (a SymInt: no activation memory) and the split is made
again. A split that succeeds is not touched. Installed on torch < 2.13 only; ``tests/test_compile.py`` plants
2.11's omission in torch 2.13's split (the size inputs left out of what the forward saves) and checks that
:func:`wrap` recovers it.
"""
import functools
import inspect

import torch

from umst_plugin import patches

TARGET = "torch._functorch.partitioners._extract_fwd_bwd_modules (torch < 2.13)"
SYMPTOM = ("torch.compile under torch 2.11: UMST's encoder layer and TranSFormer's SlowFastLayer fail AOTAutograd's "
           "partition ('Node ... was invalid, but is output') and fall back to eager")
REMOVE_WHEN = "the plugin requires torch >= 2.13 (whose partition splits these graphs)"
_ERROR = "was invalid, but is output"


def needed(partitioners, joint_module, saved_values, saved_sym_nodes, num_fwd_outputs):
    """The SymInt inputs of ``joint_module`` that its backward outputs read, directly or through forward nodes
    the backward recomputes, and that neither the saved values nor the tangents provide."""
    _, bwd_outputs, _, _ = partitioners._extract_fwd_bwd_outputs(joint_module, num_fwd_outputs=num_fwd_outputs)
    placeholders = joint_module.graph.find_nodes(op="placeholder")
    available = set(saved_values) | set(saved_sym_nodes) | {
        n for n in placeholders if partitioners._is_tangent(n) or partitioners._is_bwd_seed_offset(n)}
    missing, seen = [], set()
    stack = [o for o in bwd_outputs if isinstance(o, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node in seen or node in available:
            continue
        seen.add(node)
        if node.op == "placeholder":
            if partitioners.is_sym_node(node):
                missing.append(node)
            continue
        stack.extend(node.all_input_nodes)
    return sorted(missing, key=placeholders.index)


def applies(version=None):
    from torch.torch_version import TorchVersion

    return TorchVersion(version or torch.__version__) < (2, 13)


def install():
    if not applies():
        return
    from torch._functorch import partitioners

    # the parameters it is called with by name, not the whole signature (it changes between torch releases)
    names = list(inspect.signature(partitioners._extract_fwd_bwd_modules).parameters)
    if names[:3] != ["joint_module", "saved_values", "saved_sym_nodes"] or "num_fwd_outputs" not in names:
        raise patches.PatchError(f"partition_symbols: {TARGET} takes {names}; written for torch 2.11's "
                                 "(joint_module, saved_values, saved_sym_nodes, *, num_fwd_outputs, ...)")
    patches.wrap(partitioners, "_extract_fwd_bwd_modules", lambda original: wrap(original, partitioners), __name__)


def wrap(original, partitioners):
    """``original`` (torch's ``_extract_fwd_bwd_modules``) made again with the missing size inputs saved where it
    raised the error of a split that left them out (what :func:`install` puts in its place on torch < 2.13, through
    :func:`umst_plugin.patches.wrap`)."""
    @functools.wraps(original)
    def extract_fwd_bwd_modules(joint_module, saved_values, saved_sym_nodes, *args, **kwargs):
        try:
            return original(joint_module, saved_values, saved_sym_nodes, *args, **kwargs)
        except AssertionError as error:
            if _ERROR not in str(error):
                raise
            missing = needed(partitioners, joint_module, saved_values, saved_sym_nodes, kwargs["num_fwd_outputs"])
            if not missing:
                raise
            saved_sym_nodes.extend(missing)  # the caller's list: it counts the saved symbols after the split
            return original(joint_module, saved_values, saved_sym_nodes, *args, **kwargs)
    return extract_fwd_bwd_modules
