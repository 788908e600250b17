"""Patch: a compiled backward takes the strides of what its forward saved as expressions of the sizes, not as the
numbers of the batch that compiled it.

Seen in the speed table on an NVIDIA H200 (torch 2.11.0+cu130; docs/results/gpu-speed-nvidia-h200-af33e1d): MSC's
compiled encoder layer failed in its backward, in inductor's check of its inputs, ``AssertionError: expected size
64==64, stride 425984==565248 at dim=2`` (and ``stride 671744==565248`` in the second call), and that variant of the
layer ran eager from then on. 565248 is 1024 x 552: a stride that is 1024 x the batch's sentences, frozen at the
552 sentences of the batch whose forward compiled the layer.

The cause is torch's (pytorch/pytorch#191885, #194420). Inductor may give an activation the forward saves for
backward another layout than the traced graph's (on that GPU, for MSC's layer; on a CPU with inductor's stride
padding for dynamic shapes, as the tests plant it). AOTAutograd then gives the backward graph's input that layout:
``set_tracing_context_output_strides`` reads the forward's output strides, which inductor writes as expressions of
the size symbols, by evaluating them at the first batch's sizes (``evaluate_symexpr``), and
``_aot_stage2b_bw_compile`` compares them with the traced input's strides at those sizes and restrides the input
with the numbers. The backward's generated code then asserts those numbers, so every batch of another size fails.
A layout that agrees with the traced one at the first batch's sizes and not at others (a padded stride that equals
the unpadded one when the size happens to be a multiple of the alignment) is not restrided at all, and fails later.

The patch, as #191885 does:

* ``set_tracing_context_output_strides`` keeps each saved activation's strides symbolic
  (``ShapeEnv.deserialize_symexpr``; a stride it cannot rebuild, as that PR, is evaluated as before);
* ``_aot_stage2b_bw_compile`` restrides a backward input unless its traced stride is statically the saved one
  (``statically_known_true``), where it compared the two at the first batch's sizes: one line of torch's function,
  replaced in its source (:data:`LINE`, :data:`FIXED_LINE`), the rest of the function torch's own.

The backward's code then asserts the strides the forward produces, for every size. A stride expression that is not
the traced one may add a guard on the sizes (a padded stride equal to the unpadded one or not): one more compile of
the layer, not one per batch. Installed by ``--compile`` (``compilation.dispatch.configure_dynamo``) and by
:func:`install` once inductor is loaded; nothing where torch's own code no longer has the line (a torch with the
fix). On a CPU the same failure was met by Prime's convolution with its backward windows as they were before
issue 63's fix (its compiled backward failed at the first short batch of another batch size).
``tests/test_saved_activation_strides.py`` runs that layer, and plants a divergent layout in a small function
(inductor's stride padding for dynamic shapes, on a CPU): torch's own code fails, the patched code compiles every
batch and equals eager.
"""
import __future__
import inspect
import sys
import textwrap

import torch

from umst_plugin.patches import PatchError, installed, wrap

TORCH_VERSIONS = "torch 2.11 to 2.14"  # those whose code the patch was written for and tested under
TARGET = ("torch._inductor.output_code.set_tracing_context_output_strides and one line of "
          f"torch._functorch._aot_autograd.graph_compile._aot_stage2b_bw_compile ({TORCH_VERSIONS})")
SYMPTOM = ("MSC's compiled encoder layer failed in backward on an H200 ('AssertionError: expected size 64==64, "
           "stride 425984==565248 at dim=2': a stride frozen at the first batch's size) and ran eager from then on")
REMOVE_WHEN = ("the plugin requires a torch with pytorch/pytorch#191885 (saved-activation strides kept symbolic), "
               "whose _aot_stage2b_bw_compile no longer has the line this patch replaces")

NAME = __name__.rsplit(".", 1)[-1]
LINE = "if guard_or_true(ph_arg.stride()[k] != int(real_stride[k])):"
FIXED_LINE = "if not _umst_statically_known_true(ph_arg.stride()[k] == real_stride[k]):"


def applies():
    """Whether torch's backward compile still compares a saved activation's strides at the first batch's sizes."""
    from torch._functorch._aot_autograd import graph_compile

    return LINE in inspect.getsource(_original(graph_compile._aot_stage2b_bw_compile))


def _original(function):
    while installed(function, NAME):
        function = function.__wrapped__
    return function


def install(load=False):
    """Install both parts (idempotent). Without ``load`` only where inductor is loaded already (``import
    umst_plugin`` must not load it); ``--compile`` calls it with ``load=True``."""
    if not load and "torch._inductor.output_code" not in sys.modules:
        return
    from torch._functorch._aot_autograd import graph_compile
    from torch._inductor import output_code, utils

    if installed(graph_compile._aot_stage2b_bw_compile, NAME) or not applies():
        return
    found = list(inspect.signature(utils.set_tracing_context_output_strides).parameters)
    if found != ["example_inputs", "compiled_graph"]:
        raise PatchError(f"{NAME}: torch {torch.__version__}'s set_tracing_context_output_strides takes {found}; the "
                         f"patch was written for {TORCH_VERSIONS}'s (example_inputs, compiled_graph). Run without "
                         "--compile, or update the patch")
    wrap(graph_compile, "_aot_stage2b_bw_compile", _with_symbolic_comparison, NAME)  # (first: it may raise)
    for owner in (utils, output_code):  # (output_code imported it by name, and calls it there)
        wrap(owner, "set_tracing_context_output_strides", lambda _: set_tracing_context_output_strides, NAME)


def set_tracing_context_output_strides(example_inputs, compiled_graph):
    """torch's function (it hands the forward's output strides to AOTAutograd through the tracing context), each
    stride kept an expression of the size symbols where torch evaluated it at the current sizes."""
    from torch._inductor.utils import shape_env_from_inputs

    context = torch._guards.TracingContext.try_get()
    if context is None or context.output_strides is None:
        return
    assert len(context.output_strides) == 0
    shape_env = shape_env_from_inputs(example_inputs)
    assert compiled_graph.output_strides is not None

    def stride(expr):
        if shape_env is None:
            return int(expr)
        try:
            return shape_env.deserialize_symexpr(expr)  # a number where the stride is one, else a SymInt
        except TypeError:  # (a symbol whose value is itself symbolic: #191885 keeps torch's evaluation for it)
            return shape_env.evaluate_symexpr(expr)

    for exprs in compiled_graph.output_strides:
        context.output_strides.append(None if exprs is None else tuple(stride(e) for e in exprs))


def _with_symbolic_comparison(function):
    """torch's ``_aot_stage2b_bw_compile`` (``function``) with :data:`LINE` replaced by :data:`FIXED_LINE`, compiled
    from its own source in its own module's namespace."""
    from torch._functorch._aot_autograd import graph_compile
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    source = textwrap.dedent(inspect.getsource(function))
    if source.count(LINE) != 1 or not source.startswith("def _aot_stage2b_bw_compile("):
        raise PatchError(f"{NAME}: torch {torch.__version__}'s _aot_stage2b_bw_compile is not the function the patch "
                         f"was written for (one line '{LINE}'). Run without --compile, or update the patch")
    graph_compile._umst_statically_known_true = statically_known_true
    namespace = {}
    first_line = inspect.getsourcelines(function)[1]  # (tracebacks then name torch's file at torch's lines)
    fixed = "\n" * (first_line - 1) + source.replace(LINE, FIXED_LINE)
    # annotations left unevaluated, as under a module's ``from __future__ import annotations``: some name types
    # imported for type checkers only
    code = compile(fixed, inspect.getsourcefile(function), "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)
    exec(code, graph_compile.__dict__, namespace)  # noqa: S102 -- torch's own source, one line replaced
    return namespace["_aot_stage2b_bw_compile"]
