"""MSMSA: multi-scale multi-head self-attention (Guo et al., AAAI 2020) as a fairseq translation model.

The encoder is a (pre-norm, as in the UMST paper's re-implementation, its table 2)
transformer whose self-attention heads each see a window of their own scale
(``umst_plugin.modules.msmsa.windowed_attention``); the scales of each layer's heads
come from the control factor alpha (Eq. 11-12) or an explicit allocation. The
decoder is the standard transformer decoder unless ``--msmsa-decoder`` gives its
self-attention causal (left-only) multi-scale heads. ``--msmsa-no-ffn`` is the
paper's classification layer (Eq. 10): ``H + ReLU(MSMSA(H))``, no FFN.

The attention modules have exactly the parameters of fairseq's
MultiheadAttention, so ``msmsa_base`` has the parameter count of the pre-norm
transformer base (the UMST paper lists both at 65M).
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerDecoder,
    TransformerModel,
    base_architecture,
    transformer_vaswani_wmt_en_de_big,
)

from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models.msmsa.config import add_args, layer_head_scales, msmsa_defaults
from umst_plugin.models.msmsa.decoder import MSMSADecoder
from umst_plugin.models.msmsa.encoder import MSMSAEncoder


@register_model("msmsa")
class MSMSAModel(RawTextFromPretrained, TransformerModel):
    """Transformer whose encoder self-attention heads each attend within a window of their own scale."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        msmsa_defaults(args)
        layer_head_scales(args)  # fail early, with the reason, on a bad scale list or allocation
        if args.msmsa_decoder:
            layer_head_scales(args, decoder=True)
        # fairseq's TransformerModel.build_model hands build_encoder/build_decoder a TransformerConfig,
        # which drops the msmsa options: keep the Namespace at hand while it runs.
        cls._namespace = args
        try:
            return super().build_model(args, task)
        finally:
            del cls._namespace

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return MSMSAEncoder(cls._namespace, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        args = cls._namespace
        if not args.msmsa_decoder:
            return TransformerDecoder(args, tgt_dict, embed_tokens,
                                      no_encoder_attn=getattr(args, "no_cross_attention", False))
        return MSMSADecoder(args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False))


@register_model_architecture("msmsa", "msmsa_base")
def msmsa_base(args):
    # transformer base, pre-norm (the UMST paper's baselines, table 2)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    msmsa_defaults(args)
    base_architecture(args)


@register_model_architecture("msmsa", "msmsa_big")
def msmsa_big(args):
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    msmsa_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)
