"""Every registered architecture's widths, heads and depth where the user sets none: the papers' settings
(umst_plugin/models/_sizes.py and each family's registrations), and a flag the user set wins."""
from types import SimpleNamespace

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY

import umst_plugin  # noqa: F401  (registers the architectures)
from umst_tools.batch_table import arch_args

# arch: (embed, FFN, heads) on both sides, encoder / decoder layers, residual dropout
SIZES = {
    "umst_base": (512, 2048, 8, 6, 6, 0.1), "umst_base_rpr": (512, 2048, 8, 6, 6, 0.1),
    "umst_big": (1024, 4096, 16, 6, 6, 0.3), "umst_big_rpr": (1024, 4096, 16, 6, 6, 0.3),
    "umst_iwslt_de_en": (512, 1024, 4, 6, 6, 0.1),
    "transformer_sf_base": (512, 2048, 8, 6, 6, 0.1), "transformer_sf_big": (1024, 4096, 16, 6, 6, 0.3),
    "transformer_sf_fast_only_base": (512, 2048, 8, 6, 6, 0.1),
    "transformer_sf_fast_only_big": (1024, 4096, 16, 6, 6, 0.3),
    "msc": (512, 2048, 8, 6, 6, 0.1), "msc_base": (512, 2048, 8, 6, 6, 0.1), "msc_big": (1024, 4096, 16, 6, 6, 0.3),
    "msc_iwslt_de_en": (256, 512, 4, 6, 6, 0.1),
    "msmsa_base": (512, 2048, 8, 6, 6, 0.1), "msmsa_big": (1024, 4096, 16, 6, 6, 0.3),
    "prime_base": (384, 768, 4, 12, 12, 0.4), "prime_big": (768, 3072, 16, 12, 12, 0.3),
    "prime_simple_base": (384, 768, 4, 12, 12, 0.4), "prime_simple_big": (768, 3072, 16, 12, 12, 0.3),
}


def _defaults(arch, **flags):
    """The arch's arguments as fairseq's architecture function builds them from ``flags``."""
    return SimpleNamespace(**arch_args(arch, flags))


def test_every_plugin_architecture_is_listed():
    assert sorted(a for a, f in ARCH_CONFIG_REGISTRY.items() if f.__module__.startswith("umst_plugin")) == \
        sorted(SIZES)


@pytest.mark.parametrize("arch", sorted(SIZES))
def test_sizes_are_the_papers_and_a_users_flag_wins(arch):
    embed, ffn, heads, enc_layers, dec_layers, dropout = SIZES[arch]
    args = _defaults(arch)
    for side in ("encoder", "decoder"):
        got = (getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_ffn_embed_dim"),
               getattr(args, f"{side}_attention_heads"))
        assert got == (embed, ffn, heads), (arch, side, got)
    assert (args.encoder_layers, args.decoder_layers, args.dropout) == (enc_layers, dec_layers, dropout)
    mine = _defaults(arch, encoder_embed_dim=64, decoder_attention_heads=2, decoder_ffn_embed_dim=96)
    assert (mine.encoder_embed_dim, mine.decoder_attention_heads, mine.decoder_ffn_embed_dim) == (64, 2, 96)


@pytest.mark.parametrize("arch", ["umst_base_rpr", "umst_big_rpr"])
def test_rpr_archs_clip_relative_positions_at_16_unless_told(arch):
    """UMST + RPR: Shaw et al.'s clipping distance 16 (UMST's appendix); a user's --max-relative-positions wins."""
    assert _defaults(arch).max_relative_positions == 16
    assert _defaults(arch, max_relative_positions=4).max_relative_positions == 4
    assert not _defaults(arch.replace("_rpr", "")).max_relative_positions


def test_every_model_s_forward_keeps_fairseq_s_defaults():
    """A plugin model called as fairseq calls a TransformerModel (``model(**net_input, prev_output_tokens)``, no other
    argument) gives what fairseq's does: the output logits (``features_only`` False) and every encoder state
    (``return_all_hiddens`` True); every argument both name defaults alike, but for MSC's encoder states, which it
    keeps only where asked (its deep encoder's 6-36 states would stay in memory for nothing; test_msc.py)."""
    import inspect

    from fairseq.models import MODEL_REGISTRY
    from fairseq.models.transformer import TransformerModel

    deliberate = {("msc", "return_all_hiddens"): False}

    fairseqs = inspect.signature(TransformerModel.forward).parameters
    models = {name: cls for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("umst_plugin")}
    assert sorted(models) == ["msc", "msmsa", "prime", "transformer_sf", "umst"]
    for name, cls in models.items():
        own = inspect.signature(cls.forward).parameters
        shared = [p for p in own if p in fairseqs and fairseqs[p].default is not inspect.Parameter.empty]
        assert {"features_only", "return_all_hiddens"} <= set(shared), (name, shared)
        for p in shared:
            assert own[p].default == deliberate.get((name, p), fairseqs[p].default), (name, p, own[p].default)
