"""Autocast's parameter casts in one kernel: every parameter autocast would cast, cast at once.

Under ``--amp`` autocast casts each fp32 parameter that a matmul reads (weights and biases of every linear map)
to bf16/fp16: one cast kernel per parameter in the forward pass and one for its gradient in backward -- about
400 launches an update for a base transformer, a third of its forward and backward, on a GPU that waits for
launches (docs/performance.md). This is much of why bf16 ``--amp`` trained slower than fp32 there.

:class:`WeightCache` finds, in the first update (run the plain way), the parameters whose every read is autocast's
cast of the whole parameter (as it lies, transposed or viewed with dimensions of size 1) to the autocast dtype, once
per update (``_CastRecorder``: a dispatch mode over the forward pass). From the second update on,
:func:`cast_weights_once` does those casts before the forward pass: it concatenates the parameters (one kernel),
casts the result (one), and lets the model read views of it for the pass (``torch.nn.utils.stateless``
reparametrisation: the parameters themselves, their names, the optimizer and the checkpoints are untouched); in
backward the views' gradients meet in one concatenation and one cast back. Four launches for all of them, and the
same values: each view holds the same round-to-nearest cast autocast makes, every op reads the same operands, and
each parameter's gradient is its autocast-dtype gradient cast to fp32, as the backward of autocast's own cast gives
(``tests/test_amp_weights.py`` checks the loss and every gradient bit for bit against plain autocast, for every
arch).

What is left out, and why: a parameter cast inside a custom autograd function (its backward returns the
gradient in whatever dtype it computed it, which a low-precision view would round), one also read by an op
other than the cast (an embedding matrix tied to the
output projection: the lookup reads it in fp32), cast in pieces (a slice of it cast: its gradient would be
summed in the low dtype), cast twice (a custom backward that recomputes from the parameter), or given no
gradient in the first update (through the concatenation it would get a zero gradient where autocast leaves it
None and the optimizer skips it). With LayerDrop a layer's parameters go unused in some updates: the cache is
then off.

A parameter cast in the first update can go unused in a later one (a branch the data switches off). Its view
then gets a zero gradient through the concatenation where autocast would leave its gradient None, and Adam
would move it (momentum, weight decay) where fairseq's adam skips it. So each view carries a gradient hook that
records that it was used (:class:`Usage`), and after the backward pass a parameter whose gradient was None
before it and whose view went unused gets None back (:meth:`WeightCache.drop_unused_gradients`): no kernel,
no host sync.
"""
import functools
import logging

import torch
from torch.utils._python_dispatch import TorchDispatchMode

logger = logging.getLogger(__name__)

_TO_COPY = torch.ops.aten._to_copy.default


def _every_element_once(view, param):
    """Whether ``view`` reads each element of ``param`` exactly once, in the parameter's layout: the parameter
    itself, its dimensions permuted (a transposed weight, ``w.t()``) or dimensions of size 1 added or taken away
    (a bias viewed for broadcasting). Autocast's cast of such a view is the parameter's cast, viewed alike, and so
    is its gradient's cast back: the cast-once view, viewed alike, gives the same values."""
    if view.storage_offset() != param.storage_offset() or view.numel() != param.numel():
        return False
    dims = lambda t: sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size != 1)  # noqa: E731
    return dims(view) == dims(param)


class _CastRecorder(TorchDispatchMode):
    """Every non-view op that reads a parameter's storage: whether it is a cast of the whole parameter to
    ``dtype``."""

    def __init__(self, params, dtype):
        super().__init__()
        self.dtype = dtype
        self.by_storage = {p.untyped_storage().data_ptr(): p for p in params}
        self.reads = {ptr: [] for ptr in self.by_storage}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not func.is_view:
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, torch.Tensor) and a.device.type != "meta":
                    ptr = a.untyped_storage().data_ptr()
                    param = self.by_storage.get(ptr)
                    if param is not None:
                        self.reads[ptr].append(func is _TO_COPY and _every_element_once(a, param)
                                               and kwargs.get("dtype") == self.dtype)
        return func(*args, **kwargs)

    def cast_once(self):
        """Storage pointers of the parameters read only by one whole cast to ``dtype`` and handed to no custom
        autograd function."""
        return {ptr for ptr, reads in self.reads.items() if reads == [True]} - self.function_inputs

    def __enter__(self):
        # A custom autograd function's backward returns its inputs' gradients in whatever dtype it computed them
        # (an fp32 sum for a bias, say); given a low-precision view, the engine would round that gradient to it.
        # So the parameters handed to one are left to autocast.
        from torch.autograd.function import Function

        self.function_inputs = set()
        # Function's own apply: a Python classmethod up to torch 2.13, the C base's classmethod_descriptor from
        # 2.14 (which has no ``__func__``); either, bound to the calling subclass by ``__get__``, is the apply that
        # subclass would have run
        self._apply = Function.__dict__["apply"]
        recorder, original = self, self._apply

        def apply(cls, *args, **kwargs):
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, torch.Tensor) and a.device.type != "meta":
                    recorder.function_inputs.add(a.untyped_storage().data_ptr())
            return original.__get__(None, cls)(*args, **kwargs)
        Function.apply = classmethod(apply)
        return super().__enter__()

    def __exit__(self, *exc):
        from torch.autograd.function import Function

        Function.apply = self._apply
        return super().__exit__(*exc)


class WeightCache:
    """Per model: which parameters to cast at once, found in its first update (:meth:`record`)."""

    def __init__(self, model):
        self.model = model
        self.names = None  # None until the first update has been recorded

    def record(self, dtype):
        """Context manager around the first update's forward pass (run the plain autocast way); call
        :meth:`settle` after its backward. Only the forward pass is watched: what a backward pass recomputes
        (checkpointed sub-layers) reads the parameters outside the cast context, autocast's way, with the same
        values, and it runs on another thread on a GPU, where a dispatch mode would not see it anyway."""
        params = [p for p in self.model.parameters() if p.dtype == torch.float32 and p.requires_grad]
        recorder = _CastRecorder(params, dtype)
        cache = self

        class _Recording:
            def __enter__(self):
                recorder.__enter__()

            def __exit__(self, *exc):
                recorder.__exit__(*exc)
                cache._candidates = recorder.cast_once()
        return _Recording()

    def settle(self):
        """After the first update's backward: the recorded parameters that received a gradient."""
        storages = getattr(self, "_candidates", None)
        if storages is None:
            return
        used = {p.untyped_storage().data_ptr() for p in self.model.parameters() if p.grad is not None}
        self.names = [n for n, p in self.model.named_parameters(remove_duplicate=False)
                      if p.untyped_storage().data_ptr() in storages & used]
        del self._candidates
        logger.info("autocast casts: %d parameters cast in one kernel per update, not one each "
                    "(--no-amp-weight-cache: autocast's own casts)", len(self.names))

    def parameters(self):
        """The cached parameters, each once."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        return list({id(params[n]): params[n] for n in self.names or ()}.values())

    def drop_unused_gradients(self, usage, none_before):
        """After the backward pass of a forward that read :meth:`cast`'s views with ``usage``: the parameters that
        had no gradient before it (``none_before``: ids) and whose view went unused get None again, as under plain
        autocast (the concatenation's backward gave them zeros)."""
        for p in self.parameters():
            if id(p) in none_before and id(p) not in usage.used:
                p.grad = None

    def cast(self, dtype, usage=None):
        """{name: view of the one cast tensor} for the model's forward pass; with ``usage`` (a :class:`Usage`),
        each view records whether a gradient reached it."""
        if not self.names:
            return {}
        params = dict(self.model.named_parameters(remove_duplicate=False))
        weights = [params[n] for n in self.names]
        # the same Parameter under several names (shared between layers) is cast once and viewed under each
        unique, index = [], {}
        for w in weights:
            if id(w) not in index:
                index[id(w)] = len(unique)
                unique.append(w)
        flat = torch.cat([w.reshape(-1) for w in unique]).to(dtype)
        pieces = flat.split([w.numel() for w in unique])
        views = [pieces[i].view(w.shape) for i, w in enumerate(unique)]
        if usage is not None and torch.is_grad_enabled():
            for view, w in zip(views, unique):
                view.register_hook(functools.partial(usage.mark, id(w)))
        return {n: views[index[id(w)]] for n, w in zip(self.names, weights)}


class Usage:
    """Which cached parameters' views a backward pass reached (``used``: parameter ids)."""

    def __init__(self):
        self.used = set()

    def mark(self, param_id, grad):
        self.used.add(param_id)


def cast_weights_once(model, dtype, cache, usage=None):
    """A context manager: inside, the parameters ``cache`` names are ``dtype`` views of one cast (``usage``: see
    :meth:`WeightCache.cast`)."""
    import contextlib

    from torch.nn.utils import stateless

    mapping = cache.cast(dtype, usage) if cache is not None and cache.names else {}
    if not mapping:
        return contextlib.nullcontext()
    return stateless._reparametrize_module(model, mapping)


def layerdrop(model):
    """Whether the model drops layers at random (fairseq's LayerDrop): then weights go unused in some updates."""
    from fairseq.modules.layer_drop import LayerDropModuleList

    return any(isinstance(m, LayerDropModuleList) and m.p > 0 for m in model.modules())
