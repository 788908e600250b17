"""fairseq's transformer encoder asked the device, per layer, whether the batch has padding, and gave its layers no
mask when it had none (umst_plugin/patches/encoder_padding_mask.py): a host-device sync per layer, and under
--compile a recompile of the layer at the first batch without source padding. The patched encoder passes the mask
every time, with the original's outputs."""
import pytest
import torch

import umst_plugin  # noqa: F401  (installs the patch)
from model_checks import KeywordSeen
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from umst_dev import dev
from umst_dev.op_counts import HostSyncs
from umst_plugin.patches import installed, original

SMALL = dict(encoder_layers=2, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
             decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2, dropout=0.1,
             attention_dropout=0.1, activation_dropout=0.1)
PATCHED = TransformerEncoderBase.forward_scriptable
FAIRSEQ = original(PATCHED)


def batches(pad):
    torch.manual_seed(0)
    without = torch.randint(4, 50, (3, 7))
    padded = without.clone()
    padded[0, :2] = pad  # fairseq pads sources on the left
    return without, padded


@pytest.fixture(scope="module")
def encoder():
    model, task = dev.build_model("transformer", SMALL)
    return model.encoder, task.source_dictionary.pad()


def test_the_patch_is_installed_on_fairseqs_encoder():
    assert installed(PATCHED, "umst_plugin.patches.encoder_padding_mask")


def _same(got, want, what):
    for key in ("encoder_out", "encoder_padding_mask", "encoder_embedding", "encoder_states", "fc_results",
                "src_lengths"):
        assert len(got[key]) == len(want[key]), (key, what)
        for a, b in zip(got[key], want[key]):
            assert (a is None and b is None) or torch.equal(a, b), (key, what)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train with dropout"])
def test_outputs_equal_fairseqs_with_and_without_padding(encoder, train):
    """Bit for bit, float64 and float32, every hidden state, the same dropout masks at the same seed."""
    module, pad = encoder
    module.train(train)
    for dtype in (torch.float64, torch.float32):
        module.to(dtype)
        for src in batches(pad):
            torch.manual_seed(5)
            want = FAIRSEQ(module, src, return_all_hiddens=True)
            torch.manual_seed(5)
            got = PATCHED(module, src, return_all_hiddens=True)
            _same(got, want, (dtype, bool(src.eq(pad).any())))
    module.float().train()


def test_no_host_sync_in_the_encoder(encoder):
    module, pad = encoder
    for src in batches(pad):
        with HostSyncs() as ours:
            PATCHED(module, src)
        with HostSyncs() as fairseqs:
            FAIRSEQ(module, src)
        assert not ours.locations, dict(ours.locations)
        assert sum(fairseqs.locations.values()) == len(module.layers)  # what it removes: one per layer


def test_every_layer_gets_a_mask_tensor_also_without_padding(encoder):
    """What --compile guards on: the layer's inputs keep their types (a None mask compiled the layer again)."""
    module, pad = encoder
    with KeywordSeen(module.layers, "encoder_padding_mask") as masks:
        for src in batches(pad):
            module(src, torch.full((3,), 7))
    seen = masks.seen
    assert len(seen) == 2 * len(module.layers)
    assert all(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool for mask in seen)
    assert not seen[0].any() and seen[-1].any()  # the batch without padding, then the padded one


def test_outputs_equal_fairseqs_by_default_for_layers_that_return_their_fc_output_and_for_two_tokens(encoder):
    """The rest of fairseq's encoder contract, as fairseq's own: without ``return_all_hiddens`` (its default) no
    hidden states are kept; layers built with ``return_fc`` (a layer returning ``(x, fc_result)``) give their FFN
    outputs in ``fc_results``; and a source of two tokens, whose states are a tensor of length 2, is not taken for
    such a pair."""
    import copy

    module, pad = encoder
    module.eval()
    returning_fc = copy.deepcopy(module)
    for layer in returning_fc.layers:
        layer.return_fc = True
    for enc, src in ((module, batches(pad)[1]), (module, batches(pad)[1][:, -2:]),
                     (returning_fc, batches(pad)[1])):
        for kwargs in ({}, {"return_all_hiddens": True}):
            got, want = PATCHED(enc, src, **kwargs), FAIRSEQ(enc, src, **kwargs)
            _same(got, want, (tuple(src.shape), kwargs, enc is returning_fc))
            assert len(got["encoder_states"]) == (len(enc.layers) + 1 if kwargs else 0)
            if enc is returning_fc and kwargs:
                assert all(fc is not None and fc.shape[-1] == 16 for fc in got["fc_results"])
    module.train()
