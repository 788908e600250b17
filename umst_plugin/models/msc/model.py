"""MSC: Multiscale Collaborative deep models for NMT (Wei et al., ACL 2020).

Registered model ``msc`` with architectures ``msc_iwslt_de_en``, ``msc_base``
and ``msc_big`` (pre-norm).  The encoder is N blocks of M layers
(``--encoder-blocks N --encoder-layers-per-block M``); the decoder has N layers,
one per block.

* Block-scale collaboration (section 3.1, Eqs. 5-7): decoder layer n attends
  the output of encoder block n.
* Contextual collaboration (section 3.2, Eqs. 9-13): ``C^0`` = source
  embedding, ``C^n = GRU(C^{n-1}, B^n)`` position-wise; every layer of encoder
  block n fuses self-attention with attention over ``C^{n-1}`` (Eq. 12 gate);
  decoder layer n fuses attention over ``B^n`` with attention over ``C^n``
  (Eq. 13 gate).
* ``--encoder-l2``: L2 penalty on encoder weight matrices (table 2 row 6),
  added to the training loss through :meth:`MSCModel.get_normalized_probs`,
  the hook every fairseq NLL criterion calls.
* ``--log-encoder-grad-norms``: per-layer encoder gradient norms (figure 5)
  written as JSONL during fairseq-train; plot with scripts/plot_grad_norms.py.

Deliberate choices where the paper is silent (also in docs/msc.md):
* Block outputs are layer-normalised (one LayerNorm per block) before the
  decoder and the context cell see them, as a pre-norm encoder normalises its
  top output; the residual stream entering block n+1 is the raw B^n (Eq. 6).
* One GRU cell is shared by all blocks: "a GRU cell Q" (Eq. 9); this is what
  reproduces table 2's 10.5M -> 15.6M parameter count (per-block cells would
  give 17.6M).
* C^0 is the encoder input of block 1 (scaled token embedding + positions,
  after dropout).

MSC needs no side data: the encoder and model accept and ignore extra
keyword inputs (``src_word_ids``, ``src_word_heads`` of the
``multiscale_translation`` task), so it also trains with plain ``translation``.
"""
import os
from typing import List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from fairseq import utils
from fairseq.logging import metrics
from fairseq.models import FairseqEncoderDecoderModel, register_model, register_model_architecture
from fairseq.models.transformer import Embedding, TransformerModel

from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models._embeddings import build_embeddings
from umst_plugin.models._sizes import BASE, IWSLT, transformer_big_sizes, transformer_sizes
from umst_plugin.models.msc.config import DEFAULT_MAX_POSITIONS, GRAD_NORMS_FILENAME, add_args, msc_defaults
from umst_plugin.models.msc.decoder import MSCDecoder
from umst_plugin.models.msc.encoder import MSCEncoder
from umst_plugin.modules.msc.grad_norms import EncoderGradNormLogger, PerTokenLossTerm


@register_model("msc")
class MSCModel(RawTextFromPretrained, FairseqEncoderDecoderModel):
    """Multiscale Collaborative deep model (Wei et al., ACL 2020)."""

    def __init__(self, args, encoder, decoder):
        super().__init__(encoder, decoder)
        self.args = args
        self.encoder_l2 = float(args.encoder_l2 or 0.0)
        self.encoder_l2_params = self._encoder_weight_matrices(encoder) if self.encoder_l2 > 0 else []
        self.grad_norm_logger: Optional[EncoderGradNormLogger] = None
        if args.log_encoder_grad_norms:
            path = args.encoder_grad_norms_file or os.path.join(
                getattr(args, "save_dir", None) or ".", GRAD_NORMS_FILENAME)
            self.grad_norm_logger = EncoderGradNormLogger(
                encoder.layers, path, args.encoder_grad_norms_interval)

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        msc_base_architecture(args)
        expected = args.encoder_blocks * args.encoder_layers_per_block
        if args.encoder_layers != expected:
            raise ValueError(
                f"msc: --encoder-layers {args.encoder_layers} != --encoder-blocks "
                f"{args.encoder_blocks} x --encoder-layers-per-block {args.encoder_layers_per_block}; "
                "set the depth with --encoder-blocks/--encoder-layers-per-block")
        if args.decoder_layers != args.encoder_blocks:
            raise ValueError(
                f"msc: the decoder has one layer per encoder block: --decoder-layers "
                f"{args.decoder_layers} != --encoder-blocks {args.encoder_blocks}")
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ValueError("msc: encoder and decoder embedding dims must match "
                             "(the decoder attends encoder blocks and contexts directly)")
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_POSITIONS

        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary

        def build_embedding(dictionary, dim, path=None):
            emb = Embedding(len(dictionary), dim, dictionary.pad())
            if path:
                utils.load_embedding(utils.parse_embedding(path), dictionary, emb)
            return emb

        encoder_embed, decoder_embed = build_embeddings(args, src_dict, tgt_dict, build_embedding)
        encoder = MSCEncoder(args, src_dict, encoder_embed)
        decoder = MSCDecoder(args, tgt_dict, decoder_embed)
        return cls(args, encoder, decoder)

    @staticmethod
    def _encoder_weight_matrices(encoder: MSCEncoder) -> List[nn.Parameter]:
        """Encoder weights under --encoder-l2: every matrix except the (shared) token embedding."""
        embed = {id(p) for p in encoder.embed_tokens.parameters()}
        return [p for p in encoder.parameters() if p.dim() >= 2 and id(p) not in embed]

    def encoder_l2_penalty(self) -> Tensor:
        """LAMBDA * sum of squared encoder weight entries (fp32)."""
        squares = [p.float().pow(2).sum() for p in self.encoder_l2_params]
        return self.encoder_l2 * torch.stack(squares).sum()

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        return_all_hiddens: bool = False,
        features_only: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None
    ):
        """Side inputs of other models (src_word_ids, src_word_heads, ...) are ignored."""
        if self.grad_norm_logger is not None:
            self.grad_norm_logger.recording = self.training
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths,
                                   return_all_hiddens=return_all_hiddens)
        x, extra = self.decoder(
            prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
            alignment_layer=alignment_layer, alignment_heads=alignment_heads,
            src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
        )
        if self.training and self.encoder_l2 > 0 and torch.is_grad_enabled():
            penalty = self.encoder_l2_penalty()
            metrics.log_scalar("encoder_l2", penalty.detach(), round=4)
            extra["msc_encoder_l2"] = [penalty]
        return x, extra

    def _hooks_log_probs(self):
        return self.training and (self.encoder_l2 > 0 or self.grad_norm_logger is not None)

    def plain_normalized_probs(self):
        """Whether get_normalized_probs is the decoder's log-softmax and nothing more now (not hooked in training):
        where it is, fairseq-train --compile compiles the loss (umst_plugin/compilation/loss.py)."""
        return not self._hooks_log_probs()

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        lprobs = super().get_normalized_probs(net_output, log_probs, sample)
        if not (self._hooks_log_probs() and log_probs and lprobs.requires_grad):
            return lprobs
        extra = net_output[1] if len(net_output) > 1 and isinstance(net_output[1], dict) else {}
        penalty_list = extra.get("msc_encoder_l2") or [None]
        penalty = penalty_list[0]
        if penalty is None:
            penalty = lprobs.new_zeros(())
        return PerTokenLossTerm.apply(lprobs, penalty, self.grad_norm_logger)

    def set_num_updates(self, num_updates):
        super().set_num_updates(num_updates)
        if self.grad_norm_logger is not None:
            self.grad_norm_logger.set_update(num_updates)


@register_model_architecture("msc", "msc")
def msc_base_architecture(args):
    msc_defaults(args)


@register_model_architecture("msc", "msc_iwslt_de_en")
def msc_iwslt_de_en(args):
    """transformer_iwslt_de_en sizes (256 / 512 / 4 heads), table 2."""
    transformer_sizes(args, IWSLT)
    msc_base_architecture(args)


@register_model_architecture("msc", "msc_base")
def msc_base(args):
    """transformer_base sizes (512 / 2048 / 8 heads), table 4."""
    transformer_sizes(args, BASE, sides=("encoder",))
    msc_base_architecture(args)


@register_model_architecture("msc", "msc_big")
def msc_big(args):
    """transformer_big sizes (1024 / 4096 / 16 heads), table 4."""
    transformer_big_sizes(args)
    msc_base_architecture(args)
