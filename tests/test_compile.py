"""``--compile`` (regional torch.compile of the encoder and decoder layers) and ``--tf32``
(umst_plugin/compilation/).

On the CPU, with inductor (it compiles C++ here), for every family and fairseq's transformer, at tiny widths with
two encoder layers and one decoder layer, one compiled model per arch for all of:

* the compiled layers give the eager model's outputs and parameter gradients: float32, training mode with
  dropout 0.1 (attention, activation, residual; Prime's DropConnect and input dropout too), one padded batch, the
  loss of all target positions backpropagated (tolerances in ``ATOL``/``RTOL``: inductor fuses and reorders
  float32 reductions). In training, compiled code draws its dropout masks from its own generator; here inductor's
  ``fallback_random`` has it draw them from torch's, in eager order, so both see the same masks (recomputation in
  backward included);
* the two encoder layers of one class share one compiled graph (dynamo's cache entries on the class's
  ``forward`` code object), where the two layers are built alike;
* 20 batches of different shapes (2-7 sentences, 2-18 tokens, padded on both sides) compile nothing after the
  first 3 (dynamo's graph count and each layer class's cache entries), and one program per layer class in all
  (TranSFormer's encoder class two: its two layers are built differently);
* no graph break inside a layer (``fullgraph=True`` would stop the forward; dynamo's ``graph_break`` counter
  stays empty as well).

Then: incremental decoding runs the eager forward of a compiled decoder layer, the flags exist in every CLI and
reach fairseq's Trainer and the inference CLIs' models, a missing C++ compiler stops at start-up with the cause,
and ``--tf32`` warns on a CPU and switches TF32 on for an Ampere GPU (its capability faked). fairseq-train,
-validate and -generate ``--compile`` on the toy corpus (compile log, losses of the eager run, the compiled code
reused on resume), and fairseq's Trainer retrying an update whose compiled backward failed (the real failure):
tests/test_compile_stream.py.

The eager references are never-compiled copies of the models, whose layers get their inputs as contiguous copies
made here (``_take_plain_inputs``), not by ``dispatch._plain`` and its reuse of a copy (tested on its own).
"""
import copy
import logging
import os
import random
import re
import types

import pytest
import torch
import torch.nn.functional as F

import e2e
import umst_plugin  # noqa: F401  (installs the patches)
from umst_dev import compiled_layers, dev
from umst_plugin import compilation
from umst_plugin.compilation import cache, dispatch, fallback, probe, retry, telemetry
from umst_plugin.compilation import loss as compiled_loss
from umst_plugin.compilation.state import STATE

TINY = dict(encoder_layers=2, decoder_layers=1, encoder_embed_dim=24, decoder_embed_dim=24, encoder_ffn_embed_dim=48,
            decoder_ffn_embed_dim=48, encoder_attention_heads=2, decoder_attention_heads=2)
MAX_COMPILED_LAUNCHES = 0.8  # compiled / eager launches of a forward + backward of the tiny models (measured 0.52-0.71)
DROPOUT = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
TRANSFORMER = dict(encoder_normalize_before=True, decoder_normalize_before=True)
# dropout masks from torch's generator in the compiled code too (in the order eager code draws them), so the
# compiled layers can be compared with eager ones in training mode with dropout, recomputation included; and the
# profiler sees inductor's C++ kernels, so the launches of the compiled layers can be counted
COMPARED = {"fallback_random": True, "cpp.enable_kernel_profile": True}
FAST = dict(fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2)
ARCHS = [
    pytest.param("transformer", TRANSFORMER, id="transformer"),
    pytest.param("umst_base", {}, id="umst_base"),
    pytest.param("transformer_sf_base", FAST, id="transformer_sf_base"),
    pytest.param("msc_base", dict(encoder_blocks=1, encoder_layers_per_block=2), id="msc_base"),
    pytest.param("msmsa_base", dict(msmsa_scales="1,3,N/4,N/2", msmsa_min_block=2), id="msmsa_base"),
    pytest.param("prime_base", dict(prime_kernels="3,7", prime_conv_weight_dropout=0.1, input_dropout=0.1),
                 id="prime_base"),
    pytest.param("prime_simple_base", {}, id="prime_simple_base"),
]
# Whose two encoder layers differ in structure (so they compile separately): TranSFormer's interaction layers
# (layer 1 has no cross-granularity fusion, layer 2 has) -- the same code, different submodules.
DISTINCT_ENCODER_LAYERS = {"transformer_sf_base"}
ATOL, RTOL = 2e-5, 1e-4
WARMUP, BATCHES = 3, 20


def _batch(task, rng, seed, longest=18):
    """2-7 sentences of 2-``longest`` tokens, padded on both sides."""
    bsz = rng.randint(2, 7)
    src = [rng.randint(2, longest - 1) for _ in range(bsz)]
    tgt = [rng.randint(2, longest - 2) for _ in range(bsz)]
    src[0], tgt[0] = src[1] + 1, tgt[1] + 2
    return dev.collate(dev.dataset_of_lengths(task, src, tgt, seed=seed), range(bsz))


def _batches(task, n, seed=0):
    """The warm-up meets long and short batches (Prime's convolution once compiled one program for sources shorter
    than its widest kernel and one for the others: modules/prime/dynamic_conv.py, ``_laid_out``), then random
    shapes."""
    rng = random.Random(seed)
    for i in range(n):
        yield _batch(task, rng, seed=i, longest=6 if i == 1 else 18)


def _loss(model, sample):
    logits = model(**dev.model_inputs(model, sample))[0]
    pad = model.decoder.dictionary.pad()
    return logits, F.cross_entropy(logits.float().view(-1, logits.size(-1)), sample["target"].view(-1),
                                   ignore_index=pad, reduction="sum")


@pytest.fixture
def fresh_fallbacks(monkeypatch):
    """This test's fallbacks only: other tests of the process compile the same layer classes."""
    monkeypatch.setattr(STATE, "eager_variants", {})
    monkeypatch.setattr(STATE, "fallback_tracebacks", {})


def _assert_no_fallback(model):
    """No layer variant of ``model`` fell back to eager; the message: each fallback's line, then its traceback."""
    assert compiled_layers.eager_fallbacks(model) == [], "\n".join(compiled_layers.eager_fallbacks(model)
                                                             + compiled_layers.fallback_tracebacks(model))


def _seeded_backward(model, sample, seed=1):
    """The logits and loss of ``sample`` with torch's generator at ``seed`` (the same dropout masks for a compiled
    model and its eager copy), the loss backpropagated."""
    torch.manual_seed(seed)
    logits, loss = _loss(model, sample)
    loss.backward()
    return logits, loss


def _own_plain_copy(t):
    """``t`` as a contiguous tensor of its own: a fresh copy of a view or a strided tensor, every time (what
    ``dispatch._plain`` hands a compiled layer, computed here without it or its reuse of a copy)."""
    if t._base is None and t.is_contiguous():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _plain_inputs_forward(self, *args, **kwargs):
    args = [_own_plain_copy(a) if isinstance(a, torch.Tensor) else a for a in args]
    kwargs = {k: _own_plain_copy(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return type(self).forward(self, *args, **kwargs)


def _take_plain_inputs(model):
    """The eager layers of MODEL (never compiled) get their tensor arguments as the compiled ones do, plain and
    contiguous: a dropout mask drawn for a transposed view then falls on the same elements. The copies are this
    file's own (``_own_plain_copy``), so a fault in the compiled path's ``_plain`` shows as a difference."""
    inside = []
    for name, layer in model.named_modules():
        if compilation.is_compile_region(layer) and not any(name.startswith(prefix + ".") for prefix in inside):
            inside.append(name)
            layer.forward = types.MethodType(_plain_inputs_forward, layer)


def test_plain_copies_a_view_once_while_that_tensor_is_unchanged():
    """``dispatch._plain``: a plain tensor as it is; a view (contiguous or not) or a strided tensor as a contiguous copy of its own,
    equal to it; the copy reused for the same tensor while its version is unchanged, never for another tensor (of
    the same version) or after an in-place change; a tensor that needs a gradient copied every time."""
    plain = torch.ones(3, 4)
    assert dispatch._plain(plain) is plain
    base = torch.arange(12.0).view(3, 4)
    view = base.t()
    first = dispatch._plain(view)
    assert first._base is None and first.is_contiguous() and torch.equal(first, view)
    assert dispatch._plain(view) is first  # the same tensor, unchanged: copied once
    other = torch.zeros(4, 3).t().t().t()  # another view, also of version 0
    assert other._version == view._version
    assert torch.equal(dispatch._plain(other), other)
    again = dispatch._plain(view)
    assert again is not first and torch.equal(again, view)
    base.mul_(2)  # in place: the view's version moves with its base's
    changed = dispatch._plain(view)
    assert changed is not again and torch.equal(changed, view)
    for unplain in (torch.arange(12.0)[2:], torch.empty_strided((3, 4), (1, 3))):  # a contiguous view; strided
        copied = dispatch._plain(unplain)
        assert copied is not unplain and copied._base is None and copied.is_contiguous()
    grad = torch.randn(4, 3, requires_grad=True).t()
    assert dispatch._plain(grad) is not dispatch._plain(grad) and torch.equal(dispatch._plain(grad), grad)


def _profiled_launches(model, sample):
    """Kernel launches of one forward + backward (op_counts.profiled_launches) and how many of them are kernels
    inductor generated."""
    from torch.profiler import ProfilerActivity, profile

    from umst_dev.op_counts import profiled_launches

    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _loss(model, sample)[1].backward()
    by_phase, by_op = profiled_launches(prof.events())
    return sum(by_phase.values()), by_op["generated"]


def _graph_state(forwards):
    return compilation.compiled_graphs(), [compiled_layers.cache_entries(f) for f in forwards]


@pytest.mark.slow  # inductor compiles two to four graphs per arch: 10 s to 2.5 min each on 2 cores
@pytest.mark.parametrize("arch,overrides", ARCHS)
def test_compiled_layers_match_eager_share_graphs_and_do_not_recompile(arch, overrides):
    import torch._inductor.config as inductor_config

    with inductor_config.patch(COMPARED):
        _check_compiled_layers(arch, overrides)


def _check_compiled_layers(arch, overrides):
    from torch._dynamo.utils import counters

    model, task = dev.build_model(arch, {**TINY, **DROPOUT, **overrides})
    model.train()
    eager = copy.deepcopy(model)
    _take_plain_inputs(eager)
    names = compilation.compile_layers(model)
    # two encoder layers, one decoder layer (and TranSFormer's encoder input region, SlowFastInput)
    assert len(names) == 3 + arch.startswith("transformer_sf"), names
    forwards = compiled_layers.compiled_forwards(model)
    entries_before = [compiled_layers.cache_entries(f) for f in forwards]  # (a class's code is shared across models)
    breaks_before = sum(counters["graph_break"].values())
    batches = _batches(task, BATCHES)

    # outputs and gradients, with the same dropout masks
    sample = next(batches)
    out, _ = _seeded_backward(model, sample)
    ref_out, _ = _seeded_backward(eager, sample)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=RTOL, msg=lambda m: f"{arch}: outputs differ: {m}")
    grads = {n: p.grad for n, p in model.named_parameters()}
    print(f"{arch}: max |compiled - eager| output {(out - ref_out).abs().max():.2e}, gradient "
          f"{max((grads[n] - p.grad).abs().max() for n, p in eager.named_parameters() if p.grad is not None):.2e}")
    for name, p in eager.named_parameters():
        if p.grad is None:
            assert grads[name] is None, name
            continue
        torch.testing.assert_close(grads[name], p.grad, atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"{arch}: gradient of {name} differs: {m}")

    # fewer kernel launches than the eager layers: the elementwise chains fused (bench_launches.py --compile counts
    # whole updates at base width)
    compiled_launches, generated = _profiled_launches(model, sample)
    eager_launches, _ = _profiled_launches(eager, sample)
    _assert_no_fallback(model)
    print(f"{arch}: forward + backward launch {compiled_launches} kernels compiled ({generated} generated), "
          f"{eager_launches} eager")
    assert generated > 0 and compiled_launches <= MAX_COMPILED_LAUNCHES * eager_launches, (
        arch, compiled_launches, eager_launches)

    # the two encoder layers: one compiled graph between them
    encoder_layer = model.encoder.stack.layers[0] if arch.startswith("transformer_sf") else model.encoder.layers[0]
    new_entries = compiled_layers.cache_entries(encoder_layer._umst_compiled[1]) - entries_before[
        forwards.index(encoder_layer._umst_compiled[1])]
    assert new_entries == (2 if arch in DISTINCT_ENCODER_LAYERS else 1), (arch, new_entries)

    # 20 batches of different shapes: nothing compiled after the first few
    for i, sample in enumerate(batches, start=1):
        if i == WARMUP:
            after_warmup = _graph_state(forwards)
        model.zero_grad(set_to_none=True)
        _loss(model, sample)[1].backward()
    assert _graph_state(forwards) == after_warmup, (arch, after_warmup, _graph_state(forwards))
    assert sum(counters["graph_break"].values()) == breaks_before, dict(counters["graph_break"])
    variants = [compiled_layers.cache_entries(f) - n for f, n in zip(forwards, entries_before)]
    print(f"{arch}: compiled variants per layer class {variants} ({', '.join(f.__qualname__ for f in forwards)})")
    # one program per layer class for every shape of these batches (padded, 2-7 sentences, sources shorter and
    # longer than Prime's widest kernel); TranSFormer's encoder class has its two differently built layers
    assert max(variants) == (2 if arch in DISTINCT_ENCODER_LAYERS else 1), (arch, variants)


# On a GPU inductor generates Triton, not C++: the layers that compile on the CPU may not. An H200's compiled
# TranSFormer update once ran its encoder layers eager (docs/compile.md, "On a GPU"); Prime has the other target;
# UMST's encoder layer fails AOTAutograd's partition under torch 2.11 on a CPU (docs/compile.md, "torch 2.11"),
# on a graph the GPU's differs from (its fused attention, CUDA autocast's casts).
CUDA_ARCHS = [p for p in ARCHS if p.id in ("transformer_sf_base", "prime_base", "umst_base")]


@pytest.mark.cuda
@pytest.mark.parametrize("arch,overrides", CUDA_ARCHS)
def test_compiled_layers_on_cuda_do_not_fall_back_and_match_eager(arch, overrides, fresh_fallbacks):
    """The layers compile on CUDA, in fp32 and under bf16 autocast (the GPU check's and fairseq ``--amp``'s
    precision), with no variant falling back to eager; fp32 outputs and gradients are eager's (dropout masks from
    torch's generator, as on the CPU). A fallback fails the test with its error (``eager_fallbacks``), which is
    what the GPU check's report then carries."""
    import torch._inductor.config as inductor_config

    model, task = dev.build_model(arch, {**TINY, **DROPOUT, **overrides})
    model = model.cuda().train()
    eager = copy.deepcopy(model)
    _take_plain_inputs(eager)
    compilation.compile_layers(model)
    batches = [dev.move_sample(b, "cuda") for b in _batches(task, 3)]
    with inductor_config.patch({"fallback_random": True}):
        out, _ = _seeded_backward(model, batches[0])
        ref_out, _ = _seeded_backward(eager, batches[0])
        _assert_no_fallback(model)  # (the GPU check's log keeps its message)
        torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=RTOL, msg=lambda m: f"{arch}: outputs differ: {m}")
        grads = dict(model.named_parameters())
        for name, p in eager.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(grads[name].grad, p.grad, atol=ATOL, rtol=RTOL,
                                           msg=lambda m: f"{arch}: gradient of {name} differs: {m}")
        for sample in batches[1:]:  # other shapes, then bf16 autocast
            model.zero_grad(set_to_none=True)
            _loss(model, sample)[1].backward()
        for sample in batches:
            model.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, loss = _loss(model, sample)
            loss.backward()
            assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    _assert_no_fallback(model)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_decoder_layers_of_a_stack_share_one_compiled_program(monkeypatch):
    """fairseq's decoder layer reads its self-attention's per-instance state key on every call; without
    patches/incremental_state_lookup.py dynamo guarded on it and compiled each layer of a decoder for itself. With
    it: one program for the first layers of a 3-layer decoder, one for the last (it returns the attention for
    alignment), one for the encoder layer. Counted with a backend of this test's own (it records the graphs dynamo
    hands it and runs them as they are), so nothing compiled before in this process is reused."""
    from fairseq.incremental_decoding_utils import FairseqIncrementalState

    from umst_plugin.patches import incremental_state_lookup

    assert FairseqIncrementalState.get_incremental_state is incremental_state_lookup.get_incremental_state

    def graphs_compiled():
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        model, task = dev.build_model("transformer", {**TINY, "encoder_layers": 1, "decoder_layers": 3,
                                                      "decoder_normalize_before": True})
        model.train()
        compilation.compile_layers(model, backend=backend, check=False)  # (the start-up check compiles too)
        _loss(model, dev.random_sample(task, 3, 6, 5, seed=0))[1].backward()
        return len(graphs)
    assert graphs_compiled() == 3
    # fairseq's own lookup: the key read before the missing state is noticed, a program per decoder layer
    original = incremental_state_lookup.get_incremental_state.__wrapped__
    monkeypatch.setattr(FairseqIncrementalState, "get_incremental_state", original)
    assert graphs_compiled() == 4


def test_the_incremental_state_lookup_finds_what_was_stored_as_fairseqs_does():
    """The patched lookup (``None`` tested first) is fairseq's otherwise: a module's stored state is found under its
    own key, a module that stored nothing gets None, as does a call without an incremental state."""
    from fairseq.incremental_decoding_utils import FairseqIncrementalState, with_incremental_state

    @with_incremental_state
    class Stateful(torch.nn.Module):
        pass

    first, second = Stateful(), Stateful()
    state, saved = {}, {"prev_key": torch.ones(1)}
    first.set_incremental_state(state, "attn_state", saved)
    for lookup in (FairseqIncrementalState.get_incremental_state,
                   FairseqIncrementalState.get_incremental_state.__wrapped__):  # the patch's and fairseq's
        assert lookup(first, state, "attn_state") is saved
        assert lookup(second, state, "attn_state") is None and lookup(first, state, "other") is None
        assert lookup(first, None, "attn_state") is None


@pytest.mark.slow
def test_incremental_decoding_runs_eager_and_matches():
    """A compiled decoder layer called with an incremental state runs its eager forward (nothing compiled for it),
    and step-by-step decoding equals the full-sequence pass of the compiled model (eval mode, no autograd)."""
    model, task = dev.build_model("transformer", {**TINY, "decoder_normalize_before": True})
    model.eval()
    compilation.compile_layers(model)
    sample = dev.random_sample(task, 4, 7, 6, seed=1)
    pad = task.target_dictionary.pad()
    with torch.no_grad():
        encoder_out = model.encoder(**dev.encoder_inputs(model, sample))
        prev = sample["net_input"]["prev_output_tokens"]
        full = model.decoder(prev, encoder_out=encoder_out)[0]
        graphs = compilation.compiled_graphs()
        state = {}
        for t in range(prev.size(1)):
            step = model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)[0][:, -1]
            real = prev[:, :t + 1].ne(pad).all(dim=1)  # rows whose prefix has no padding
            torch.testing.assert_close(step[real], full[real, t], atol=1e-5, rtol=1e-4)
        assert compilation.compiled_graphs() == graphs


# ---- the flags --------------------------------------------------------------------------------------------------

CLI_PARSERS = ("get_training_parser", "get_validation_parser", "get_generation_parser",
               "get_interactive_generation_parser")


@pytest.mark.parametrize("make", CLI_PARSERS)
def test_every_cli_parser_takes_compile_and_tf32(make):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = ["data-bin", "--user-dir", e2e.PLUGIN, "--task", "translation", "--cpu"]
    argv += ["--arch", "transformer"] if make == "get_training_parser" else ["--path", "checkpoint.pt"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(getattr(options, make)(),
                                                                     input_args=argv + ["--compile", "--tf32"]))
    assert cfg.common.compile is True and cfg.common.tf32 is True
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(getattr(options, make)(), input_args=argv))
    assert cfg.common.compile is False and cfg.common.tf32 is False  # off by default


def test_a_parser_built_before_the_plugin_gets_the_flags_from_the_task():
    import argparse

    from fairseq.tasks import TASK_REGISTRY

    for name in ("translation", "multiscale_translation"):
        parser = argparse.ArgumentParser(allow_abbrev=False)
        TASK_REGISTRY[name].add_args(parser)
        args, _ = parser.parse_known_args(["data-bin", "--compile", "--tf32", "--amp-dtype", "bfloat16"])
        assert args.compile and args.tf32 and args.amp_dtype == "bfloat16", name
        TASK_REGISTRY[name].add_args(parser)  # twice: still one flag each
        for flag in ("--compile", "--tf32", "--amp-dtype"):
            assert sum(flag in a.option_strings for a in parser._actions) == 1, (name, flag)


def test_the_patch_is_idempotent():
    from fairseq.dataclass.configs import CommonConfig
    from fairseq.tasks.fairseq_task import FairseqTask
    from fairseq.trainer import Trainer

    from umst_plugin.compilation import flags as compile_flags
    from umst_plugin.training import amp_dtype_flag

    before = (dict(CommonConfig.__dataclass_fields__), CommonConfig.__init__, Trainer.__init__,
              FairseqTask.build_model, FairseqTask.__dict__["add_args"])
    compile_flags.install()
    amp_dtype_flag.install()
    assert before == (dict(CommonConfig.__dataclass_fields__), CommonConfig.__init__, Trainer.__init__,
                      FairseqTask.build_model, FairseqTask.__dict__["add_args"])
    assert CommonConfig(compile=True).compile and not CommonConfig().tf32


def test_only_a_cache_dir_the_user_chose_overrides_the_save_dirs(tmp_path, monkeypatch):
    """SAVE_DIR/compile_cache is used unless the user set TORCHINDUCTOR_CACHE_DIR. What torch or this plugin wrote
    into the environment of a process that compiled is inherited by the processes it starts and is not a choice:
    torch's default directory (written by torch at the first compile: a CI failure came from a pytest worker that had
    compiled, whose fairseq-train then cached outside its save dir) and the plugin's own directory."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    chosen = str(tmp_path / "mine")
    assert cache.user_cache_dir({}) is None
    assert cache.user_cache_dir({"TORCHINDUCTOR_CACHE_DIR": chosen}) == chosen
    assert cache.user_cache_dir({"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}) is None
    assert cache.user_cache_dir({"TORCHINDUCTOR_CACHE_DIR": chosen, "UMST_PLUGIN_INDUCTOR_CACHE_DIR": chosen}) \
        is None
    assert cache.user_cache_dir({"TORCHINDUCTOR_CACHE_DIR": chosen,
                                     "UMST_PLUGIN_INDUCTOR_CACHE_DIR": str(tmp_path / "other")}) == chosen
    # what torch itself writes into os.environ is recognised (fails if torch changes what it writes)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("UMST_PLUGIN_INDUCTOR_CACHE_DIR", raising=False)
    cache_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] and cache.user_cache_dir(os.environ) is None


def test_the_save_dirs_cache_is_where_inductor_looks_and_a_resumed_run_keeps_it(tmp_path, monkeypatch):
    """``use_cache_dir(SAVE_DIR/compile_cache)``: the process's TORCHINDUCTOR_CACHE_DIR becomes that directory (and
    is named as the plugin's, so a process it starts does not take it for the user's), whatever the variable held
    before; a second call on the directory a first run left (a resumed or requeued run) keeps it and counts the
    compiled graphs inductor's FX graph cache holds there. A directory the user chose wins."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from torch._inductor.utils import clear_caches

    monkeypatch.setattr(cache, "USER_CACHE_DIR", None)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "earlier"))  # another run's, inherited
    monkeypatch.delenv("UMST_PLUGIN_INDUCTOR_CACHE_DIR", raising=False)
    save_cache = tmp_path / "save" / cache.CACHE_DIRNAME
    try:
        assert cache.use_cache_dir(str(save_cache)) == (str(save_cache), 0)
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.environ["UMST_PLUGIN_INDUCTOR_CACHE_DIR"] == \
            str(save_cache) == cache_dir()
        assert cache.user_cache_dir(os.environ) is None
        for graph in ("a/one", "a/two", "b/three"):  # what a first run's compiles left there
            (save_cache / "fxgraph" / graph).parent.mkdir(parents=True, exist_ok=True)
            (save_cache / "fxgraph" / graph).write_text("")
        assert cache.use_cache_dir(str(save_cache)) == (str(save_cache), 3)
        monkeypatch.setattr(cache, "USER_CACHE_DIR", str(tmp_path / "mine"))
        assert cache.use_cache_dir(str(save_cache)) == (str(tmp_path / "mine"), 0)
        assert (tmp_path / "mine").is_dir()
    finally:
        monkeypatch.undo()
        clear_caches()  # (inductor's in-memory caches of the paths above)


def _raised_in(filename, error):
    """``error`` raised by code whose frame is in ``filename`` (as torch's compiler or inductor's generated code
    raises it), caught."""
    try:
        exec(compile("raise error", filename, "exec"), {"error": error})
    except BaseException as e:
        return e


def test_errors_of_compiled_code_are_told_from_errors_of_eager_code():
    """``retry.from_compiled_code``: an error is the compiler's or compiled code's where its class is dynamo's,
    inductor's or functorch's, or where a frame it passed through is in torch's ``_functorch``, ``_inductor`` or
    ``_dynamo`` or in inductor's generated code (``torchinductor``), each alone, or where its cause or its context
    (an error raised while handling it) is; an error of eager code, or a cycle of such errors, is not."""
    from torch._dynamo.exc import Unsupported

    assert retry.from_compiled_code(Unsupported("a class of torch's compiler, no frames"))
    assert not retry.from_compiled_code(ValueError("eager"))
    assert not retry.from_compiled_code(_raised_in("/home/me/my_layer.py", ValueError("eager code")))
    for where in ("/venv/lib/torch/_functorch/_aot_autograd/runtime_wrappers.py",
                  "/venv/lib/torch/_inductor/output_code.py", "/tmp/torchinductor_me/ab/cabcdef.py",
                  "/venv/lib/torch/_dynamo/eval_frame.py"):
        assert retry.from_compiled_code(_raised_in(where, AssertionError("expected size 5==5, stride 4==5"))), where
    compiled = _raised_in("/tmp/torchinductor_me/ab/cabcdef.py", AssertionError("compiled"))
    caused = ValueError("eager, raised from it")
    caused.__cause__ = compiled
    assert retry.from_compiled_code(caused)
    try:
        try:
            raise compiled
        except AssertionError:
            raise ValueError("eager, raised while handling it")
    except ValueError as e:
        assert e.__cause__ is None and e.__context__ is compiled and retry.from_compiled_code(e)
    first, second = ValueError("one"), ValueError("two")
    first.__context__, second.__context__ = second, first  # a cycle: the walk ends
    assert not retry.from_compiled_code(first)


def test_only_a_compiled_backward_s_own_failure_is_taken_for_one(monkeypatch):
    """``retry.backward_failure`` leaves an error alone (None, no variant turned eager, the mark kept) where no
    compiled backward was marked as running, where it is already a CompileFailure, where it is out of memory (even
    raised in compiled code: fairseq handles it), or where eager code raised it."""
    from umst_dev import compiled_layers

    monkeypatch.setattr(STATE, "eager_variants", {})
    compiled_error = _raised_in("/tmp/torchinductor_me/ab/cabcdef.py", AssertionError("expected size"))
    monkeypatch.setattr(STATE, "in_backward", None)
    assert retry.backward_failure(compiled_error) is None
    marked = (torch.nn.Linear(2, 2), None, (), {}, None)
    monkeypatch.setattr(STATE, "in_backward", marked)
    for error in (retry.CompileFailure("already named"),
                  _raised_in("/tmp/torchinductor_me/ab/cabcdef.py", torch.OutOfMemoryError("CUDA out of memory")),
                  _raised_in("/home/me/my_layer.py", AssertionError("eager code"))):
        assert retry.backward_failure(error) is None, error
        assert STATE.in_backward is marked and not compiled_layers.eager_variants()


def test_a_compiled_call_marks_its_backward_only_on_an_output_with_a_gradient(monkeypatch):
    """``retry.mark_backward`` hooks the (first) output of a compiled call that requires a gradient, and autograd
    runs the hook when the backward reaches it (``STATE.in_backward`` names the layer); an output without a
    gradient, or no tensor first, gets no hook and raises nothing."""
    layer = torch.nn.Linear(2, 2)
    monkeypatch.setattr(STATE, "in_backward", None)
    for out in ((torch.ones(2),), torch.ones(2), (None, torch.ones(2, requires_grad=True)), ["not a tensor"], ()):
        retry.mark_backward(layer, None, (), {}, out)
    x = torch.ones(1, 2, requires_grad=True)
    out = layer(x)
    retry.mark_backward(layer, "eager", (x,), {}, (out, None))
    assert STATE.in_backward is None
    out.sum().backward()
    assert STATE.in_backward[:3] == (layer, "eager", (x,)) and STATE.in_backward[4][0] is torch.nn.Linear


def test_the_per_update_compile_line_says_how_warm_the_cache_was():
    """fairseq-train --compile's per-update line names the cache by what that update's compiles found: warm where
    all were hits, cold where none was (a first run), partly warm otherwise (a resumed run meeting a new shape)."""
    assert telemetry.cache_word(4, 0) == "cache warm"
    assert telemetry.cache_word(0, 3) == "cache cold"
    assert telemetry.cache_word(2, 1) == "cache partly warm"
    assert telemetry.cache_word(0, 0) == "cache cold"  # (a line only comes where something compiled)


def test_trainer_compiles_its_model_and_inference_clis_compile_what_they_load():
    """fairseq's Trainer with --compile compiles the layers of its model (on its device) and its criterion's loss;
    inside a CLI main with --compile, every model a task builds is compiled, and every criterion's loss (what
    fairseq-validate builds); outside, nothing is."""
    from fairseq import tasks
    from fairseq.trainer import Trainer

    import fairseq_cli.generate
    import fairseq_cli.interactive
    import fairseq_cli.validate
    from umst_plugin.compilation import flags as compile_flags

    assert fairseq_cli.validate.main is compile_flags.validate_main
    assert fairseq_cli.interactive.main is compile_flags.interactive_main
    assert fairseq_cli.generate._main is compile_flags.generate_main

    # --no-save: a Trainer with --compile and a save_dir keeps inductor's caches in SAVE_DIR/compile_cache and points
    # this process's TORCHINDUCTOR_CACHE_DIR there; fairseq's default save_dir is ./checkpoints, in the checkout,
    # where every later compile of this worker would go
    options = dict(TINY, cpu=True, optimizer="adam", lr="1e-3", max_tokens=100, no_save=True,
                   criterion="label_smoothed_cross_entropy", label_smoothing=0.1)
    for compiled in (False, True):
        cfg, task, model, criterion = dev.training_parts("transformer", dict(options, compile=compiled))
        assert not any(compilation.is_compiled(m) for _, m in compilation.find_layers(model))  # not by building
        trainer = Trainer(cfg, task, model, criterion)
        layers = [m for _, m in compilation.find_layers(trainer.model)]
        assert layers and all(compilation.is_compiled(m) == compiled for m in layers), compiled
        loss = trainer.criterion._modules.get(compiled_loss.LOSS_MODULE)  # the loss too (compilation/loss.py)
        assert (loss is not None and compilation.is_compiled(loss)) == compiled, compiled

    cfg = dev.config_of(dev.parse_args("transformer", dict(options, compile=True)))
    d = dev.make_dictionary()
    task = tasks.TASK_REGISTRY["multiscale_translation"](cfg.task, d, d)
    with compile_flags._CommandLine(cfg):
        model = task.build_model(cfg.model)
        criterion = task.build_criterion(cfg.criterion)  # (fairseq-validate's)
    assert all(compilation.is_compiled(m) for _, m in compilation.find_layers(model))
    assert not any(compilation.is_compiled(m) for _, m in compilation.find_layers(task.build_model(cfg.model)))
    assert compilation.is_compiled(criterion._modules[compiled_loss.LOSS_MODULE])
    assert compiled_loss.LOSS_MODULE not in task.build_criterion(cfg.criterion)._modules


def test_compile_refuses_what_it_cannot_compile():
    """A layer whose forward fairseq's --checkpoint-activations replaced (compiling would drop the checkpointing),
    and a model without layers of a known class."""
    model, _ = dev.build_model("transformer", {**TINY, "checkpoint_activations": True})
    with pytest.raises(ValueError, match="--checkpoint-activations"):
        compilation.compile_layers(model, check=False)
    with pytest.raises(ValueError, match="no encoder or decoder layer"):
        compilation.compile_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)), check=False)


def test_compile_stops_at_start_up_where_inductor_has_no_cpp_compiler(monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(STATE, "probed", {})
    monkeypatch.setattr(probe, "_smoke", lambda x: torch.tanh(x * 3.0 - 0.5))  # not in any cache
    with inductor_config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}), \
            pytest.raises(compilation.CompileUnavailable, match="install a C\\+\\+ compiler"):
        compilation.check_available("cpu")


def test_tf32_warns_without_tf32_and_switches_it_on_with_it(monkeypatch, caplog):
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False  # not torch's default (True): so that switching it on shows
        with caplog.at_level(logging.INFO, logger="umst_plugin.compilation"):
            assert compilation.set_tf32(False) is False
            assert not caplog.records  # off: nothing said, nothing changed
            assert compilation.set_tf32(True, "cpu") is False
        assert "--tf32: TF32 needs an NVIDIA GPU" in caplog.text and caplog.records[-1].levelname == "WARNING"
        assert torch.backends.cuda.matmul.allow_tf32 is False
        caplog.clear()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100 (faked)")
        with caplog.at_level(logging.INFO, logger="umst_plugin.compilation"):
            assert compilation.set_tf32(True, "cuda") is True
        assert "TensorFloat-32" in caplog.text and caplog.records[-1].levelname == "INFO"
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
        assert compilation.set_tf32(True, "cuda") is False  # a V100: no TF32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def test_train_sh_passes_compile_and_tf32():
    """train.sh --compile / --tf32 become fairseq-hydra-train's +common.compile / +common.tf32 (the sbatch scripts
    hand them to train.sh on every node: tests/test_train_sh_plan.py, on Slurm itself)."""
    from test_train_sh_plan import plan

    command, _ = plan("umst-t2-umst-base", "--gpus", "8", "--compile", "--tf32")
    assert "+common.compile=true" in command and "+common.tf32=true" in command
    command, _ = plan("umst-t2-umst-base", "--gpus", "8")
    assert "common.compile" not in command and "common.tf32" not in command



def test_a_fallback_names_where_an_error_without_a_message_was_raised():
    """A bare ``assert`` in torch (torch 2.11's dynamo failing on TranSFormer's relative attention) has no message;
    dynamo appends the user's frames to it. The fallback's reason names the line that raised it and the user's line
    dynamo was tracing, not "AssertionError: from user code:"; a message of its own stays the reason."""
    user = '   File "/venv/umst_plugin/modules/prime/dynamic_conv.py", line 231, in multi_dynamic_convolution\n'
    try:
        assert False  # noqa: B011 -- an assertion without a message, as torch's
    except AssertionError as e:
        e.args = (f"\n\nfrom user code:\n{user}    return DynamicConvolution.apply(...)\n",)
        reason = fallback.reason(e)
    assert re.fullmatch(r"AssertionError \(no message\) in test_compile\.py:\d+ "
                        r"\(test_a_fallback_names_where_an_error_without_a_message_was_raised\); tracing "
                        r"umst_plugin/modules/prime/dynamic_conv\.py:231 \(multi_dynamic_convolution\)", reason), reason
    error = RuntimeError(f"shapes do not match\n\nfrom user code:\n{user}")
    assert fallback.reason(error) == "RuntimeError: shapes do not match"


@torch.library.custom_op("umst_test::column_major_double", mutates_args=())
def _column_major_double(x: torch.Tensor) -> torch.Tensor:
    """2x, returned column-major: a kernel whose output strides are not what its fake says (the H200's MSC
    backward failed a stride check of inductor's generated code this way, expected 565248 where it got 671744)."""
    return (2 * x).t().contiguous().t()


@_column_major_double.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def test_a_fallback_from_generated_code_names_the_operator_and_keeps_the_code_that_failed(fresh_fallbacks, caplog):
    """A compiled graph failing at run time in the code inductor generated (its stride check of an operator's
    output): the reason names the operator (the message's later line, "Error in op: ...") and the generated line
    with its symbolic sizes and strides; the traceback kept for the record and the log carry the generated code
    around it, the failing line marked -- the cache it lies in stays on the machine."""
    compiled = torch.compile(lambda x: _column_major_double(x + 1) + 1, dynamic=True, fullgraph=True)
    with pytest.raises(AssertionError) as raised:
        compiled(torch.randn(5, 7))
    error = raised.value
    reason = fallback.reason(error)
    assert re.match(r"AssertionError: expected size \d+==\d+, stride \d+==\d+ at dim=\d.* "
                    r"\(in torch\.ops\.umst_test\.column_major_double\.default\); generated code \w+\.py:\d+: "
                    r"(assert_size_stride|assert_tensor_metadata)\(", reason), reason  # (torch 2.14: the latter)
    path, lineno, line = fallback.generated_frame(error)
    assert line.startswith(("assert_size_stride(", "assert_tensor_metadata(")) and \
        open(path).read().splitlines()[lineno - 1].strip() == line
    layer = torch.nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING):
        fallback.fall_back(layer, layer.forward, ("Linear", True, True), "5x7 float32", "forward", error)
    kept = STATE.fallback_tracebacks[(layer.forward, ("Linear", True, True))]
    marked = [row for row in kept.splitlines() if row.startswith(">")]
    assert marked == [f">{lineno:6d}  {open(path).read().splitlines()[lineno - 1]}"], kept[-2000:]
    logged = [r.getMessage() for r in caplog.records if "where the compiled forward of Linear failed" in r.getMessage()]
    assert len(logged) == 1 and marked[0] in logged[0] and f"{path}:{lineno}" in logged[0]
    # an error raised elsewhere has no generated frame, and its reason stays its first line
    assert fallback.generated_frame(RuntimeError("x")) is None and fallback.generated_excerpt(RuntimeError("x")) == ""


def _failing_backend(gm, example_inputs):
    if len(gm.graph.nodes) > 8:  # a layer's graph, not probe.check_available's three-op smoke test
        raise RuntimeError("planted: this backend cannot compile a layer")
    return gm.forward


@pytest.mark.parametrize("arch,overrides", ARCHS)
def test_every_arch_falls_back_to_eager_where_its_layers_fail_to_compile(arch, overrides, fresh_fallbacks, caplog):
    """Dynamo's real failure path (a backend that raises; no inductor) for each arch's own layer arguments: the
    warning names the inputs' shapes (a list of side inputs with None in it once raised a TypeError inside the
    handler, on UMST: the failure the fallback exists to absorb ended the run), and the update equals eager."""
    model, task = dev.build_model(arch, {**TINY, **overrides})
    model.train()
    eager = copy.deepcopy(model)
    _take_plain_inputs(eager)  # as the fallen-back layers get them
    compilation.compile_layers(model, backend=_failing_backend)
    sample = next(_batches(task, 1))
    with caplog.at_level(logging.WARNING):
        out, _ = _seeded_backward(model, sample)
    ref_out, _ = _seeded_backward(eager, sample)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")
    fallbacks = compiled_layers.eager_fallbacks(model)
    assert len(fallbacks) >= 2 and all("planted: this backend cannot compile a layer" in f for f in fallbacks)
    warnings = [r.getMessage() for r in caplog.records if "runs eager from now on" in r.getMessage()]
    assert len(warnings) == len(fallbacks) and all(re.search(r"inputs [^;]*\d+x\d+ (float32|int64|bool)", w)
                                                   for w in warnings), warnings


def _leaving_out_saved_sizes(extract):
    """torch 2.11's min-cut as it failed: ``extract`` (torch's ``_extract_fwd_bwd_modules``) called with the SymInt
    inputs taken out of what the forward saves (the caller's list, as the min-cut passes it)."""
    def extract_without_sizes(joint_module, saved_values, saved_sym_nodes, *args, **kwargs):
        for node in [n for n in saved_sym_nodes if n.op == "placeholder"]:
            saved_sym_nodes.remove(node)
        return extract(joint_module, saved_values, saved_sym_nodes, *args, **kwargs)
    return extract_without_sizes


def test_the_partition_patch_saves_the_size_inputs_a_split_left_out(monkeypatch):
    """patches/partition_symbols.py's retry, run on this torch (it installs itself on torch < 2.13 only): torch
    2.11's failure planted in the split (the size inputs of a dynamic-shape graph left out of what the forward
    saves, while the backward reads them through recomputed views) raises 'Node ... was invalid, but is output' as
    2.11 did; the patch's wrapper around the split saves them and the split succeeds, with eager's gradients."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import partitioners

    from umst_plugin import patches
    from umst_plugin.patches import partition_symbols

    split = partitioners._extract_fwd_bwd_modules
    split = patches.original(split) if patches.installed(split, partition_symbols.__name__) else split
    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           partition_fn=partitioners.min_cut_rematerialization_partition)

    def layer(x, w):  # its backward recomputes views whose sizes are x's
        h = torch.relu(x @ w)
        return h.reshape(x.size(0) * x.size(1), -1).expand(2, -1, -1).sum(0)

    def gradients(function):
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(3, 5, 4, generator=g, requires_grad=True), torch.randn(4, 6, generator=g, requires_grad=True)
        (function(x, w) ** 2).sum().backward()
        return x.grad, w.grad

    def compiled(name):  # a code object of its own: dynamo compiles it afresh
        fresh = types.FunctionType(layer.__code__.replace(co_name=name), layer.__globals__, name)
        return torch.compile(fresh, backend=backend, dynamic=True, fullgraph=True)

    monkeypatch.setattr(partitioners, "_extract_fwd_bwd_modules", _leaving_out_saved_sizes(split))
    with pytest.raises(Exception, match="was invalid, but is output"):
        gradients(compiled("unpatched_split"))
    monkeypatch.setattr(partitioners, "_extract_fwd_bwd_modules",
                        _leaving_out_saved_sizes(partition_symbols.wrap(split, partitioners)))
    for got, want in zip(gradients(compiled("patched_split")), gradients(layer)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_partition_patch_is_for_torch_before_2_13_only():
    """patches/partition_symbols.py changes torch's AOTAutograd split only on torch < 2.13 (2.11: the GPU machines'
    torch), and there only where the split raised; a newer torch is left as it is."""
    from torch._functorch import partitioners

    from umst_plugin import patches
    from umst_plugin.patches import partition_symbols

    assert partition_symbols.applies("2.11.0+cu130") and partition_symbols.applies("2.12.1")
    assert not partition_symbols.applies("2.13.0+cpu") and not partition_symbols.applies("2.14.0")
    assert not partition_symbols.applies("2.13.0") and not partition_symbols.applies("2.13")
    patched = patches.installed(partitioners._extract_fwd_bwd_modules, partition_symbols.__name__)
    assert patched == partition_symbols.applies(), torch.__version__


def test_the_partition_patch_refuses_a_torch_whose_split_takes_other_arguments(monkeypatch):
    """Where it applies (torch < 2.13), the patch calls torch's split with the first three arguments by position
    and ``num_fwd_outputs`` by name: a split that takes other ones is refused with a clear error naming them; one
    that takes these is wrapped."""
    from torch._functorch import partitioners

    from umst_plugin import patches
    from umst_plugin.patches import PatchError, partition_symbols

    monkeypatch.setattr(partition_symbols, "applies", lambda version=None: True)

    def renamed(joint_module, saved_values, saved_symbols, *, num_fwd_outputs):
        raise AssertionError("never called")

    def without_outputs(joint_module, saved_values, saved_sym_nodes):
        raise AssertionError("never called")

    for split in (renamed, without_outputs):
        monkeypatch.setattr(partitioners, "_extract_fwd_bwd_modules", split)
        with pytest.raises(PatchError, match=r"partition_symbols: .*_extract_fwd_bwd_modules.* takes \['joint_module'"):
            partition_symbols.install()

    def as_torch_2_11(joint_module, saved_values, saved_sym_nodes, *, num_fwd_outputs, static_lifetime_input_nodes=None):
        raise AssertionError("never called")

    monkeypatch.setattr(partitioners, "_extract_fwd_bwd_modules", as_torch_2_11)
    partition_symbols.install()
    assert patches.installed(partitioners._extract_fwd_bwd_modules, partition_symbols.__name__)


@pytest.mark.slow
@pytest.mark.parametrize("arch,overrides", [p for p in ARCHS if p.id in ("umst_base", "transformer_sf_base")])
def test_layers_compile_under_bf16_autocast_on_a_cpu(arch, overrides, fresh_fallbacks):
    """Under bf16 autocast (fairseq --amp --amp-dtype bfloat16) the layers compile with no fallback to eager and
    train to finite gradients. Under torch 2.11 AOTAutograd's split of both archs' encoder layers failed here
    ('Node sum_30 was invalid, but is output') until patches/partition_symbols.py; under torch 2.13, where the
    patch is not installed, this checks the compile alone (the patch's retry itself:
    test_the_partition_patch_saves_the_size_inputs_a_split_left_out)."""
    model, task = dev.build_model(arch, {**TINY, **DROPOUT, **overrides})
    model.train()
    compilation.compile_layers(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = _loss(model, next(_batches(task, 1)))
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    _assert_no_fallback(model)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


class _StandInLayer(torch.nn.Module):
    """A layer for ``_dispatch`` alone: its "compiled" forward is a stand-in that records its calls (nothing is
    compiled), so which forward the dispatch chooses, and what it logs, is seen directly."""

    def forward(self, x, encoder_out=None, incremental_state=None):
        return x + 1


def _stand_in_layer(monkeypatch, new_graphs_per_call):
    """A ``_StandInLayer`` set up as ``compile_layers`` sets up a layer; its calls ("compiled", "eager"), and the
    compile logs of ``_dispatch`` (the stand-in "compiles" ``new_graphs_per_call[0]`` graphs a call)."""
    calls, logged, graphs = [], [], [0]

    def compiled(self, *args, **kwargs):
        calls.append("compiled")
        graphs[0] += new_graphs_per_call[0]
        return _StandInLayer.forward(self, *args, **kwargs)

    def eager(self, *args, **kwargs):
        calls.append("eager")
        return _StandInLayer.forward(self, *args, **kwargs)

    layer = _StandInLayer()
    layer._umst_compiled = (compiled, eager, dispatch._incremental_index(_StandInLayer.forward))
    layer.forward = types.MethodType(dispatch._dispatch, layer)
    monkeypatch.setattr(dispatch.telemetry, "compiled_graphs", lambda: graphs[0])
    monkeypatch.setattr(dispatch.telemetry, "log_compiled",
                        lambda layer, forward, seconds, new: logged.append(new))
    return layer, calls, logged


def test_dispatch_runs_eager_inside_layers_eager_and_for_incremental_steps(monkeypatch, fresh_fallbacks):
    """A compiled layer's forward runs its eager forward inside ``layers_eager()`` (restored on leaving, nested
    too) and for incremental decoding steps, the state passed by keyword or in its place among the positional
    arguments (``_incremental_index``: after ``self``, as fairseq's decoder layers take it); else its compiled
    forward."""
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

    assert dispatch._incremental_index(_StandInLayer.forward) == 2
    assert dispatch._incremental_index(TransformerDecoderLayerBase.forward) == 3
    assert dispatch._incremental_index(TransformerEncoderLayerBase.forward) is None
    layer, calls, _ = _stand_in_layer(monkeypatch, [0])
    x = torch.zeros(2)
    with torch.no_grad():
        layer(x)
        with dispatch.layers_eager():
            layer(x)
            with dispatch.layers_eager():
                layer(x)
            layer(x)
        layer(x)
        layer(x, None, {})
        layer(x, incremental_state={})
        layer(x, None, None)
    assert calls == ["compiled", "eager", "eager", "eager", "compiled", "eager", "eager", "compiled"]


def test_dispatch_logs_the_compile_time_of_calls_that_compiled_only(monkeypatch, fresh_fallbacks):
    """The compile log (``telemetry.log_compiled``) comes for a call that compiled new graphs, with their number,
    and not for a call that reused what was compiled."""
    new_graphs = [2]
    layer, calls, logged = _stand_in_layer(monkeypatch, new_graphs)
    with torch.no_grad():
        layer(torch.zeros(2))
        new_graphs[0] = 0
        layer(torch.zeros(3))
    assert calls == ["compiled", "compiled"] and logged == [2]


def test_configure_dynamo_sets_what_the_compiled_layers_rely_on(monkeypatch):
    """``--compile``'s dynamo settings: a recompile limit of at least ``fallback.RECOMPILE_LIMIT`` (a higher one
    kept), Python floats constant, no duck sizing, an error at the limit, AOTAutograd's cache open to custom autograd
    Functions; and both compiler patches installed with
    inductor loaded for them (a fresh fairseq-train process has not loaded it yet: without ``load`` they would be
    left out)."""
    import torch._dynamo.config as config
    import torch._functorch.config as functorch_config
    import torch.fx.experimental._config as fx_config

    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    loads = []
    monkeypatch.setattr(dispatch.inductor_scan, "install", lambda load=False: loads.append(("scan", load)))
    monkeypatch.setattr(dispatch.saved_activation_strides, "install",
                        lambda load=False: loads.append(("strides", load)))
    # the config modules' own patch, which restores them (monkeypatch's undo breaks names torch answers by alias,
    # such as recompile_limit)
    with config.patch({limit: 8, "specialize_float": False, "fail_on_recompile_limit_hit": False}), \
            fx_config.patch(use_duck_shape=True), \
            functorch_config.patch(autograd_cache_allow_custom_autograd_functions=False):
        dispatch.configure_dynamo()
        assert getattr(config, limit) == fallback.RECOMPILE_LIMIT
        assert config.specialize_float and not fx_config.use_duck_shape and config.fail_on_recompile_limit_hit
        assert functorch_config.autograd_cache_allow_custom_autograd_functions  # layers with custom Functions cached
        assert loads == [("scan", True), ("strides", True)]
        setattr(config, limit, 4 * fallback.RECOMPILE_LIMIT)
        dispatch.configure_dynamo()
        assert getattr(config, limit) == 4 * fallback.RECOMPILE_LIMIT


def test_compile_layers_compiles_whole_dynamic_graphs_by_default(monkeypatch):
    """``compile_layers``' defaults are what the layers are tested with: inductor, dynamic sizes, ``fullgraph``
    (a graph break inside a layer is an error, not a silent split), no mode, torch.compile checked first on the
    device of the model's parameters; one torch.compile per layer class."""
    seen = []
    monkeypatch.setattr(STATE, "compiled_functions", {})
    monkeypatch.setattr(dispatch.torch, "compile", lambda fn, **options: seen.append((fn, options)) or fn)
    checked = []
    monkeypatch.setattr(dispatch.probe, "check_available", lambda device, backend: checked.append((device, backend)))
    model, _ = dev.build_model("transformer", TINY)
    compilation.compile_layers(copy.deepcopy(model), check=False)
    assert checked == []
    compilation.compile_layers(model.to("meta"))  # checked where its parameters are
    assert checked == [(torch.device("meta"), "inductor")]
    assert {fn.__qualname__ for fn, _ in seen} == {"TransformerEncoderLayerBase.forward",
                                                  "TransformerDecoderLayerBase.forward"}
    assert all(options == dict(backend="inductor", mode=None, dynamic=True, fullgraph=True) for _, options in seen)


def test_cudagraph_shape_cap_raises_inductors_shape_warning_limit_to_it():
    """With ``--compile-cudagraph-shapes N`` inductor's own warning about many recorded sizes comes at N, not at
    its lower default (the cap's warning says when a shape goes beyond); a higher limit, or none, is kept."""
    import torch._inductor.config as inductor_config

    for before, cap, after in ((8, 20, 20), (50, 20, 50), (20, 20, 20), (None, 20, None)):
        # (the config's own patch, which restores it, as in the test above)
        with inductor_config.patch({"triton.cudagraph_dynamic_shape_warn_limit": before}):
            dispatch._quiet_shape_warning(cap)
            assert inductor_config.triton.cudagraph_dynamic_shape_warn_limit == after, (before, cap)
