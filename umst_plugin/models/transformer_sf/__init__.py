"""TranSFormer, the Slow-Fast Transformer (Li et al., ACL 2023): fairseq model ``transformer_sf``
(``model.py``), its encoder (``encoder.py``), options, stack configuration and arch defaults (``config.py``),
what ``umst-inspect`` draws of it (``capture.py``); its layer is :mod:`umst_plugin.modules.transformer_sf.layer`.
Importing the package registers the model, its archs and the family."""
from umst_plugin import families
from umst_plugin.models.transformer_sf.capture import capture_transformer_sf
from umst_plugin.models.transformer_sf.encoder import SlowFastEncoder, SlowFastInput
from umst_plugin.models.transformer_sf.model import TransformerSlowFastModel
from umst_plugin.modules.transformer_sf.layer import SlowFastLayer


_SF_QUICK = dict(fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2)
families.register(families.Family(
    name="transformer_sf", title="TranSFormer", paper="Li et al., ACL 2023: TranSFormer, Slow-Fast Transformer",
    model=TransformerSlowFastModel, encoder=SlowFastEncoder, layers=(SlowFastLayer, SlowFastInput), capture=capture_transformer_sf,
    bench_rows={"transformer_sf": families.BenchRow("transformer_sf_base", "transformer_sf_big", quick=_SF_QUICK,
                                                    baseline="transformer_dropout"),
                # the trade-off flag: the character branch's sub-layers recomputed in backward rather than kept
                "transformer_sf_recompute": families.BenchRow(
                    "transformer_sf_base", "transformer_sf_big", overrides={"sf_recompute_fast": True},
                    quick=_SF_QUICK, baseline="transformer_dropout", label=" --sf-recompute-fast", extra=True)}))
