"""TranSFormer: Slow-Fast Transformer for MT (Li et al., ACL 2023), fairseq model ``transformer_sf``.

Architectures ``transformer_sf_base`` (slow 512/2048/8 heads, fast 32/128) and
``transformer_sf_big`` (slow 1024/4096/16, fast 64/256), 6 encoder blocks in both
branches, pre-norm, and fairseq's standard ``TransformerDecoder`` attending the
slow branch (``--sf-encoder-output slow``, paper 3.4). ``transformer_sf_fast_only_base``
/ ``_big`` are table 1's "Fast Only" rows: the same model with
``--sf-encoder-output fast --sf-interaction-layers none``, so the fast (character)
branch alone is the encoder and is projected to the decoder width
(``--encoder-embed-dim``); no slow sub-layer is built.

The fast branch's characters are derived from ``src_tokens`` through a
``CharTable`` built from the source dictionary and saved in the checkpoint, so
the model runs under ``translation`` and ``multiscale_translation`` tasks and in
fairseq-generate / fairseq-interactive with no side input. Subword->word groups
(A_s) come from the same table, so ``src_word_ids`` from the task is accepted
and ignored (both follow the same definition: 1-based words, </s> its own word).
See ``umst_plugin/modules/transformer_sf/layer.py`` for the block and docs/transformer_sf.md.
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel

from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models._sizes import BASE, transformer_big_sizes, transformer_sizes
from umst_plugin.models.transformer_sf.config import add_args, fast_only_defaults, slowfast_defaults
from umst_plugin.models.transformer_sf.encoder import SlowFastEncoder


@register_model("transformer_sf")
class TransformerSlowFastModel(RawTextFromPretrained, TransformerModel):
    """Transformer whose encoder is the two-branch Slow-Fast encoder."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_args(parser)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SlowFastEncoder(args, src_dict, embed_tokens)

    def host_batch_hint(self):
        """For multiscale_translation's collater: the batch's character length, computed on the host, so the
        encoder learns it without a host-device sync (``CharTable.forward``'s ``char_len``)."""
        return self.encoder.char_table.host_hint()

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer=None, alignment_heads=None, src_char_len=None):
        """fairseq's encoder-decoder forward, passing on the host-side character length the task's collater
        computes (``src_char_len``; without it the encoder reads it off the device)."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
                                   src_char_len=src_char_len)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                            alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                            src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)


@register_model_architecture("transformer_sf", "transformer_sf_base")
def transformer_sf_base(args):
    transformer_sizes(args, BASE, sides=("encoder",))
    args.encoder_layers = getattr(args, "encoder_layers", 6)
    args.fast_embed_dim = getattr(args, "fast_embed_dim", 32)
    slowfast_defaults(args)


@register_model_architecture("transformer_sf", "transformer_sf_big")
def transformer_sf_big(args):
    transformer_big_sizes(args)  # paper: residual dropout 0.3 for big
    args.fast_embed_dim = getattr(args, "fast_embed_dim", 64)
    transformer_sf_base(args)


@register_model_architecture("transformer_sf", "transformer_sf_fast_only_base")
def transformer_sf_fast_only_base(args):
    """Fast Only (Hidden=32, L=6): characters at width 32, decoder 512 (table 1: 42M, 17.90 BLEU)."""
    fast_only_defaults(args)
    transformer_sf_base(args)


@register_model_architecture("transformer_sf", "transformer_sf_fast_only_big")
def transformer_sf_fast_only_big(args):
    """The big counterpart: characters at width 64 (transformer_sf_big's), decoder 1024."""
    fast_only_defaults(args)
    transformer_sf_big(args)
