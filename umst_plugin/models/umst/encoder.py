"""UMST's encoder: class embedding + UMST blocks (:mod:`umst_plugin.modules.umst.layer`), the scale graphs
built once per batch from the ``multiscale_translation`` task's ``src_word_ids`` / ``src_word_heads``
(:mod:`umst_plugin.modules.umst.graphs`)."""
import logging

import torch
import torch.nn as nn
from fairseq.models.transformer import TransformerEncoderBase

from umst_plugin.models.umst.config import SHARE_GCN_PROJ
from umst_plugin.modules.common.amp_functions import compute_dtype
from umst_plugin.modules.umst.graphs import build_graphs
from umst_plugin.modules.umst.layer import UMSTEncoderLayer
from umst_plugin.modules.umst.rectified_attention import relative_buckets

logger = logging.getLogger(__name__)


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
        self.max_relative_positions = getattr(cfg, "max_relative_positions", 0)

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's upgrade, and a warning where the checkpoint stores the attention's maps apart (before they were
        packed): its weights load (each layer's attention packs them), its optimizer state does not fit."""
        if any(k.startswith(f"{name}.layers.") and k.endswith(".self_attn.q_proj.weight") for k in state_dict):
            logger.warning(
                "%s: this checkpoint stores UMST's attention projections apart (q_proj, k_proj, v_proj, word_q_proj, "
                "word_k_proj), as the plugin did before they were packed (in_proj, word_in_proj): its weights load, "
                "packed; to resume its training, add --reset-optimizer (the optimizer's state is per parameter tensor)",
                name)
        return super().upgrade_state_dict_named(state_dict, name)

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
        if self.max_relative_positions > 0:
            graphs = graphs._replace(relative_buckets=relative_buckets(
                src_tokens.size(1), self.max_relative_positions, src_tokens.device))
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
