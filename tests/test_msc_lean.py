"""MSC's lean path (umst_plugin/modules/msc/lean.py; the default) equals the reference form it replaced
(``use_reference_path``: fairseq's attention modules one by one, per-layer masks and cross keys/values, fairseq's
incremental state), and launches fewer kernels:

* float64, padded batches (sources padded left and right, targets right), training mode with every dropout on
  (residual, activation, embedding: the same masks from the same random state; attention: the same masks
  injected into both paths, since one fused call of 2H heads draws differently from two calls of H): decoder
  outputs, the attention returned for alignment and the gradients of every parameter are equal, for every
  ablation; and in eval with autograd (no injection);
* incremental decoding on the lean cache equals full decoding and the reference form's incremental decoding,
  through beam reorders (rows repeated and dropped), the cache growing past its first capacity, a padded
  prefix, fairseq's beamable cross-attention (``set_beam_size``) and a whole SequenceGenerator beam search;
* the encoder's stacked states: reorder = reordering each list; lists edited by a caller win over the stack;
* a layer called alone builds its own masks and cross keys/values and equals its reference form;
* no host sync in the lean forward and backward nor in a decoding step; kernel launch guards.
"""
import copy

import pytest
import torch

import umst_plugin  # noqa: F401
from umst_dev import dev
from umst_plugin.models.msc.encoder import stacked_states
from umst_plugin.modules.msc import lean
from umst_plugin.modules.common.lean_ops import use_reference_path
from umst_dev.op_counts import HostSyncs, KernelLaunches

TINY = dict(encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_blocks=3, encoder_layers_per_block=2)
DROPOUT = dict(dropout=0.2, attention_dropout=0.3, activation_dropout=0.25)
ABLATIONS = {
    "full": {},
    "add": dict(msc_fusion="add"),
    "ffn_cell": dict(context_cell="ffn"),
    "no_ctx_attn": dict(no_context_attention=True),
    "no_ctx_collab": dict(no_contextual_collaboration=True),
    "no_block_collab": dict(no_block_collaboration=True),
    "plain": dict(no_block_collaboration=True, no_contextual_collaboration=True),
}


def build(overrides=None, arch="msc_iwslt_de_en", dtype=torch.float64):
    model, task = dev.build_model(arch, {**TINY, **(overrides or {})})
    return model.to(dtype), task


# fairseq's attention keeps float64 in these comparisons (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("float64_softmax")


def pair(overrides=None, **kw):
    """(lean model, reference model with the same weights, task)."""
    model, task = build(overrides, **kw)
    ref = use_reference_path(copy.deepcopy(model))
    return model, ref, task


def batch(task, bsz=5, src_len=9, tgt_len=7, left_pad=True, seed=0):
    sample = dev.random_sample(task, bsz, src_len, tgt_len, seed=seed, left_pad_source=left_pad)
    return task._strip_side_inputs(sample, []) if hasattr(task, "_strip_side_inputs") else sample


def net_input(sample):
    return {k: v for k, v in sample["net_input"].items() if not k.startswith("src_word")}


# ---- injected attention dropout ----------------------------------------------------------------------------

class MaskQueue:
    """Attention dropout masks, the i-th drawn from a generator seeded i, one per attention of H heads in call
    order: the reference's modules take one each, the lean path's fused call of 2H heads two."""

    def __init__(self, heads):
        self.heads, self.calls = heads, 0

    def take(self, shape, p, dtype):
        g = torch.Generator().manual_seed(1000 + self.calls)
        self.calls += 1
        return (torch.rand(shape, generator=g, dtype=torch.float64) >= p).to(dtype) / (1 - p)


def inject(monkeypatch, model, ref, heads):
    """Both paths' attention dropout drawn from one MaskQueue each (the same sequence)."""
    lean_queue, ref_queue = MaskQueue(heads), MaskQueue(heads)

    def attend(q, k, v, mask, dropout_p, scale):
        probs = torch.softmax(torch.matmul(q * scale, k.transpose(-1, -2)) + (0 if mask is None else mask), -1)
        if dropout_p > 0:
            bsz, n_heads, tgt_len, src_len = probs.shape
            masks = [lean_queue.take((bsz, heads, tgt_len, src_len), dropout_p, probs.dtype)
                     for _ in range(n_heads // heads)]
            probs = probs * torch.cat(masks, dim=1)
        return torch.matmul(probs, v)

    monkeypatch.setattr(lean, "attend", attend)

    class Injected(torch.nn.Module):
        def __init__(self, p):
            super().__init__()
            self.p = p

        def forward(self, probs):  # fairseq's (B*H) x T x S probabilities
            if not (self.training and self.p > 0):
                return probs
            bh, tgt_len, src_len = probs.shape
            keep = ref_queue.take((bh // heads, heads, tgt_len, src_len), self.p, probs.dtype)
            return probs * keep.view(bh, tgt_len, src_len)

    from fairseq.modules import MultiheadAttention
    for m in ref.modules():
        if isinstance(m, MultiheadAttention):
            m.skip_embed_dim_check = True  # fairseq's own explicit path (it takes the dropout module)
            m.dropout_module = Injected(m.dropout_module.p)
    return lean_queue, ref_queue


def run(model, sample, seed=7):
    torch.manual_seed(seed)
    out, extra = model(**net_input(sample))
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    loss = (out * weights).sum() + extra["attn"][0].sum()
    loss.backward()
    return out.detach(), extra["attn"][0].detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_same(model, ref, sample, atol=1e-10):
    out, attn, grads = run(model, sample)
    ref_out, ref_attn, ref_grads = run(ref, sample)
    torch.testing.assert_close(out, ref_out, atol=atol, rtol=1e-9)
    torch.testing.assert_close(attn, ref_attn, atol=atol, rtol=1e-9)
    for name, g in ref_grads.items():
        if g is None:
            assert grads[name] is None or not grads[name].any(), name
            continue
        assert grads[name] is not None, name
        torch.testing.assert_close(grads[name], g, atol=atol, rtol=1e-8, msg=lambda m: f"{name}: {m}")


# ---- training and eval: lean == reference ------------------------------------------------------------------

@pytest.mark.parametrize("left_pad", [True, False], ids=["left-pad", "right-pad"])
@pytest.mark.parametrize("name", list(ABLATIONS))
def test_training_with_dropout_equals_reference(name, left_pad, monkeypatch):
    model, ref, task = pair({**ABLATIONS[name], **DROPOUT})
    model.train(), ref.train()
    lean_queue, ref_queue = inject(monkeypatch, model, ref, heads=2)
    sample = batch(task, left_pad=left_pad)
    assert sample["net_input"]["src_tokens"].eq(1).any() and sample["net_input"]["prev_output_tokens"].eq(1).any()
    assert_same(model, ref, sample)
    assert lean_queue.calls == ref_queue.calls > 0


@pytest.mark.parametrize("name", ["full", "add", "no_ctx_collab"])
def test_eval_with_autograd_equals_reference(name):
    """No injection: the lean path's real fused attention (dropout off in eval)."""
    model, ref, task = pair({**ABLATIONS[name], **DROPOUT})
    model.eval(), ref.eval()
    assert_same(model, ref, batch(task, seed=1))


def test_injected_attention_equals_the_real_one_without_dropout():
    """The test's attention (used above) is the fused call's math."""
    q, k, v = (torch.randn(3, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    mask = lean.key_mask(torch.tensor([[False] * 5, [True] + [False] * 4, [True, True] + [False] * 3]),
                         torch.float64)
    got = lean.attend(q, k, v, mask, 0.0, 8 ** -0.5)
    probs = lean.attention_probs(q, k, mask, 8 ** -0.5)
    torch.testing.assert_close(got, probs @ v)


def test_gate_is_recorded_as_before():
    """umst-inspect's gate record: one T x B x C gate per gated layer forward, equal to the reference's."""
    model, ref, task = pair()
    model.eval(), ref.eval()
    sample = batch(task)
    records = []
    for m in (model, ref):
        store = []
        m.encoder.layers[0].fusion.record = store
        with torch.no_grad():
            m(**net_input(sample))
        m.encoder.layers[0].fusion.record = None
        records.append(store)
    assert len(records[0]) == len(records[1]) == 1
    torch.testing.assert_close(records[0][0], records[1][0])


# ---- incremental decoding ----------------------------------------------------------------------------------

def decode(model, enc, prev, steps, reorders=(), beam_size=None):
    """Step by step: (last-position outputs of each step, alignment attention of each step); ``reorders``:
    {step: order} applied before that step."""
    reorders = dict(reorders)
    state, outs, attns = {}, [], []
    if beam_size is not None:
        model.decoder.set_beam_size(beam_size)
    for t in range(steps):
        if t in reorders:
            order = reorders[t]
            model.decoder.reorder_incremental_state_scripting(state, order)
            enc = model.encoder.reorder_encoder_out(enc, order)
            prev = prev[order]
        out, extra = model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
        outs.append(out[:, -1])
        attns.append(extra["attn"][0][:, -1])
    return outs, attns, state


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_incremental_equals_full_and_reference(name):
    model, ref, task = pair(ABLATIONS[name])
    model.eval(), ref.eval()
    sample = batch(task, tgt_len=7)
    prev = sample["net_input"]["prev_output_tokens"]
    prev = prev.masked_fill(prev.eq(1), 5)  # no padding inside the prefixes
    with torch.no_grad():
        enc, ref_enc = model.encoder(**dev.encoder_inputs(model, sample)), ref.encoder(
            **dev.encoder_inputs(ref, sample))
        assert stacked_states(enc) is not None and stacked_states(ref_enc) is None
        full, extra = model.decoder(prev, encoder_out=enc)
        outs, attns, state = decode(model, enc, prev, prev.size(1))
        ref_outs, ref_attns, _ = decode(ref, ref_enc, prev, prev.size(1))
    assert any(k.endswith("msc_lean") for k in state)
    for t in range(prev.size(1)):
        torch.testing.assert_close(outs[t], full[:, t], atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(outs[t], ref_outs[t], atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(attns[t], extra["attn"][0][:, t], atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(attns[t], ref_attns[t], atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("beam_size", [None, 2], ids=["per-row", "beamable"])
def test_incremental_with_reorders_growth_and_padded_prefix(beam_size):
    """20 steps (the cache grows past its first 16 positions), a pad token inside the prefixes, beam reorders
    within sentences (the cross part kept) and across the batch (a sentence dropped, rows repeated): lean ==
    reference, step by step."""
    model, ref, task = pair(ABLATIONS["full"])
    model.eval(), ref.eval()
    sample = batch(task, bsz=3, tgt_len=20)
    prev = sample["net_input"]["prev_output_tokens"]
    prev = prev.masked_fill(prev.eq(1), 5)
    prev[1, 4] = 1  # a padded position inside a prefix: the self-attention mask of the cache
    # two hypotheses per sentence, in beam layout (rows 2s, 2s+1 of sentence s)
    expand = torch.arange(3).repeat_interleave(2)
    src = {k: v[expand] for k, v in dev.encoder_inputs(model, sample).items()}
    prev = prev[expand]
    reorders = {5: torch.tensor([1, 1, 2, 3, 5, 4]),  # within sentences (same size)
                11: torch.tensor([0, 1, 4, 5]),  # sentence 2 done: the batch shrinks
                17: torch.tensor([1, 0, 3, 2])}
    with torch.no_grad():
        enc, ref_enc = model.encoder(**src), ref.encoder(**src)
        outs, attns, state = decode(model, enc, prev, 20, reorders, beam_size)
        ref_outs, ref_attns, _ = decode(ref, ref_enc, prev, 20, reorders, beam_size)
    cache = next(v for k, v in state.items() if k.endswith("msc_lean"))
    assert cache["meta"].capacity == 32 and cache["meta"].beam == (beam_size or 1)
    assert cache["cross"].size(0) == 4 // (beam_size or 1)
    for t in range(20):
        torch.testing.assert_close(outs[t], ref_outs[t], atol=1e-10, rtol=1e-9, msg=lambda m: f"step {t}: {m}")
        torch.testing.assert_close(attns[t], ref_attns[t], atol=1e-10, rtol=1e-9)


def test_beam_search_generates_the_same_hypotheses():
    """fairseq's SequenceGenerator (beam 3, beamable cross-attention): the same tokens, scores, alignments."""
    from fairseq.sequence_generator import SequenceGenerator

    model, ref, task = pair()
    model.eval(), ref.eval()
    sample = dev.random_sample(task, 4, 8, 6, seed=2)
    hypos = []
    for m in (model, ref):
        generator = SequenceGenerator([m], task.target_dictionary, beam_size=3, max_len_b=12)
        with torch.no_grad():
            hypos.append(generator.generate([m], {"net_input": dev.encoder_inputs(m, sample)}))
    for a, b in zip(*hypos):
        assert len(a) == len(b) == 3
        for x, y in zip(a, b):
            assert torch.equal(x["tokens"], y["tokens"])
            torch.testing.assert_close(x["score"], y["score"])
            torch.testing.assert_close(x["positional_scores"], y["positional_scores"])
            torch.testing.assert_close(x["attention"], y["attention"])


def test_incremental_decoding_with_autograd_keeps_the_reference_state():
    """With autograd on, the lean cache (written in place) is not used: fairseq's attention state is."""
    model, task = build()
    model.eval()
    sample = batch(task)
    prev = sample["net_input"]["prev_output_tokens"]
    enc = model.encoder(**dev.encoder_inputs(model, sample))
    state = {}
    model.decoder(prev[:, :1], encoder_out=enc, incremental_state=state)
    out = model.decoder(prev[:, :2], encoder_out=enc, incremental_state=state)[0]
    assert not any(k.endswith("msc_lean") for k in state)
    out.sum().backward()
    with torch.no_grad():
        full = model.decoder(prev[:, :2], encoder_out=enc)[0]
    torch.testing.assert_close(out[:, -1], full[:, -1])


# ---- the encoder's stacked states --------------------------------------------------------------------------

def test_stacked_states_reorder_and_edited_lists():
    model, task = build()
    model.eval()
    sample = batch(task)
    with torch.no_grad():
        enc = model.encoder(**dev.encoder_inputs(model, sample))
    states = stacked_states(enc)
    assert states is not None and states.shape[0] == 6
    order = torch.tensor([2, 0, 0, 4])
    re = model.encoder.reorder_encoder_out(enc, order)
    assert stacked_states(re) is not None
    for key in ("encoder_out", "msc_block_out", "msc_context"):
        for a, b in zip(enc[key], re[key]):
            assert torch.equal(a[:, order], b)
    assert torch.equal(re["encoder_out"][0], re["msc_block_out"][-1])
    edited = dict(enc, msc_block_out=[torch.zeros_like(enc["msc_block_out"][0])] + enc["msc_block_out"][1:])
    assert stacked_states(edited) is None
    re = model.encoder.reorder_encoder_out(edited, order)
    assert not re["msc_block_out"][0].any()
    # an entry replaced by a view at the same address, of other sizes (its first two time steps): the lists hold
    # the truth
    first_steps = enc["msc_context"][0][:2]
    assert first_steps.data_ptr() == enc["msc_context"][0].data_ptr()
    narrowed = dict(enc, msc_context=[first_steps] + enc["msc_context"][1:])
    assert stacked_states(narrowed) is None
    re = model.encoder.reorder_encoder_out(narrowed, order)
    assert torch.equal(re["msc_context"][0], first_steps[:, order])


# ---- syncs and launches --------------------------------------------------------------------------------------

def test_no_host_sync_in_training_and_decoding():
    model, task = build(DROPOUT, dtype=torch.float32)
    sample = batch(task)
    model.train()
    with HostSyncs() as syncs:
        out = model(**net_input(sample))[0]
        out.sum().backward()
    model.eval()
    prev = sample["net_input"]["prev_output_tokens"]
    with torch.no_grad(), HostSyncs() as step_syncs:
        enc = model.encoder(**dev.encoder_inputs(model, sample))
        state = {}
        for t in range(3):
            model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
            model.decoder.reorder_incremental_state_scripting(state, torch.arange(prev.size(0)).flip(0))
    plugin = lambda locs: {k: v for k, v in locs.items() if "umst_plugin" in k}  # noqa: E731
    assert not plugin(syncs.locations), syncs.locations
    assert not plugin(step_syncs.locations), step_syncs.locations


def _step_launches(model, sample, beam=2):
    from benchmarks.bench_decode import step_launches
    return step_launches(model, None, sample, beam)


def test_decoding_step_launches():
    """One later beam step (bench_decode's count; 3 layers): the lean cache's reorder is one index_select on top
    of the encoder output's four, the decoder step 23 launches a layer + 7 (measured 5 + 76; the reference form
    19 + 153)."""
    from benchmarks import bench_decode

    model, task = build(dict(encoder_blocks=3, encoder_layers_per_block=1), dtype=torch.float32)
    ref = use_reference_path(copy.deepcopy(model))
    sample = dev.random_sample(task, 4, 8, 8, seed=1)
    counts = {name: bench_decode.step_launches(m.eval(), task, sample, 3) for name, m in
              (("lean", model), ("reference", ref))}
    assert counts["lean"]["reorder"] == 5, counts
    assert counts["lean"]["decoder"] <= 80, counts
    assert counts["lean"]["total"] < 0.5 * counts["reference"]["total"], counts


def test_training_launches():
    """One forward + backward (fp32, training, dropout on; 3 x 2 encoder layers, 3 decoder layers): the lean
    path launches fewer kernels than the reference (measured 1,171 against 1,570; on a CPU each attention with
    dropout is ~30 launches of torch's math path, recomputed in backward, which a GPU runs as 2-3 kernels)."""
    model, task = build(DROPOUT, dtype=torch.float32)
    ref = use_reference_path(copy.deepcopy(model))
    sample = batch(task)
    totals = {}
    for name, m in (("lean", model), ("reference", ref)):
        m.train()
        with KernelLaunches() as k:
            m(**net_input(sample))[0].sum().backward()
        totals[name] = k.total
    assert totals["lean"] < 0.8 * totals["reference"], totals


# ---- a layer called alone ----------------------------------------------------------------------------------

def _layer_inputs(seed=3, tgt_len=6, src_len=7, bsz=3, dim=16):
    """x (target), memory, context; the source padded left, the target right (no row wholly padded)."""
    g = torch.Generator().manual_seed(seed)
    x, memory, context = (torch.randn(n, bsz, dim, generator=g, dtype=torch.float64)
                          for n in (tgt_len, src_len, src_len))
    src_pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    src_pad[1, :2] = src_pad[2, :4] = True
    tgt_pad = torch.zeros(bsz, tgt_len, dtype=torch.bool)
    tgt_pad[1, -2:] = True
    return x, memory, context, src_pad, tgt_pad


def _calls_of(module):
    calls = []
    module.register_forward_hook(lambda *args: calls.append(1))
    return calls


@pytest.mark.parametrize("context_attention", [True, False], ids=["context", "no-context"])
def test_a_layer_called_alone_builds_its_masks_and_keys_and_equals_its_reference_form(context_attention):
    """The encoder and decoder build their layers' masks and cross keys/values once per stack and pass them in. A
    layer called alone (a stack of one's own, ``umst-inspect``) builds them from the padding masks it is given,
    for every combination of causal and padding masks, and equals its reference form; its attention over the
    memory is returned as fairseq's decoder layer returns it (averaged over heads, in eval only unless asked);
    ``layer.reference`` and fairseq's incremental state without the lean step take the reference form."""
    from umst_plugin.modules.msc.layer import MSCDecoderLayer, MSCEncoderLayer

    assert MSCEncoderLayer(16, 32, 2).fusion.mode == "gate"  # by default the paper's layer: context attention, gate
    torch.manual_seed(0)
    kw = dict(dropout=0.0, context_attention=context_attention)
    encoder_layer = MSCEncoderLayer(16, 32, 2, **kw).double().eval()
    decoder_layer = MSCDecoderLayer(16, 32, 2, **kw).double().eval()
    x, memory, context, src_pad, tgt_pad = _layer_inputs()
    context = context if context_attention else None
    future = torch.triu(torch.full((x.size(0), x.size(0)), float("-inf"), dtype=torch.float64), 1)
    close = dict(atol=1e-10, rtol=1e-9)
    with torch.no_grad():
        for pad in (src_pad, None):
            want = encoder_layer.reference_forward(memory, pad, context)
            torch.testing.assert_close(encoder_layer(memory, pad, context), want, **close)
        assert not torch.allclose(want, encoder_layer.reference_forward(memory, src_pad, context))

        for self_mask, self_pad, cross_pad in ((future, tgt_pad, src_pad), (future, None, src_pad),
                                               (None, tgt_pad, src_pad), (future, tgt_pad, None)):
            got, attn = decoder_layer(x, memory, cross_pad, context, self_attn_mask=self_mask,
                                      self_attn_padding_mask=self_pad)
            want, want_attn = decoder_layer.reference_forward(x, memory, cross_pad, context, self_attn_mask=self_mask,
                                                              self_attn_padding_mask=self_pad)
            torch.testing.assert_close(got, want, **close)
            assert attn is not None and attn.shape == (x.size(1), x.size(0), memory.size(0))  # B x T x S
            torch.testing.assert_close(attn, want_attn, **close)
        heads = decoder_layer(x, memory, src_pad, context, self_attn_mask=future, need_head_weights=True)[1]
        assert heads.shape == (2, x.size(1), x.size(0), memory.size(0))
        torch.testing.assert_close(heads.mean(0), decoder_layer(x, memory, src_pad, context,
                                                                self_attn_mask=future)[1], **close)

        decoder_layer.train()  # (no dropout: the same numbers) no attention returned in training unless asked
        for forward in (decoder_layer, decoder_layer.reference_forward):
            assert forward(x, memory, src_pad, context, self_attn_mask=future)[1] is None
            assert forward(x, memory, src_pad, context, self_attn_mask=future, need_attn=True)[1] is not None
            assert forward(x, memory, src_pad, context, self_attn_mask=future,
                           need_head_weights=True)[1].shape == heads.shape
        decoder_layer.eval()
        decoder_layer.make_generation_fast_()  # (fairseq's default before a search: no alignment wanted)
        assert decoder_layer(x, memory, src_pad, context, self_attn_mask=future)[1] is None
        decoder_layer.make_generation_fast_(need_attn=True)

        # fairseq's incremental state (no lean step): the reference form, step by step = the whole target
        state, steps = {}, []
        for t in range(x.size(0)):
            steps.append(decoder_layer(x[t:t + 1], memory, src_pad, context, incremental_state=state)[0])
        assert len(state) > 0
        torch.testing.assert_close(torch.cat(steps), decoder_layer(x, memory, src_pad, context,
                                                                   self_attn_mask=future)[0], **close)

        # layer.reference: fairseq's attention modules are called (the lean path reads their weights only)
        for layer, args in ((encoder_layer, (memory, src_pad, context)), (decoder_layer, (x, memory, src_pad,
                                                                                          context))):
            calls = _calls_of(layer.self_attn)
            layer(*args)
            assert not calls
            layer.reference = True
            layer(*args)
            assert len(calls) == 1
            layer.reference = False

    if context_attention:
        with pytest.raises(ValueError, match="pass `context`"):
            decoder_layer(x, memory, src_pad, None)
        with pytest.raises(ValueError, match="pass `context`"):
            encoder_layer(memory, src_pad, None)
