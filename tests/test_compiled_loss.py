"""The criterion's loss compiled under ``--compile`` (umst_plugin/compilation/loss.py).

* The compiled loss equals fairseq's eager ``LabelSmoothedCrossEntropyCriterion.compute_loss``: the loss, the NLL
  and the logits' gradient, with float32 logits and with bfloat16 ones (what ``--amp --amp-dtype bfloat16`` hands
  it), on padded batches, with and without label smoothing and ``--ignore-prefix-size``. fairseq's criterion
  computes in float32 whatever the logits' dtype (``utils.log_softmax(..., dtype=torch.float32)``), so float32 is
  the reference's own precision: float64 logits would be cast to it alike.
* Batches of other shapes run the same compiled program (dynamic sizes), and nothing falls back to eager.
* Where it applies: every family's model has plain log-probabilities (none runs the eager loss unnoticed); MSC's
  ``--encoder-l2`` in training, an adaptive softmax, another criterion or a subclass with its own ``compute_loss``
  keep fairseq's eager code.

fairseq's Trainer compiling the loss with the layers: tests/test_compile.py (the Trainer test); a whole
fairseq-train ``--compile`` run, its losses against the eager run's: tests/test_compile_stream.py.
"""
import copy

import pytest
import torch
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

import umst_plugin  # noqa: F401  (installs the patches)
from umst_dev import compiled_layers, dev
from umst_plugin.compilation import loss as compiled_loss
from umst_plugin.compilation.state import STATE

TINY = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
            decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2)
# Compiled against eager, in the suite's settings (tests/conftest.py: inductor's C++ without SIMD, one thread),
# measured over this file's batches. float32 logits: loss and NLL within 1.9e-7 relative; gradients within 1.6e-6
# of values up to 0.94 (label smoothing's gradient p - eps / (V - 1) cancels, and inductor's scalar exp and sums
# differ from eager's in the last bits). bfloat16 logits: losses within 1.4e-7 relative; gradients, float32 values
# rounded to bfloat16 by both, within 1.02 bfloat16 steps (2^-8 of the value: a rounding moved by those last
# bits). The bounds: four times the losses' and the float32 gradients', two steps for the bfloat16 ones.
LOSS_RTOL = 8e-7
F32_GRAD_ATOL = 6.4e-6
BF16_GRAD_STEPS = 2


@pytest.fixture(scope="module")
def transformer():
    model, task = dev.build_model("transformer", TINY)
    return model.eval(), task


def _sample(task, bsz, tgt_len, seed):
    return dev.random_sample(task, bsz, 5, tgt_len, seed=seed)


def _loss_and_grad(criterion, model, logits, sample, eager=False):
    """(loss, nll_loss, the logits' gradient): the criterion's compute_loss, compiled where compile_criterion made
    it so, or fairseq's own (``eager``)."""
    compute = LabelSmoothedCrossEntropyCriterion.compute_loss.__get__(criterion) if eager else criterion.compute_loss
    loss, nll = compute(model, (logits, {}), sample)
    return loss, nll, torch.autograd.grad(loss, logits)[0]


def _criterion(task, eps, prefix=0):
    return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=eps,
                                              ignore_prefix_size=prefix)


def _logits(sample, vocab, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    bsz, tgt_len = sample["target"].shape
    return (3 * torch.randn(bsz, tgt_len, vocab, generator=generator, dtype=torch.float64)).to(dtype) \
        .requires_grad_()


def _loss_programs():
    return compiled_layers.cache_entries(compiled_loss.LabelSmoothedLoss.forward)


def _loss_fallbacks():
    return [k for k in compiled_layers.eager_variants() if k[0] == "LabelSmoothedLoss.forward"]


@pytest.mark.parametrize("eps,prefix", [(0.1, 0), (0.0, 0), (0.1, 1)], ids=["eps0.1", "eps0", "prefix1"])
def test_compiled_loss_equals_fairseq_criterion(transformer, eps, prefix):
    model, task = transformer
    vocab = len(task.target_dictionary)
    criterion = _criterion(task, eps, prefix)
    assert compiled_loss.compile_criterion(criterion)
    programs = None
    for i, (bsz, tgt_len) in enumerate([(4, 9), (6, 13), (3, 5), (5, 21)]):
        sample = _sample(task, bsz, tgt_len, seed=i)
        assert (sample["target"] == task.target_dictionary.pad()).any()  # padded rows: left out of both sums
        logits = _logits(sample, vocab, torch.float32, seed=i)
        loss, nll, grad = _loss_and_grad(criterion, model, logits, sample)
        want_loss, want_nll, want_grad = _loss_and_grad(criterion, model, logits, sample, eager=True)
        assert loss.dtype == want_loss.dtype == torch.float32 and grad.dtype == torch.float32
        torch.testing.assert_close(loss, want_loss, rtol=LOSS_RTOL, atol=0)
        torch.testing.assert_close(nll, want_nll, rtol=LOSS_RTOL, atol=0)
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=F32_GRAD_ATOL)
        if programs is None:
            programs = _loss_programs()
            assert programs >= 1  # the compiled program ran
    assert _loss_programs() == programs  # other batch sizes and lengths: the same program
    assert not _loss_fallbacks()


def test_compiled_loss_with_bfloat16_logits_matches_eager_and_keeps_their_dtype(transformer):
    model, task = transformer
    vocab = len(task.target_dictionary)
    criterion = _criterion(task, 0.1)
    compiled_loss.compile_criterion(criterion)
    for i, (bsz, tgt_len) in enumerate([(4, 9), (7, 16)]):
        sample = _sample(task, bsz, tgt_len, seed=10 + i)
        logits = _logits(sample, vocab, torch.bfloat16, seed=10 + i)
        loss, nll, grad = _loss_and_grad(criterion, model, logits, sample)
        want_loss, want_nll, want_grad = _loss_and_grad(criterion, model, logits, sample, eager=True)
        assert loss.dtype == want_loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
        torch.testing.assert_close(loss, want_loss, rtol=LOSS_RTOL, atol=0)
        torch.testing.assert_close(nll, want_nll, rtol=LOSS_RTOL, atol=0)
        step = want_grad.float().abs().clamp_min(2 ** -126) * 2 ** -7  # a bfloat16 step at each value (8 bits)
        assert ((grad.float() - want_grad.float()).abs() <= BF16_GRAD_STEPS * step).all()
    assert not _loss_fallbacks()


def test_the_loss_is_compiled_for_label_smoothed_cross_entropy_only(transformer):
    _, task = transformer
    plain = CrossEntropyCriterion(task, sentence_avg=False)
    assert not compiled_loss.compile_criterion(plain)
    assert "compute_loss" not in plain.__dict__ and compiled_loss.LOSS_MODULE not in plain._modules

    class OwnLoss(LabelSmoothedCrossEntropyCriterion):
        def compute_loss(self, model, net_output, sample, reduce=True):
            return super().compute_loss(model, net_output, sample, reduce)

    assert not compiled_loss.compile_criterion(OwnLoss(task, False, 0.1))
    criterion = _criterion(task, 0.1)
    assert compiled_loss.compile_criterion(criterion) and compiled_loss.compile_criterion(criterion)  # once
    criterion.eval()
    assert not getattr(criterion, compiled_loss.LOSS_MODULE).training  # train() and eval() reach it
    assert not list(criterion.state_dict())  # nothing new in a checkpoint


MSC_TINY = {**{k: v for k, v in TINY.items() if k not in ("encoder_layers", "decoder_layers")},
            "encoder_blocks": 2, "encoder_layers_per_block": 1}
FAMILIES = [
    ("transformer", TINY),
    ("umst_base", TINY),
    ("umst_base_rpr", dict(TINY, max_relative_positions=4)),
    ("transformer_sf_base", dict(TINY, fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2)),
    ("msc_base", MSC_TINY),
    ("msmsa_base", dict(TINY, msmsa_scales="1,3", msmsa_min_block=2)),
    ("prime_base", dict(TINY, prime_kernels="3,7")),
    ("prime_simple_base", TINY),
]


@pytest.mark.parametrize("arch,overrides", FAMILIES, ids=[a for a, _ in FAMILIES])
def test_every_family_has_plain_log_probs(arch, overrides):
    """Every family's log-probabilities are the decoder's log-softmax: fairseq-train --compile compiles their loss
    (a model that added a term would silently keep the eager loss)."""
    model, _ = dev.build_model(arch, overrides)
    assert compiled_loss.plain_log_probs(model.train())
    wrapper = torch.nn.Module()  # as a distributed wrapper holds it (fairseq's and torch's: .module)
    wrapper.module = model
    assert compiled_loss.plain_log_probs(wrapper)


def test_a_model_whose_log_probs_add_a_term_keeps_the_eager_loss():
    msc, _ = dev.build_model("msc_base", dict(MSC_TINY, encoder_l2=1e-4))
    assert not compiled_loss.plain_log_probs(msc.train())  # the L2 penalty rides on the log-probabilities
    assert compiled_loss.plain_log_probs(msc.eval())
    adaptive, _ = dev.build_model("transformer", dict(TINY, adaptive_softmax_cutoff="20"))
    assert not compiled_loss.plain_log_probs(adaptive)


def test_a_model_or_decoder_that_replaces_fairseqs_log_probs_keeps_the_eager_loss(transformer):
    """A model class that overrides ``get_normalized_probs`` or its scriptable half (without saying, through
    ``plain_normalized_probs``, that its log-probabilities are still plain), or whose decoder is not a fairseq
    decoder, or one whose decoder overrides either, keeps the eager loss: the compiled loss would leave out what
    they add."""
    model, _ = transformer
    assert compiled_loss.plain_log_probs(model)

    def with_class(module, **methods):
        changed = copy.deepcopy(module)
        changed.__class__ = type("Changed" + type(module).__name__, (type(module),), methods)
        return changed

    def scaled(self, net_output, log_probs, sample=None):
        return super(type(self), self).get_normalized_probs(net_output, log_probs, sample) * 2

    def scaled_scriptable(self, net_output, log_probs, sample=None):
        return super(type(self), self).get_normalized_probs_scriptable(net_output, log_probs, sample) * 2

    assert not compiled_loss.plain_log_probs(with_class(model, get_normalized_probs=scaled))
    assert not compiled_loss.plain_log_probs(with_class(model, get_normalized_probs_scriptable=scaled_scriptable))
    for methods in (dict(get_normalized_probs=scaled), dict(get_normalized_probs_scriptable=scaled_scriptable)):
        changed = copy.deepcopy(model)
        changed.decoder = with_class(model.decoder, **methods)
        assert not compiled_loss.plain_log_probs(changed), methods
    changed = copy.deepcopy(model)
    changed.decoder = torch.nn.Linear(2, 2)  # not a FairseqDecoder
    assert not compiled_loss.plain_log_probs(changed)


def test_an_unreduced_loss_is_fairseqs_own(transformer):
    """``compute_loss(..., reduce=False)`` (per-token losses, as fairseq's sequence-level criteria ask) runs
    fairseq's eager code: the compiled loss only sums."""
    model, task = transformer
    criterion = _criterion(task, 0.1)
    assert compiled_loss.compile_criterion(criterion)
    sample = _sample(task, 3, 7, seed=5)
    logits = _logits(sample, len(task.target_dictionary), torch.float32, seed=5)
    loss, nll = criterion.compute_loss(model, (logits, {}), sample, reduce=False)
    want_loss, want_nll = LabelSmoothedCrossEntropyCriterion.compute_loss(criterion, model, (logits, {}), sample,
                                                                          reduce=False)
    assert loss.shape == want_loss.shape == (sample["target"].numel(), 1)  # one loss per target token
    assert torch.equal(loss, want_loss) and torch.equal(nll, want_nll)


def test_the_compiled_loss_state_is_per_process_not_per_criterion(transformer):
    """Two criteria share one compiled program (one class's forward), as layers of a class do."""
    _, task = transformer
    first, second = _criterion(task, 0.1), _criterion(task, 0.1)
    compiled_loss.compile_criterion(first)
    compiled_loss.compile_criterion(second)
    one = getattr(first, compiled_loss.LOSS_MODULE)._umst_compiled[0]
    assert one is getattr(second, compiled_loss.LOSS_MODULE)._umst_compiled[0]
    assert any(key[0] is compiled_loss.LabelSmoothedLoss.forward for key in STATE.compiled_functions)
