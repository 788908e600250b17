"""Autocast's parameter casts in one kernel (umst_plugin/amp_weights.py): the same loss and gradients, bit for
bit, as plain autocast, for every arch, in far fewer launches; and inside fairseq's Trainer."""
import inspect

import pytest
import torch
import torch.nn.functional as F

from benchmarks import bench_launches
from umst_dev import dev
from umst_dev.op_counts import KernelLaunches
from umst_plugin import amp_weights

TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=64,
            decoder_ffn_embed_dim=64, encoder_attention_heads=4, decoder_attention_heads=4, share_all_embeddings=True)
EXTRA = {"transformer": dict(encoder_normalize_before=True, decoder_normalize_before=True),
         "transformer_sf_base": dict(fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2),
         "msc_base": dict(encoder_blocks=2, encoder_layers_per_block=1)}
ARCHS = ["transformer", "umst_base", "umst_base_rpr", "transformer_sf_base", "msc_base", "msmsa_base", "prime_base",
         "prime_simple_base"]


def _step(model, sample, net_input, cache, seed=3):
    """Forward and backward under bf16 autocast (dropout on: the same seed, the same masks)."""
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with amp_weights.cast_weights_once(model, torch.bfloat16, cache):
            logits = model(**net_input)[0]
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), sample["target"].view(-1),
                           ignore_index=model.decoder.dictionary.pad())
    loss.backward()
    return loss.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ARCHS)
def test_same_loss_and_gradients_as_autocast_bit_for_bit(arch):
    model, task = dev.build_model(arch, dict(TINY, **EXTRA.get(arch, {})), vocab=60)
    model.train()
    sample = dev.random_sample(task, 4, 9, 7, seed=1)  # left-padded sources of different lengths
    net_input = dev.model_inputs(model, sample)
    reference_loss, reference_grads = _step(model, sample, net_input, None)
    cache = amp_weights.WeightCache(model)
    torch.manual_seed(3)
    model.zero_grad(set_to_none=True)
    with cache.record(torch.bfloat16):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(**net_input)[0]
    logits.float().sum().backward()
    cache.settle()
    assert cache.names, "no parameter found to cast at once"
    with KernelLaunches() as plain:
        _step(model, sample, net_input, None)
    with KernelLaunches() as cached:
        loss, grads = _step(model, sample, net_input, cache)
    assert torch.equal(loss, reference_loss)
    for name, g in reference_grads.items():
        assert (g is None) == (grads[name] is None), name
        if g is not None:
            assert torch.equal(grads[name], g), name
    # two casts per cached parameter (forward, gradient) become four launches in all
    assert cached.total <= plain.total - 2 * len({id(p) for n, p in model.named_parameters() if n in cache.names}) + 4


def test_what_is_left_to_autocast():
    """A tied embedding (also read by the lookup in fp32), a parameter handed to a custom autograd function,
    one cast in slices, an unused one and one read whole but under no_grad (cast, and given no gradient: through
    the concatenation it would get zeros where autocast leaves None) are not cast at once; the linear maps'
    weights and biases are, and so is a matrix read transposed (autocast casts the transposed view: every element
    once)."""
    class Halves(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w.t()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w.to(g.dtype), (g.t() @ x.to(g.dtype)).float()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 8)
            self.proj = torch.nn.Linear(8, 8)
            self.out = torch.nn.Linear(8, 10, bias=False)
            self.out.weight = self.embed.weight  # tied
            self.custom = torch.nn.Parameter(torch.randn(8, 8))
            self.sliced = torch.nn.Parameter(torch.randn(16, 8))
            self.unused = torch.nn.Linear(8, 8)
            self.transposed = torch.nn.Parameter(torch.randn(10, 8))
            self.no_gradient = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, tokens):
            x = self.embed(tokens)
            x = self.proj(x).reshape(-1, 8)
            x = Halves.apply(x, self.custom)
            x = F.linear(x, self.sliced[:8]) + F.linear(x, self.sliced[8:])
            with torch.no_grad():
                gate = torch.sigmoid(F.linear(x, self.no_gradient))
            x = x * gate
            return self.out(x) + torch.matmul(x, self.transposed.t())

    model = Model()
    cache = amp_weights.WeightCache(model)
    tokens = torch.randint(0, 10, (3, 5))
    apply_before = inspect.getattr_static(torch.autograd.Function, "apply")
    with cache.record(torch.bfloat16):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(tokens)
    out.float().sum().backward()
    cache.settle()
    assert sorted(cache.names) == ["proj.bias", "proj.weight", "transposed"]
    # the recorder wraps every custom function's apply (a Python classmethod up to torch 2.13, the C base's
    # descriptor from 2.14) only while it records, and puts back the very descriptor it found
    assert inspect.getattr_static(torch.autograd.Function, "apply") is apply_before
    x = torch.randn(4, 8, requires_grad=True)
    Halves.apply(x, model.custom).sum().backward()
    assert x.grad.shape == x.shape


def test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name():
    """What counts as autocast's cast of a parameter: a read of every element once, in the parameter's layout (the
    parameter, transposed, viewed with dimensions of size 1), by a cast of a float32 parameter to the autocast dtype.
    Not: the same elements in another layout, a slice, a same-sized window of another parameter's storage, a cast
    to float64, a sum in bf16, a float64 parameter cast. A parameter shared under two names (autocast casts it once
    for both uses) is cast once and viewed under each name. A LayerDrop list of p = 0 drops nothing."""
    from fairseq.modules.layer_drop import LayerDropModuleList

    w = torch.randn(4, 5)
    assert amp_weights._every_element_once(w, w) and amp_weights._every_element_once(w.t(), w)
    assert amp_weights._every_element_once(w.unsqueeze(0), w)
    assert not amp_weights._every_element_once(w.view(5, 4), w)
    assert not amp_weights._every_element_once(w[:2], w)
    flat = torch.randn(10)
    assert not amp_weights._every_element_once(flat[5:], flat[:5])

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Linear(8, 8)
            self.second = torch.nn.Linear(8, 8, bias=False)
            self.second.weight = self.first.weight  # shared
            self.widened = torch.nn.Parameter(torch.randn(8, 8))
            self.summed = torch.nn.Parameter(torch.randn(8))
            self.wide_dtype = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64))

        def forward(self, x):
            x = self.second(self.first(x))
            x = x + (x.double() @ self.widened.double()).float()
            x = x + self.summed.sum(dtype=torch.bfloat16)
            return x + F.linear(x.to(torch.bfloat16), self.wide_dtype.to(torch.bfloat16))

    model = Model()
    cache = amp_weights.WeightCache(model)
    with cache.record(torch.bfloat16):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(3, 8))
    out.float().sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    cache.settle()
    assert sorted(cache.names) == ["first.bias", "first.weight", "second.weight"]
    assert [id(p) for p in cache.parameters()] == [id(model.first.weight), id(model.first.bias)]
    views = cache.cast(torch.bfloat16)
    assert views["first.weight"] is views["second.weight"] and views["first.weight"].dtype == torch.bfloat16
    assert torch.equal(views["first.weight"], model.first.weight.to(torch.bfloat16))
    assert not amp_weights.layerdrop(torch.nn.Sequential(LayerDropModuleList(0.0, [torch.nn.Linear(2, 2)])))
    assert amp_weights.layerdrop(torch.nn.Sequential(LayerDropModuleList(0.1, [torch.nn.Linear(2, 2)])))


def test_fairseq_trainer_updates_are_the_same_with_and_without():
    """Four bf16 --amp updates in fairseq's Trainer (the plugin's amp_train_step): the weights with the cache equal
    those with autocast's own casts (--no-amp-weight-cache), bit for bit, and the second update launches fewer
    kernels."""
    states, launches = {}, {}
    for on in (True, False):
        trainer, sample = bench_launches.build_trainer(
            "transformer", dict(bench_launches.PRENORM, no_amp_weight_cache=not on), "bf16", plugin=True, quick=True)
        trainer.train_step([sample])
        with KernelLaunches() as counter:
            trainer.train_step([sample])
        launches[on] = counter.total
        for _ in range(2):
            trainer.train_step([sample])
        states[on] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        cache = trainer.model.__dict__.get("_umst_amp_weight_cache")
        assert (cache is not None and bool(cache.names)) == on
    for key, value in states[False].items():
        assert torch.equal(states[True][key], value), key
    assert launches[True] < launches[False] - 50


def test_a_parameter_unused_after_the_first_update_is_left_alone():
    """A branch used in the first update (when the cache records) and switched off in the second: its parameters'
    gradients stay None, so the optimizer skips them, as with autocast's own casts (the concatenation's backward
    would give them zeros, and Adam would move them by momentum and weight decay). Weights bit for bit those of
    --no-amp-weight-cache."""
    states = {}
    for on in (True, False):
        trainer, sample = bench_launches.build_trainer(
            "transformer", dict(bench_launches.PRENORM, no_amp_weight_cache=not on, weight_decay=0.01), "bf16",
            plugin=True, quick=True)
        trainer.train_step([sample])
        branch = trainer.model.decoder.layers[1]
        before = {n: p.detach().clone() for n, p in branch.named_parameters()}
        branch.forward = lambda x, *args, **kwargs: (x, None, None)  # the layer switched off: its input passes
        trainer.train_step([sample])
        cache = trainer.model.__dict__.get("_umst_amp_weight_cache")
        assert (cache is not None and any(n.startswith("decoder.layers.1.") for n in cache.names)) == on
        for n, p in branch.named_parameters():
            assert p.grad is None, n
            assert torch.equal(p.detach(), before[n]), n
        states[on] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    for key, value in states[False].items():
        assert torch.equal(states[True][key], value), key


def test_compiled_layers_read_the_weights_cast_once():
    """fairseq-train --compile --amp: the cache is on under --compile too. It was off: every compiled layer cast
    its weights inside its own graph, one kernel per weight and one per gradient on a GPU (docs/compile.md), where
    the benchmarks, which compile after an eager update, had the cache on. The layers are compiled before the
    first update, as fairseq-train does; dynamo's real tracing with a pass-through backend (no inductor) records
    each compiled graph's inputs. The recording update runs the layers eager (compiled code refuses the recorder's
    dispatch mode; nothing falls back); every later graph takes the weights already in bf16, one cast of all of
    them; the weights after 4 updates equal those of --no-amp-weight-cache bit for bit."""
    from umst_dev import compiled_layers
    from umst_plugin import compilation

    def record_inputs(gm, example_inputs):  # each compiled graph's floating inputs: (dtype, shape)
        graphs.append({(t.dtype, tuple(t.shape)) for t in example_inputs
                       if isinstance(t, torch.Tensor) and t.is_floating_point()})
        return gm.forward

    states, cached_shapes = {}, None
    for on in (True, False):
        graphs = []
        trainer, sample = bench_launches.build_trainer(
            "transformer", dict(bench_launches.PRENORM, no_amp_weight_cache=not on), "bf16", plugin=True, quick=True)
        compilation.compile_layers(trainer.model, backend=record_inputs, check=False)
        trainer.train_step([sample])
        assert not on or graphs == [], "the recording update compiled something"
        for _ in range(3):
            trainer.train_step([sample])
        assert compiled_layers.eager_fallbacks(trainer.model) == []
        cache = trainer.model.__dict__.get("_umst_amp_weight_cache")
        assert (cache is not None and bool(cache.names)) == on
        if on:  # the shapes of the matrices the cache casts (no activation or mask here has one; layer norms'
            # fp32 vectors share the biases' shapes)
            cached_shapes = {tuple(p.shape) for n, p in trainer.model.named_parameters()
                             if n in cache.names and p.dim() == 2}
        weights = {(dtype, shape) for g in graphs for dtype, shape in g if shape in cached_shapes}
        assert {dtype for dtype, _ in weights} == ({torch.bfloat16} if on else {torch.float32}), weights
        states[on] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        torch._dynamo.reset()
    for key, value in states[False].items():
        assert torch.equal(states[True][key], value), key
