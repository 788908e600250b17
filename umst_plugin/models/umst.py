"""UMST: the Universal MultiScale Transformer (Li et al., ICML 2022), as a fairseq model ``umst``.

Encoder: class embedding + UMST blocks (:mod:`umst_plugin.modules.umst.encoder_layer`), the
scale graphs built once per batch from the ``multiscale_translation`` task's ``src_word_ids`` /
``src_word_heads`` (:mod:`umst_plugin.modules.umst.graphs`). Decoder: fairseq's standard
pre-norm transformer decoder (the paper changes the encoder only).

Architectures: ``umst_base`` (512/2048, 8 heads, dropouts 0.1, pre-norm; appendix A.2),
``umst_big`` (1024/4096, 16 heads, dropout 0.3), ``umst_base_rpr`` / ``umst_big_rpr`` (plus Shaw
et al. relative positions in the rectified self-attention), ``umst_iwslt_de_en`` (512/1024,
4 heads). Any depth via ``--encoder-layers``. Every ablation of tables 5, 6, 8 is a flag (see
``add_args`` and docs/umst.md).
"""
import logging

import torch
import torch.nn as nn
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerEncoderBase, TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture

from umst_plugin import families
from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models._sizes import transformer_big_sizes
from umst_plugin.modules.common.amp_functions import compute_dtype
from umst_plugin.modules.umst.encoder_layer import (
    GCN_ACTIVATIONS,
    INTRA_GROUP_OPS,
    PHRASE_GCN_FORMS,
    UMSTEncoderLayer,
)
from umst_plugin.modules.umst.graphs import PHRASE_NOISE, UPSAMPLE_MODES, WORD_BOUNDARY_NOISE, build_graphs
from umst_plugin.modules.umst.rectified_attention import ATTENTION_DROPOUT_MODES, UPSAMPLE_NORMS

logger = logging.getLogger(__name__)

SHARE_GCN_PROJ = ("none", "across-layers", "within-layer")


class UMSTEncoder(TransformerEncoderBase):
    """Transformer encoder whose blocks are UMST blocks; needs ``src_word_ids`` and ``src_word_heads``."""

    def __init__(self, cfg, dictionary, embed_tokens):
        if not cfg.encoder.normalize_before:
            raise ValueError("UMST blocks are pre-norm (paper section 2); use --encoder-normalize-before")
        super().__init__(cfg, dictionary, embed_tokens)
        embed_dim = embed_tokens.embedding_dim
        if getattr(cfg, "no_class_embedding", False):
            self.class_embedding = None
        else:
            # Section 3.1: binary (0 = whole word, 1 = piece of a multi-piece word), N(0, 1/sqrt(d)), unscaled.
            self.class_embedding = nn.Embedding(2, embed_dim)
            nn.init.normal_(self.class_embedding.weight, mean=0.0, std=embed_dim ** -0.5)
        self.upsample = getattr(cfg, "rsan_upsample", "gather")
        self.word_boundary_noise = getattr(cfg, "word_boundary_noise", "none")
        self.phrase_noise = getattr(cfg, "phrase_adjacency_noise", "none")
        self.inter_group = not getattr(cfg, "no_inter_group", False)
        self.downsample = getattr(cfg, "word_downsample", None) or "mean"
        self.upsample_norm = getattr(cfg, "rsan_upsample_norm", None) or "row"

    def build_encoder_layer(self, cfg):
        # Called by the base __init__ once per layer; shared projections are created on first call.
        embed_dim = cfg.encoder.embed_dim
        share = getattr(cfg, "share_gcn_proj", "none")
        if share not in SHARE_GCN_PROJ:
            raise ValueError(f"unknown --share-gcn-proj {share!r}; choose from {SHARE_GCN_PROJ}")
        intra = None if getattr(cfg, "no_intra_group", False) else getattr(cfg, "intra_group_op", "gcn")
        inter = not getattr(cfg, "no_inter_group", False)
        word_proj = phrase_proj = None
        if share == "across-layers":  # table 6 row 2: one W_w and one W_p for the whole encoder
            if not hasattr(self, "shared_word_proj"):
                self.shared_word_proj = nn.Linear(embed_dim, embed_dim) if intra == "gcn" else None
                self.shared_phrase_proj = nn.Linear(embed_dim, embed_dim) if inter else None
            word_proj, phrase_proj = self.shared_word_proj, self.shared_phrase_proj
        return UMSTEncoderLayer(
            embed_dim,
            cfg.encoder.ffn_embed_dim,
            cfg.encoder.attention_heads,
            dropout=cfg.dropout,
            attention_dropout=cfg.attention_dropout,
            activation_dropout=cfg.activation_dropout,
            intra_group=intra,
            inter_group=inter,
            downsample=getattr(cfg, "word_downsample", "mean"),
            upsample_norm=getattr(cfg, "rsan_upsample_norm", "row"),
            share_rsan_qk=getattr(cfg, "share_rsan_qk", False),
            max_relative_positions=getattr(cfg, "max_relative_positions", 0),
            word_proj=word_proj,
            phrase_proj=phrase_proj,
            share_within_layer=(share == "within-layer" and intra == "gcn" and inter),
            gcn_activations=getattr(cfg, "gcn_activations", None) or "lean",
            attention_dropout_mode=getattr(cfg, "rsan_attention_dropout", None) or "per-map",
            phrase_gcn_form=getattr(cfg, "phrase_gcn_form", None) or "eq3",
        )

    def forward(
        self,
        src_tokens,
        src_lengths=None,
        src_word_ids=None,
        src_word_heads=None,
        return_all_hiddens: bool = False,
        token_embeddings=None,
        **unused,
    ):
        graphs = build_graphs(
            src_tokens,
            src_word_ids,
            src_word_heads,
            self.padding_idx,
            upsample=self.upsample,
            word_boundary_noise=self.word_boundary_noise,
            phrase_noise=self.phrase_noise,
            need_phrase=self.inter_group,
            # the dense per-batch operators every block shares, in the dtype the blocks compute in
            dtype=compute_dtype(self.embed_tokens.weight),
            downsample=self.downsample,
            upsample_norm=self.upsample_norm,
        )
        encoder_padding_mask = src_tokens.eq(self.padding_idx)

        if token_embeddings is None:
            token_embeddings = self.embed_tokens(src_tokens)
        x = embed = self.embed_scale * token_embeddings
        if self.embed_positions is not None:
            x = x + self.embed_positions(src_tokens)
        if self.class_embedding is not None:
            x = x + self.class_embedding(graphs.class_ids).to(x.dtype)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        x = x.masked_fill(encoder_padding_mask.unsqueeze(-1), 0.0)

        # UMST blocks run batch-first (B x T x C); fairseq's interface is time-first.
        encoder_states = [x.transpose(0, 1)] if return_all_hiddens else []
        for layer in self.layers:
            x = layer(x, graphs)
            if return_all_hiddens:
                encoder_states.append(x.transpose(0, 1))
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)

        src_lengths = (~encoder_padding_mask).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [embed],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


@register_model("umst")
class UMSTModel(RawTextFromPretrained, TransformerModel):
    """Universal MultiScale Transformer (encoder-side multiscale; standard pre-norm decoder)."""

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        g = parser  # the caller's model-specific group (argument_default=SUPPRESS keeps arch defaults working)
        g.add_argument("--no-class-embedding", action="store_true",
                       help="drop the binary word/sub-word class embedding (table 5 'w/o class-embedding')")
        g.add_argument("--no-intra-group", action="store_true",
                       help="drop the intra-group (word GCN) interaction (table 5 'w/o intra-group')")
        g.add_argument("--no-inter-group", action="store_true",
                       help="drop the inter-group (phrase/dependency GCN) interaction (table 5 'w/o inter-group')")
        g.add_argument("--intra-group-op", choices=INTRA_GROUP_OPS,
                       help="intra-group operator: gcn (default, Eq. 2), pool (average pooling), gat (table 5)")
        g.add_argument("--share-gcn-proj", choices=SHARE_GCN_PROJ,
                       help="share W_w and W_p: none (default), across-layers (table 6 #2), within-layer (#3)")
        g.add_argument("--share-rsan-qk", action="store_true",
                       help="word branch of the rectified attention reuses the subword Q/K projections (table 6 #4)")
        g.add_argument("--rsan-upsample", choices=UPSAMPLE_MODES,
                       help="ATTN2 -> ATTN2' up-sampling: gather (default, Eq. 4), nearest or linear "
                            "interpolation (table 6 #5, #6)")
        g.add_argument("--rsan-upsample-norm", choices=UPSAMPLE_NORMS,
                       help="row (default): G ATTN2 diag(1/n) G^T, row-stochastic; literal: G ATTN2 G^T as Eq. 4 "
                            "(rows sum to the mean piece count)")
        g.add_argument("--rsan-attention-dropout", choices=ATTENTION_DROPOUT_MODES,
                       help="per-map (default): attention dropout on ATTN1 and, at word level, on ATTN2, so ATTN2' is "
                            "never built; fused: build (ATTN1 + ATTN2')/2 in training and drop its entries, like a "
                            "transformer's single map (same expectation, different noise; O(B.H.L^2) more memory)")
        g.add_argument("--word-downsample", choices=("mean", "scaled-sum"),
                       help="subword -> word pooling: mean (default, section 3.3) or sum/sqrt(n) (authors' code)")
        g.add_argument("--phrase-gcn-form", choices=PHRASE_GCN_FORMS,
                       help="phrase GCN: eq3 (default, the paper's Eq. 3: xw + ReLU(A_p (LN(xw) W_p + b))) or "
                            "authors (libeineu/UMST's code: xw + A_p ReLU(W_p (A_p LN(xw)) + b), A_p applied twice, "
                            "the activation dropout between the products)")
        g.add_argument("--word-boundary-noise", choices=WORD_BOUNDARY_NOISE,
                       help="replace A_w of the word GCN by a random (Bernoulli 0.5) or shuffled one (table 8; "
                            "combine with --no-inter-group as the paper does)")
        g.add_argument("--phrase-adjacency-noise", choices=PHRASE_NOISE,
                       help="replace A_p by a random symmetric Bernoulli(0.5) matrix (table 8 'UMST + Random P')")
        g.add_argument("--gcn-activations", choices=GCN_ACTIVATIONS,
                       help="what training keeps for the GCN blocks' backward (same math and dropout masks in all): "
                            "lean (default: inputs and 1-byte masks, hand-written backward), store (plain autograd, "
                            "the reference), recompute (checkpointing, also of RSAN's word branch: least memory, "
                            "slowest)")
        g.add_argument("--no-gcn-recompute", action="store_true",
                       help="deprecated alias of --gcn-activations store")
        g.add_argument("--max-relative-positions", type=int, metavar="K",
                       help="Shaw et al. relative positions in the rectified attention, clipping distance K "
                            "(0 = off; the *_rpr archs use 16)")

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


def _umst_defaults(args):
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    args.no_class_embedding = getattr(args, "no_class_embedding", False)
    args.no_intra_group = getattr(args, "no_intra_group", False)
    args.no_inter_group = getattr(args, "no_inter_group", False)
    args.intra_group_op = getattr(args, "intra_group_op", None) or "gcn"
    args.share_gcn_proj = getattr(args, "share_gcn_proj", None) or "none"
    args.share_rsan_qk = getattr(args, "share_rsan_qk", False)
    args.rsan_upsample = getattr(args, "rsan_upsample", None) or "gather"
    args.rsan_upsample_norm = getattr(args, "rsan_upsample_norm", None) or "row"
    args.word_downsample = getattr(args, "word_downsample", None) or "mean"
    args.phrase_gcn_form = getattr(args, "phrase_gcn_form", None) or "eq3"
    args.rsan_attention_dropout = getattr(args, "rsan_attention_dropout", None) or "per-map"
    args.no_gcn_recompute = getattr(args, "no_gcn_recompute", False)
    args.gcn_activations = getattr(args, "gcn_activations", None) or ("store" if args.no_gcn_recompute else "lean")
    args.word_boundary_noise = getattr(args, "word_boundary_noise", None) or "none"
    args.phrase_adjacency_noise = getattr(args, "phrase_adjacency_noise", None) or "none"
    mrp = getattr(args, "max_relative_positions", None)
    args.max_relative_positions = 0 if mrp is None else mrp


@register_model_architecture("umst", "umst_base")
def umst_base_architecture(args):
    """Appendix A.2 base ("deep") setting: 512 / 2048, 8 heads, all dropouts 0.1, pre-norm."""
    args.dropout = getattr(args, "dropout", 0.1)
    args.attention_dropout = getattr(args, "attention_dropout", 0.1)
    args.activation_dropout = getattr(args, "activation_dropout", 0.1)
    _umst_defaults(args)
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
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 512)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1024)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 512)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 1024)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    umst_base_architecture(args)


families.register(families.Family(
    name="umst", title="UMST", paper="Li et al., ICML 2022: Universal MultiScale Transformer",
    model=UMSTModel, encoder=UMSTEncoder, layers=(UMSTEncoderLayer,),
    bench_rows={"umst": families.BenchRow("umst_base", "umst_big", baseline="transformer_dropout"),
                "umst_rpr": families.BenchRow("umst_base_rpr", "umst_big_rpr", baseline="transformer_dropout")}))
