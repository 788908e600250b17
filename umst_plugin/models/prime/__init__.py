"""Prime, the Unified Transformer with parallel attention, dynamic convolution and FFN (Zhao et al. 2019, MUSE):
fairseq model ``prime`` (``model.py``), its encoder (``encoder.py``) and decoder (``decoder.py``), options and arch
defaults (``config.py``), what ``umst-inspect`` draws of it (``capture.py``); its layer is
:mod:`umst_plugin.modules.prime.layer`. Importing the package registers the model, its archs and the family."""
from umst_plugin import families
from umst_plugin.models.prime.capture import capture_prime
from umst_plugin.models.prime.encoder import PrimeEncoder
from umst_plugin.models.prime.model import PrimeModel
from umst_plugin.modules.prime.layer import PrimeDecoderLayer, PrimeEncoderLayer


# Prime's shape (12+12 layers, narrower and deeper than the transformer's 6+6): activations grow with layers x
# width and matmul FLOPs with layers x width^2, so a narrower model keeps more bytes per FLOP whatever its layers
# are. This transformer tells the shape's share of Prime's ratio from the layers'.
_PRIME_SHAPE = families.BenchRow(
    "transformer", "transformer_vaswani_wmt_en_de_big",
    overrides=dict(encoder_normalize_before=True, decoder_normalize_before=True, encoder_layers=12, decoder_layers=12,
                   encoder_embed_dim=384, decoder_embed_dim=384, encoder_ffn_embed_dim=768, decoder_ffn_embed_dim=768,
                   encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.4),
    big_overrides=dict(encoder_embed_dim=768, decoder_embed_dim=768, encoder_ffn_embed_dim=3072,
                       decoder_ffn_embed_dim=3072, encoder_attention_heads=16, decoder_attention_heads=16, dropout=0.3),
    label=" (Prime's shape)", baseline_only=True)
# MUSE as the UMST paper re-implemented it for its table 2 (configs/umst-t2-muse-base.yaml, -big.yaml): Prime's
# layers at the transformer's shape (6+6 layers, d 512 / 1024) and UMST's dropouts. This, not prime_base's 12+12
# layers at d 384 (which the Prime paper trains on IWSLT only), is the Prime model of a WMT14 base recipe, so the
# speed table measures it beside prime_base.
_MUSE = families.BenchRow(
    "prime_base", "prime_big",
    overrides=dict(encoder_layers=6, decoder_layers=6, encoder_embed_dim=512, decoder_embed_dim=512,
                   encoder_ffn_embed_dim=2048, decoder_ffn_embed_dim=2048, encoder_attention_heads=8,
                   decoder_attention_heads=8, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
                   input_dropout=0.0),
    big_overrides=dict(encoder_embed_dim=1024, decoder_embed_dim=1024, encoder_ffn_embed_dim=4096,
                       decoder_ffn_embed_dim=4096, encoder_attention_heads=16, decoder_attention_heads=16, dropout=0.3),
    baseline="transformer_dropout", label=" (UMST's MUSE: 6+6 layers)", extra=True,
    recipes=("umst-t2-muse-base", "umst-t2-muse-big"))
families.register(families.Family(
    name="prime", title="Prime", paper="Zhao et al. 2019: MUSE, Parallel Multi-Scale Attention (Unified Transformer)",
    model=PrimeModel, encoder=PrimeEncoder, layers=(PrimeEncoderLayer, PrimeDecoderLayer),
    capture=capture_prime,
    bench_rows={"prime": families.BenchRow("prime_base", "prime_big", shape_baseline="transformer_prime_shape"),
                "prime_simple": families.BenchRow("prime_simple_base", "prime_simple_big",
                                                  shape_baseline="transformer_prime_shape"),
                "prime_muse": _MUSE, "transformer_prime_shape": _PRIME_SHAPE}))
