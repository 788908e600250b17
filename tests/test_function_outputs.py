"""The plugin's custom autograd functions return tensors of their own, never one that an op inside the forward
returned as its own input (an in-place op, or ``.to`` the dtype the tensor already has).

torch 2.11's dynamo traces an autograd function's forward with its intermediates as extra outputs; where the
returned tensor is such an op's input as well, both outputs are one tensor, and autograd then routes the
output's gradient to the extra output's slot: under ``--compile`` the function's gradients were silently wrong
(pytorch/pytorch#180642, a regression of 2.11 fixed in 2.12). Prime's convolution returned a ``.to(fp32)`` of a
tensor already fp32, so on the H200's torch 2.11 every compiled Prime layer trained on wrong gradients; UMST's
segment sum returned an ``index_add_`` on zeros. ``amp_functions.distinct_output`` gives such a result a view of
its own. torch 2.13 (this suite's) traces either correctly, so the cause itself is checked here: every op a
forward runs is watched (a torch function mode), and a forward whose output is an op's own input fails.

Every function is reached: through the tiny models of ``tests/test_compile.py`` (training, dropout on, fp32 and
bf16 autocast: whether ``.to`` converts depends on the dtype) and, for the ones no compiled layer calls, directly.
"""
import importlib
import pkgutil

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import umst_plugin.models
import umst_plugin.modules
from umst_dev import dev

from test_compile import ARCHS, DROPOUT, TINY, _batches, _loss


def _plugin_functions():
    for package in (umst_plugin.modules, umst_plugin.models):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)
    return sorted({c for c in subclasses(torch.autograd.Function) if c.__module__.startswith("umst_plugin.")},
                  key=lambda c: c.__name__)


class _OwnInputReturns(TorchFunctionMode):
    """Records the tensors that an op returned as one of its own tensor arguments."""

    def __init__(self):
        super().__init__()
        self.tensors = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and any(out is a for a in tree_leaves((args, kwargs))):
            self.tensors.append((out, getattr(func, "__name__", str(func))))
        return out


@pytest.fixture
def watched_functions(monkeypatch):
    """Every plugin autograd function's forward, watched: {name: [problems]} for each function that ran."""
    seen = {}
    for cls in _plugin_functions():
        original = cls.forward

        def forward(ctx, *args, _original=original, _name=cls.__name__, **kwargs):
            with _OwnInputReturns() as mode:
                out = _original(ctx, *args, **kwargs)
            problems = seen.setdefault(_name, [])
            for i, o in enumerate(out if isinstance(out, tuple) else (out,)):
                for tensor, op in mode.tensors:
                    problem = f"output {i} is what {op} returned as its own input"
                    if o is tensor and problem not in problems:
                        problems.append(problem)
            return out
        monkeypatch.setattr(cls, "forward", staticmethod(forward))
    return seen


MODELS = [p.values for p in ARCHS] + [("umst_base_rpr", {}), ("umst_base", dict(phrase_gcn_form="authors"))]


def test_every_autograd_function_returns_a_tensor_of_its_own(watched_functions):
    from umst_plugin.modules.msc.grad_norms import PerTokenLossTerm
    from umst_plugin.modules.prime.dynamic_conv import reference_dynamic_convolution
    from umst_plugin.modules.umst.graphs import segment_sum_keeping_index

    for arch, overrides in MODELS:
        model, task = dev.build_model(arch, {**TINY, **DROPOUT, **overrides})
        model.train()
        sample = next(_batches(task, 1))
        for bf16 in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = _loss(model, sample)[1]
            loss.backward()
    # the functions no compiled layer calls: the reference convolution, the word pooling of UMST's reference
    # path, MSC's per-token loss term
    x = torch.randn(5, 2, 4, requires_grad=True)
    reference_dynamic_convolution(x, torch.randn(5, 2, 2, 3, requires_grad=True), 1).sum().backward()
    segment_sum_keeping_index(x.view(10, 4) * 2, torch.tensor([0, 1, 2] * 3 + [0]), 3).sum().backward()
    PerTokenLossTerm.apply(torch.randn(3, 5, requires_grad=True), torch.zeros((), requires_grad=True), None)

    assert sorted(watched_functions) == [c.__name__ for c in _plugin_functions()], "functions not reached"
    problems = {name: p for name, p in watched_functions.items() if p}
    assert problems == {}, problems
