"""UMST: the Universal MultiScale Transformer (Li et al., ICML 2022), as a fairseq model ``umst``.

Encoder: class embedding + UMST blocks (:mod:`umst_plugin.modules.umst.layer`), the
scale graphs built once per batch from the ``multiscale_translation`` task's ``src_word_ids`` /
``src_word_heads`` (:mod:`umst_plugin.modules.umst.graphs`). Decoder: fairseq's standard
pre-norm transformer decoder (the paper changes the encoder only).

Architectures: ``umst_base`` (512/2048, 8 heads, dropouts 0.1, pre-norm; appendix A.2),
``umst_big`` (1024/4096, 16 heads, dropout 0.3), ``umst_base_rpr`` / ``umst_big_rpr`` (plus Shaw
et al. relative positions in the rectified self-attention), ``umst_iwslt_de_en`` (512/1024,
4 heads). Any depth via ``--encoder-layers``. Every ablation of tables 5, 6, 8 is a flag (see
``add_args`` and docs/umst.md).
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture

from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models._sizes import transformer_big_sizes, transformer_sizes
from umst_plugin.models.umst.config import add_args, umst_defaults
from umst_plugin.models.umst.encoder import UMSTEncoder


@register_model("umst")
class UMSTModel(RawTextFromPretrained, TransformerModel):
    """Universal MultiScale Transformer (encoder-side multiscale; standard pre-norm decoder)."""

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        add_args(parser)  # the caller's model-specific group (argument_default=SUPPRESS keeps arch defaults working)

    @classmethod
    def build_model(cls, args, task):
        umst_base_architecture(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        from fairseq.models.transformer import TransformerConfig

        return UMSTEncoder(TransformerConfig.from_namespace(cfg), src_dict, embed_tokens)

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        src_word_ids=None,
        src_word_heads=None,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer=None,
        alignment_heads=None,
        **unused,
    ):
        encoder_out = self.encoder(
            src_tokens,
            src_lengths=src_lengths,
            src_word_ids=src_word_ids,
            src_word_heads=src_word_heads,
            return_all_hiddens=return_all_hiddens,
        )
        return self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )


@register_model_architecture("umst", "umst_base")
def umst_base_architecture(args):
    """Appendix A.2 base ("deep") setting: 512 / 2048, 8 heads, all dropouts 0.1, pre-norm."""
    args.dropout = getattr(args, "dropout", 0.1)
    args.attention_dropout = getattr(args, "attention_dropout", 0.1)
    args.activation_dropout = getattr(args, "activation_dropout", 0.1)
    umst_defaults(args)
    base_architecture(args)


@register_model_architecture("umst", "umst_big")
def umst_big_architecture(args):
    """Big: hidden and filter sizes doubled, 16 heads, residual dropout 0.3."""
    transformer_big_sizes(args)
    umst_base_architecture(args)


@register_model_architecture("umst", "umst_base_rpr")
def umst_base_rpr_architecture(args):
    """UMST + RPR: Shaw et al. relative positions (clipping distance 16) in the rectified attention."""
    if getattr(args, "max_relative_positions", None) is None:
        args.max_relative_positions = 16
    umst_base_architecture(args)


@register_model_architecture("umst", "umst_big_rpr")
def umst_big_rpr_architecture(args):
    if getattr(args, "max_relative_positions", None) is None:
        args.max_relative_positions = 16
    umst_big_architecture(args)


@register_model_architecture("umst", "umst_iwslt_de_en")
def umst_iwslt_de_en_architecture(args):
    """Small-data setting: 512 / 1024, 4 heads."""
    transformer_sizes(args, dict(embed_dim=512, ffn_embed_dim=1024, attention_heads=4))
    umst_base_architecture(args)
