"""MSC's encoder: N blocks of M pre-norm layers (:mod:`umst_plugin.modules.msc.layer`) with block outputs and the
context states of the contextual collaboration; and :func:`stacked_states`, the one tensor the decoder reads
them from."""
import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from fairseq.models import FairseqEncoder
from fairseq.modules import FairseqDropout, LayerNorm, PositionalEmbedding

from umst_plugin.modules.msc import lean
from umst_plugin.modules.msc.layer import ContextCell, MSCEncoderLayer


class MSCEncoder(FairseqEncoder):
    """N blocks x M pre-norm layers with block outputs and context states.

    ``forward`` returns fairseq's encoder-out dict plus
    ``msc_block_out``: the N layer-normalised block outputs (T x B x C; only
    the top one with ``--no-block-collaboration``) and ``msc_context``:
    C^1..C^N (T x B x C; empty with ``--no-contextual-collaboration``).
    All of them share ``encoder_padding_mask`` (B x T), which is the padding
    mask of every position-wise state. ``msc_states`` holds them stacked
    (``[B^1..B^N, C^1..C^N]``, (N_b + N_c) x T x B x C; the lists are views of
    it): the decoder computes every cross-attention's keys and values from it
    in one product, and a beam reorder is one ``index_select`` for all of them.
    (The reference form, ``reference = True``, returns the lists alone.)
    """

    reference_switch = True  # modules.common.lean_ops.use_reference_path switches it
    reference = False

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        self.register_buffer("version", torch.Tensor([3]))
        embed_dim = embed_tokens.embedding_dim
        self.padding_idx = embed_tokens.padding_idx
        self.max_source_positions = args.max_source_positions
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if args.no_scale_embedding else math.sqrt(embed_dim)
        self.embed_positions = (
            PositionalEmbedding(args.max_source_positions, embed_dim, self.padding_idx,
                                learned=args.encoder_learned_pos)
            if not args.no_token_positional_embeddings else None
        )
        self.dropout_module = FairseqDropout(args.dropout, module_name=self.__class__.__name__)

        self.num_blocks = args.encoder_blocks
        self.layers_per_block = args.encoder_layers_per_block
        self.block_collaboration = not args.no_block_collaboration
        self.contextual_collaboration = not args.no_contextual_collaboration
        encoder_context_attention = self.contextual_collaboration and not args.no_context_attention

        # Flat list: layer i (0-based) belongs to block i // M.  Same state-dict
        # names as fairseq's encoder ("encoder.layers.{i}.").
        self.layers = nn.ModuleList([
            MSCEncoderLayer(
                embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads,
                dropout=args.dropout, attention_dropout=args.attention_dropout,
                activation_dropout=args.activation_dropout,
                context_attention=encoder_context_attention, fusion=args.msc_fusion,
            )
            for _ in range(self.num_blocks * self.layers_per_block)
        ])
        self.num_layers = len(self.layers)

        # Block n's output is normalised when someone reads it: the decoder
        # (block collaboration), the context cell, or -- for the top block --
        # always (the final LayerNorm of a pre-norm encoder).
        self.block_layer_norms = nn.ModuleDict({
            str(n): LayerNorm(embed_dim)
            for n in range(self.num_blocks)
            if n == self.num_blocks - 1 or self.block_collaboration or self.contextual_collaboration
        })
        self.context_cell = (
            ContextCell(embed_dim, args.context_cell, args.encoder_ffn_embed_dim)
            if self.contextual_collaboration else None
        )

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None
    ):
        """src_tokens: B x T."""
        padding_mask = src_tokens.eq(self.padding_idx)
        if token_embeddings is None:
            token_embeddings = self.embed_tokens(src_tokens)
        x = embedding = self.embed_scale * token_embeddings
        if self.embed_positions is not None:
            x = x + self.embed_positions(src_tokens)
        x = self.dropout_module(x) if self.reference else lean.dropout(x, self.dropout_module)
        x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)
        x = x.transpose(0, 1)  # T x B x C
        # the additive key mask every layer's attention reads, built once
        attn_mask = None if self.reference else lean.key_mask(padding_mask, lean.compute_dtype(x))

        context = x  # C^0 (Eq. 9)
        block_outs: List[Tensor] = []
        contexts: List[Tensor] = []
        encoder_states: List[Tensor] = []
        for n in range(self.num_blocks):
            block = self.layers[n * self.layers_per_block:(n + 1) * self.layers_per_block]
            context_kvs = self._context_kvs(block, context)
            for i, layer in enumerate(block):
                x = layer(x, padding_mask, context if layer.context_attn is not None else None, attn_mask,
                          context_kvs[i] if context_kvs is not None else None)
                if return_all_hiddens:
                    encoder_states.append(x)
            key = str(n)
            if key not in self.block_layer_norms:
                continue
            block_out = self.block_layer_norms[key](x)
            if self.block_collaboration or n == self.num_blocks - 1:
                block_outs.append(block_out)
            if self.context_cell is not None:
                context = self.context_cell(context, block_out)  # C^{n+1} (1-based n+1)
                contexts.append(context)

        states: List[Tensor] = []
        if not self.reference:
            stacked = torch.stack(block_outs + contexts)
            states = [stacked]
            block_outs = list(stacked[:len(block_outs)].unbind(0))
            contexts = list(stacked[len(block_outs):].unbind(0))
        return {
            "encoder_out": [block_outs[-1]],  # T x B x C, top block, normalised
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "src_tokens": [],
            "src_lengths": [src_lengths] if src_lengths is not None else [],
            "msc_block_out": block_outs,  # N (or 1) x [T x B x C]
            "msc_context": contexts,  # N (or 0) x [T x B x C]
            "msc_states": states,  # [the two lists stacked] (empty in the reference form)
        }

    def _context_kvs(self, block, context):
        """The keys and values of every context attention of a block (they all read C^{n-1}) from one
        product: per layer T x B x 2C (None in the reference form, or without context attention)."""
        if self.reference or len(block) < 2 or any(l.context_attn is None or l.reference for l in block):
            return None
        weight, bias = lean.packed([p for l in block for p in (l.context_attn.k_proj, l.context_attn.v_proj)],
                                   context.device.type)
        return torch.nn.functional.linear(context, weight, bias).split(2 * context.size(-1), dim=-1)

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        """Reorder every batch-indexed tensor, block outputs and contexts included (with ``msc_states``: one
        ``index_select`` for all of them and the top block, the lists views of it)."""
        time_major = ("encoder_out", "encoder_states", "msc_block_out", "msc_context")
        reordered: Dict[str, List[Tensor]] = {}
        stacked = stacked_states(encoder_out)
        if stacked is not None:
            states = stacked.index_select(2, new_order)
            n_blocks = len(encoder_out["msc_block_out"])
            reordered["msc_states"] = [states]
            reordered["msc_block_out"] = list(states[:n_blocks].unbind(0))
            reordered["msc_context"] = list(states[n_blocks:].unbind(0))
            reordered["encoder_out"] = [states[n_blocks - 1]]
        for key, tensors in encoder_out.items():
            if key in reordered:
                continue
            dim = 1 if key in time_major else 0
            reordered[key] = [t.index_select(dim, new_order) for t in tensors]
        return reordered

    def max_positions(self):
        if self.embed_positions is None:
            return self.max_source_positions
        return min(self.max_source_positions, self.embed_positions.max_positions)


def stacked_states(encoder_out) -> Optional[Tensor]:
    """``msc_states``'s tensor if ``msc_block_out`` and ``msc_context`` are still its views, in order (else None:
    someone replaced an entry of the lists, which then hold the truth)."""
    stacked = encoder_out.get("msc_states", [])
    if len(stacked) == 0:
        return None
    states = stacked[0]
    entries = list(encoder_out["msc_block_out"]) + list(encoder_out["msc_context"])
    if len(entries) != states.size(0):
        return None
    step = states.stride(0) * states.element_size()
    for i, t in enumerate(entries):
        if (t.data_ptr() != states.data_ptr() + i * step or t.shape != states.shape[1:]
                or t.stride() != states.stride()[1:]):
            return None
    return states
