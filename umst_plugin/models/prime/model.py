"""Unified Transformer with Prime modules (Zhao et al., "Unified Transformer for Sequence-to-Sequence
Learning"; the authors' code is MUSE, lancopku/Prime).

Registered model ``prime`` with architectures ``prime_base``, ``prime_big`` (Prime: attention,
dynamic convolution and FFN in parallel, Eq. 4) and ``prime_simple_base``, ``prime_simple_big``
(attention and FFN in parallel, Eq. 1). Embeddings, positions, output projection, beam
reordering of the encoder output and incremental plumbing are fairseq's TransformerEncoder /
TransformerDecoder; only the layers are replaced by :class:`~umst_plugin.modules.prime.layer.PrimeLayer`.

Prime needs no side data: it trains with fairseq's plain ``translation`` task, and with
``multiscale_translation`` it accepts and ignores the extra encoder inputs
(``src_word_ids``, ``src_word_heads``).
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import DEFAULT_MAX_SOURCE_POSITIONS, DEFAULT_MAX_TARGET_POSITIONS, TransformerModel

from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models._embeddings import build_embeddings
from umst_plugin.models.prime.config import add_args, prime_defaults, prime_sizes, validate_prime_args
from umst_plugin.models.prime.decoder import PrimeDecoder
from umst_plugin.models.prime.encoder import PrimeEncoder


@register_model("prime")
class PrimeModel(RawTextFromPretrained, TransformerModel):
    """Unified Transformer built from Prime layers (post-norm, parallel branches)."""

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        prime_defaults(args)
        validate_prime_args(args)
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        if args.encoder_layers_to_keep:
            args.encoder_layers = len(args.encoder_layers_to_keep.split(","))
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))

        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        encoder_embed, decoder_embed = build_embeddings(
            args, src_dict, tgt_dict, lambda dictionary, dim, path: cls.build_embedding(args, dictionary, dim, path))
        encoder = cls.build_encoder(args, src_dict, encoder_embed)
        decoder = cls.build_decoder(args, tgt_dict, decoder_embed)
        return cls(args, encoder, decoder)

    def set_beam_size(self, beam_size: int):
        """fairseq's SequenceGenerator calls this before beam search (``set_decoder_beam_size``); the decoder's Prime
        layers then keep one copy of the cross-attention keys and values per sentence instead of one per beam."""
        self.decoder.set_beam_size(beam_size)
        self.encoder.beam_size = beam_size

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return PrimeEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return PrimeDecoder(args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False))


@register_model_architecture("prime", "prime_base")
def prime_base(args):
    """IWSLT-size Unified Transformer (paper 3.1.3): 12+12 layers, d=384, FFN 768, 4 heads, dropout 0.4."""
    prime_sizes(args, embed_dim=384, ffn_dim=768, heads=4, dropout=0.4)


@register_model_architecture("prime", "prime_big")
def prime_big(args):
    """WMT-size Unified Transformer (paper 3.1.3/3.1.4): 12+12 layers, d=768, FFN 3072, 16 heads, dropout 0.3;
    input dropout 0.1, as every WMT Prime command of the authors' README (``--input_dropout 0.1``)."""
    args.input_dropout = getattr(args, "input_dropout", 0.1)
    prime_sizes(args, embed_dim=768, ffn_dim=3072, heads=16, dropout=0.3)


@register_model_architecture("prime", "prime_simple_base")
def prime_simple_base(args):
    """Prime-simple (Eq. 1: attention and FFN in parallel, no convolution) at the base size."""
    args.prime_conv_type = getattr(args, "prime_conv_type", "none")
    prime_base(args)


@register_model_architecture("prime", "prime_simple_big")
def prime_simple_big(args):
    """Prime-simple (Eq. 1) at the big size; no input dropout (the authors' WMT Prime-simple command sets none)."""
    args.prime_conv_type = getattr(args, "prime_conv_type", "none")
    args.input_dropout = getattr(args, "input_dropout", 0.0)
    prime_big(args)
