"""fairseq's transformer decoder asked the device, on every call, whether the target batch has padding, and gave
its layers no self-attention padding mask when it had none (umst_plugin/patches/decoder_padding_mask.py): a
host-device sync per call in training, and under --compile a recompile of the layer at the first batch without
target padding. The patched decoder builds the mask every time without an incremental state, with the original's
outputs; incremental decoding is fairseq's."""
import pytest
import torch

import umst_plugin  # noqa: F401  (installs the patch)
from model_checks import KeywordSeen
from fairseq.models.transformer.transformer_decoder import TransformerDecoderBase
from umst_dev import dev
from umst_dev.op_counts import HostSyncs
from umst_plugin.patches import installed, original

SMALL = dict(encoder_layers=1, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
             decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2, dropout=0.1,
             attention_dropout=0.1, activation_dropout=0.1)
PATCHED = TransformerDecoderBase.extract_features_scriptable
FAIRSEQ = original(PATCHED)


def test_the_patch_is_installed_on_fairseqs_decoder():
    assert installed(PATCHED, "umst_plugin.patches.decoder_padding_mask")


@pytest.fixture(scope="module")
def model():
    model, task = dev.build_model("transformer", SMALL)
    return model, task.target_dictionary.pad()


def inputs(model, pad, dtype=torch.float32):
    torch.manual_seed(0)
    src = torch.randint(4, 50, (3, 6))
    src[0, :2] = pad
    without = torch.randint(4, 50, (3, 5))
    padded = without.clone()
    padded[1, 3:] = pad  # fairseq pads targets on the right
    encoder_out = model.encoder(src, torch.full((3,), 6))
    return encoder_out, (without, padded)


def _same(got, want, what):
    (x, extra), (x_want, extra_want) = got, want
    assert torch.equal(x, x_want), what
    assert len(extra["inner_states"]) == len(extra_want["inner_states"]), what
    assert all(torch.equal(a, b) for a, b in zip(extra["inner_states"], extra_want["inner_states"])), what
    attn, attn_want = extra["attn"][0], extra_want["attn"][0]
    assert (attn is None and attn_want is None) or torch.equal(attn, attn_want), what


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train with dropout"])
def test_outputs_equal_fairseqs_with_and_without_padding(model, train):
    net, pad = model
    net.train(train)
    for dtype in (torch.float64, torch.float32):
        net.to(dtype)
        encoder_out, targets = inputs(net, pad)
        for prev in targets:
            torch.manual_seed(5)
            want = FAIRSEQ(net.decoder, prev, encoder_out)
            torch.manual_seed(5)
            got = PATCHED(net.decoder, prev, encoder_out)
            _same(got, want, (dtype, bool(prev.eq(pad).any())))
    net.float().train()


def test_incremental_decoding_is_fairseqs(model):
    net, pad = model
    net.eval()
    encoder_out, (prev, _) = inputs(net, pad)
    with torch.no_grad():
        for step in range(1, prev.size(1) + 1):
            if step == 1:
                ours, theirs = {}, {}
            got, _ = PATCHED(net.decoder, prev[:, :step], encoder_out, incremental_state=ours)
            want, _ = FAIRSEQ(net.decoder, prev[:, :step], encoder_out, incremental_state=theirs)
            assert torch.equal(got, want), step
    net.train()


def test_no_host_sync_in_a_training_call(model):
    net, pad = model
    encoder_out, targets = inputs(net, pad)
    for prev in targets:
        with HostSyncs() as ours:
            PATCHED(net.decoder, prev, encoder_out)
        with HostSyncs() as fairseqs:
            FAIRSEQ(net.decoder, prev, encoder_out)
        assert not ours.locations, dict(ours.locations)
        assert sum(fairseqs.locations.values()) == 1  # what it removes: the padding test, once per call


def test_every_layer_gets_a_mask_tensor_also_without_padding(model):
    net, pad = model
    encoder_out, targets = inputs(net, pad)
    with KeywordSeen(net.decoder.layers, "self_attn_padding_mask") as masks:
        for prev in targets:
            net.decoder(prev, encoder_out=encoder_out)
    seen = masks.seen
    assert len(seen) == 2 * len(net.decoder.layers)
    assert all(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool for mask in seen)
    assert not seen[0].any() and seen[-1].any()  # the batch without padding, then the padded one


def test_alignment_options_and_missing_encoder_outputs_are_fairseqs(model):
    """The rest of fairseq's decoder contract, as fairseq's own: the attention of the layer ``alignment_layer``
    names (not the last layer's), cut to ``alignment_heads``; an encoder output without a padding mask (an empty
    list); a decoder without cross-attention (a language model's) given no encoder output, or an empty one."""
    from fairseq.models.transformer.transformer_decoder import TransformerDecoderBase

    net, pad = model
    for train in (False, True):
        net.train(train)
        encoder_out, (_, prev) = inputs(net, pad)
        for alignment in (dict(alignment_layer=0), dict(alignment_heads=1), dict(alignment_layer=0, alignment_heads=1)):
            torch.manual_seed(5)
            want = FAIRSEQ(net.decoder, prev, encoder_out, **alignment)
            torch.manual_seed(5)
            _same(PATCHED(net.decoder, prev, encoder_out, **alignment), want, (train, alignment))
        unmasked = dict(encoder_out, encoder_padding_mask=[])
        torch.manual_seed(5)
        want = FAIRSEQ(net.decoder, prev, unmasked)
        torch.manual_seed(5)
        _same(PATCHED(net.decoder, prev, unmasked), want, (train, "no padding mask"))
    torch.manual_seed(0)
    language_model = TransformerDecoderBase(net.decoder.cfg, net.decoder.dictionary, net.decoder.embed_tokens,
                                            no_encoder_attn=True).eval()
    _same(PATCHED(language_model, prev, None), FAIRSEQ(language_model, prev, None), "no encoder")
    empty = {"encoder_out": [], "encoder_padding_mask": []}
    _same(PATCHED(language_model, prev, empty), FAIRSEQ(language_model, prev, empty), "empty encoder output")
    net.train()
