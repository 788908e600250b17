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

import logging
import math
import os
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from fairseq import utils
from fairseq.logging import metrics
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    register_model,
    register_model_architecture,
)
from fairseq.models.transformer import Embedding, TransformerModel
from fairseq.models.transformer.transformer_decoder import TransformerDecoder
from fairseq.models.transformer import transformer_legacy
from fairseq.modules import FairseqDropout, LayerNorm, PositionalEmbedding

from umst_plugin import families
from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models._sizes import transformer_big_sizes
from umst_plugin.modules.msc.grad_norms import EncoderGradNormLogger, PerTokenLossTerm
from umst_plugin.modules.msc import lean
from umst_plugin.modules.msc.layers import (
    CONTEXT_CELLS,
    FUSIONS,
    ContextCell,
    DecoderStep,
    MSCDecoderLayer,
    MSCEncoderLayer,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_POSITIONS = 1024
GRAD_NORMS_FILENAME = "encoder_grad_norms.jsonl"


# ----------------------------------------------------------------------------
# Encoder
# ----------------------------------------------------------------------------


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

    reference_switch = True  # modules.common.reference.use_reference_path switches it
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


# ----------------------------------------------------------------------------
# Decoder
# ----------------------------------------------------------------------------


class MSCDecoder(TransformerDecoder):
    """fairseq's pre-norm Transformer decoder whose layer n reads encoder block n and C^n.

    Lean path (the default): the self-attention mask (causal + target padding) and the source key mask are
    built once per forward for all layers, and the keys and values of every layer's two cross-attentions (over
    B^n and C^n) come from one ``baddbmm`` over the encoder's stacked states. Incremental decoding keeps one
    preallocated cache for all layers' self-attention keys/values and the target padding mask (one
    ``index_select`` per beam reorder) and one for the cross-attention keys/values and source mask, built at
    the first step (once per sentence under a beam, as fairseq's beamable attention; reordered only when the
    batch shrinks, fairseq's rule), and the layers' packed weights, cast and concatenated once per decoding.
    ``reference = True`` (``modules.common.reference.use_reference_path``) runs the decoder as first written (fairseq's
    attention modules and their incremental state, per layer).
    """

    reference_switch = True
    reference = False
    INITIAL_CAPACITY = 16  # target positions the self-attention cache holds at first; doubled when full

    def __init__(self, args, dictionary, embed_tokens):
        self.args = args
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=False)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        args = self.args
        return MSCDecoderLayer(
            args.decoder_embed_dim, args.decoder_ffn_embed_dim, args.decoder_attention_heads,
            dropout=args.dropout, attention_dropout=args.attention_dropout,
            activation_dropout=args.activation_dropout,
            context_attention=not args.no_contextual_collaboration, fusion=args.msc_fusion,
        )

    # ---- the layers' inputs ------------------------------------------------------------------------------

    def _streams(self, encoder_out):
        """(memory of layer n, context of layer n or None) for every layer."""
        block_outs, contexts = encoder_out["msc_block_out"], encoder_out["msc_context"]
        out = []
        for idx in range(self.num_layers):
            # Block-scale collaboration: layer n reads block n (Eq. 7); without
            # it every layer reads the top block (plain encoder-decoder).
            memory = block_outs[idx] if len(block_outs) == self.num_layers else block_outs[-1]
            context = contexts[idx] if len(contexts) > 0 else None
            out.append((memory, context))
        return out

    def _cross_kv_all(self, encoder_out, beam: int = 1) -> Tensor:
        """Every layer's cross-attention keys and values from one product: K*N x (S * B') x 2C, streams
        ``[B^1..B^N, C^1..C^N]`` (K = 2; K = 1 without contextual collaboration); B' = B / ``beam`` (the first
        row of every sentence's beam)."""
        kinds = 2 if len(encoder_out["msc_context"]) > 0 else 1
        n = self.num_layers
        stacked = stacked_states(encoder_out)
        if stacked is not None and len(encoder_out["msc_block_out"]) == n and stacked.size(0) == kinds * n:
            inputs = stacked
        else:
            streams = self._streams(encoder_out)
            inputs = torch.stack([m for m, _ in streams] + ([c for _, c in streams] if kinds == 2 else []))
        if beam > 1:
            inputs = inputs[:, :, ::beam]
        attns = [layer.encoder_attn for layer in self.layers]
        if kinds == 2:
            attns += [layer.context_attn for layer in self.layers]
        return lean.cross_kv_streams(inputs, attns, inputs.device.type)

    def _layout(self, kinds: int):
        dim = self.layers[0].embed_dim
        heads = self.layers[0].num_heads
        return self.num_layers, kinds, heads, dim // heads

    # ---- the incremental cache ---------------------------------------------------------------------------

    def _new_cache(self, encoder_out, bsz: int):
        """The lean incremental cache (first step): cross keys/values of every layer, the source mask, an
        empty self-attention cache, the layers' packed weights."""
        padding_mask = encoder_out["encoder_padding_mask"][0]
        kinds = 2 if len(encoder_out["msc_context"]) > 0 else 1
        n, _, heads, head_dim = self._layout(kinds)
        src_len, enc_bsz = encoder_out["msc_block_out"][0].shape[:2]
        beam = getattr(self, "_beam_size", 1)
        if not (beam > 1 and enc_bsz == bsz and bsz % beam == 0):  # fairseq's beamable attention condition
            beam = 1
        kv = self._cross_kv_all(encoder_out, beam)  # K*N x (S * B') x 2C
        kv_bsz = enc_bsz // beam
        dtype, device = kv.dtype, kv.device
        kv_size = lean.aligned(n * 2 * kinds * heads * src_len * head_dim)
        cross = torch.empty(kv_bsz, kv_size + lean.aligned(src_len), dtype=dtype, device=device)
        cross[:, :n * 2 * kinds * heads * src_len * head_dim].view(
            kv_bsz, n, 2, kinds, heads, src_len, head_dim).copy_(
            kv.view(kinds, n, src_len, kv_bsz, 2, heads, head_dim).permute(3, 1, 4, 0, 5, 2, 6))
        mask = cross[:, kv_size:kv_size + src_len]
        mask.fill_(0).masked_fill_(padding_mask[::beam], lean.lowest(dtype))
        meta = _CacheLayout(n, kinds, heads, head_dim, src_len, beam, self.INITIAL_CAPACITY, kv_size,
                            [layer.step_weights(device.type) for layer in self.layers])
        return {"self": self._empty_self_cache(meta, bsz, dtype, device), "cross": cross, "meta": meta}

    @staticmethod
    def _empty_self_cache(meta, bsz, dtype, device):
        return torch.zeros(bsz, meta.self_size(), dtype=dtype, device=device)

    def _grow(self, cache):
        """Double the self-attention cache's capacity (its keys, values and mask copied over)."""
        meta = cache["meta"]
        old, old_meta = cache["self"], meta.copy()
        meta.capacity *= 2
        new = self._empty_self_cache(meta, old.size(0), old.dtype, old.device)
        meta.self_kv(new)[..., :old_meta.capacity, :].copy_(old_meta.self_kv(old))
        meta.self_mask(new)[..., :old_meta.capacity].copy_(old_meta.self_mask(old))
        cache["self"] = new

    def reorder_incremental_state(self, incremental_state, new_order):
        """The lean cache: the self-attention part (keys, values, target mask of every layer) in one
        ``index_select``; the cross-attention part only when the batch changes size (fairseq's rule for its
        static keys/values: a beam reorder keeps each sentence's hypotheses together, whose cross keys and values
        are equal). The reference form's states are reordered by fairseq's attention modules."""
        cache = self.get_incremental_state(incremental_state, "msc_lean")
        if cache is None:
            return
        cache["self"] = cache["self"].index_select(0, new_order)
        cross, beam = cache["cross"], cache["meta"].beam
        if cross.size(0) * beam != new_order.size(0):
            index = new_order.view(-1, beam)[:, 0] // beam if beam > 1 else new_order
            cache["cross"] = cross.index_select(0, index)

    def _has_reference_state(self, incremental_state) -> bool:
        attn = self.layers[0].self_attn
        return len(attn._get_input_buffer(incremental_state)) > 0

    # ---- forward -----------------------------------------------------------------------------------------

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        if encoder_out is None or "msc_block_out" not in encoder_out:
            raise ValueError("MSCDecoder needs the encoder-out dict of MSCEncoder")
        cache = None
        if incremental_state is not None and not self.reference:
            cache = self.get_incremental_state(incremental_state, "msc_lean")
            if cache is None and not torch.is_grad_enabled() and not self._has_reference_state(incremental_state):
                cache = self._new_cache(encoder_out, prev_output_tokens.size(0))
                self.set_incremental_state(incremental_state, "msc_lean", cache)
            # (with autograd on, incremental decoding keeps the reference form's state: the lean cache is
            # written in place)
        if self.reference or (incremental_state is not None and cache is None):
            return self.reference_extract_features(prev_output_tokens, encoder_out, incremental_state,
                                                   full_context_alignment, alignment_layer, alignment_heads)
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        padding_mask = encoder_out["encoder_padding_mask"][0]
        x, prev_output_tokens = self._embed(prev_output_tokens, incremental_state, lean_dropout=True)
        tgt_len, bsz, _ = x.shape
        self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        if cache is None:
            dtype = lean.compute_dtype(x)
            future = None if full_context_alignment else self.buffered_future_mask(x)
            self_mask = lean.causal_key_mask(self_attn_padding_mask, future, bsz, tgt_len, dtype, x.device)
            cross_mask = lean.key_mask(padding_mask, dtype)
            kinds = 2 if len(encoder_out["msc_context"]) > 0 else 1
            n, _, heads, head_dim = self._layout(kinds)
            src_len = padding_mask.size(1)
            cross_kv = self._cross_kv_all(encoder_out).view(kinds, n, src_len, bsz, 2, heads, head_dim).permute(
                1, 4, 3, 0, 5, 2, 6).reshape(n, 2, bsz, kinds * heads, src_len, head_dim).unbind(0)
            for idx, (layer, (memory, context)) in enumerate(zip(self.layers, self._streams(encoder_out))):
                x, layer_attn = layer(
                    x, memory, padding_mask, context,
                    self_attn_mask=future if layer.reference else None,
                    self_attn_padding_mask=self_attn_padding_mask if layer.reference else None,
                    need_attn=bool(idx == alignment_layer),
                    need_head_weights=bool(idx == alignment_layer),
                    self_mask=self_mask, cross_mask=cross_mask, cross_kv=cross_kv[idx],
                    need_weights=bool(idx == alignment_layer),
                )
                inner_states.append(x)
                if layer_attn is not None and idx == alignment_layer:
                    attn = layer_attn.float().to(x)
        else:
            meta = cache["meta"]
            index = meta.length
            if index == meta.capacity:
                self._grow(cache)
            self_kv = meta.self_kv(cache["self"])
            self_mask = meta.self_mask(cache["self"])
            self_mask[:, 0, 0, index].masked_fill_(self_attn_padding_mask[:, -1], lean.lowest(self_mask.dtype))
            self_mask = self_mask[..., :index + 1]
            cross_kv, cross_mask = meta.cross_kv(cache["cross"]), meta.cross_mask(cache["cross"])
            for idx, layer in enumerate(self.layers):
                step = DecoderStep(self_kv[:, idx], index, self_mask, cross_kv[:, idx, 0], cross_kv[:, idx, 1],
                                   cross_mask, meta.weights[idx])
                x, layer_attn = layer(
                    x, None, None, None, incremental_state=incremental_state,
                    need_attn=bool(idx == alignment_layer), need_head_weights=bool(idx == alignment_layer),
                    step=step, need_weights=bool(idx == alignment_layer),
                )
                inner_states.append(x)
                if layer_attn is not None and idx == alignment_layer:
                    attn = layer_attn.float().to(x)
            meta.length = index + 1
        return self._finish(x, attn, alignment_heads, inner_states)

    def _embed(self, prev_output_tokens, incremental_state, lean_dropout: bool):
        """Token + position embeddings of the target (its last token when incremental), T x B x C, and the
        tokens embedded."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        prev_output_tokens = prev_output_tokens.contiguous()
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = lean.dropout(x, self.dropout_module) if lean_dropout else self.dropout_module(x)
        return x.transpose(0, 1), prev_output_tokens

    def _finish(self, x, attn, alignment_heads, inner_states):
        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

    def reference_extract_features(
        self,
        prev_output_tokens,
        encoder_out: Dict[str, List[Tensor]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """The reference form: per layer masks and fairseq's attention modules with their incremental state."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        padding_mask = encoder_out["encoder_padding_mask"][0]
        x, prev_output_tokens = self._embed(prev_output_tokens, incremental_state, lean_dropout=False)

        # Always the mask: fairseq's decoder tests prev_output_tokens for padding with a Python ``if`` on a
        # device tensor (a host-device sync on every call, every beam step); a mask without padding is exact.
        self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        for idx, (layer, (memory, context)) in enumerate(zip(self.layers, self._streams(encoder_out))):
            self_attn_mask = (
                self.buffered_future_mask(x)
                if incremental_state is None and not full_context_alignment else None
            )
            x, layer_attn = layer.reference_forward(
                x, memory, padding_mask, context,
                incremental_state=incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)
        return self._finish(x, attn, alignment_heads, inner_states)


class _CacheLayout:
    """Where the lean incremental cache keeps what (per row: the self part, B rows; the cross part, B' rows)."""

    def __init__(self, n_layers, kinds, heads, head_dim, src_len, beam, capacity, cross_kv_size, weights,
                 length=0):
        self.n_layers, self.kinds, self.heads, self.head_dim = n_layers, kinds, heads, head_dim
        self.src_len, self.beam, self.capacity, self.cross_kv_size = src_len, beam, capacity, cross_kv_size
        self.weights, self.length = weights, length

    def copy(self):
        return _CacheLayout(self.n_layers, self.kinds, self.heads, self.head_dim, self.src_len, self.beam,
                            self.capacity, self.cross_kv_size, self.weights, self.length)

    def _self_kv_size(self):
        return self.n_layers * 2 * self.heads * self.capacity * self.head_dim

    def self_size(self):
        return lean.aligned(self._self_kv_size()) + lean.aligned(self.capacity)

    def self_kv(self, buf):
        """B x N x 2 x H x capacity x d."""
        return buf[:, :self._self_kv_size()].view(buf.size(0), self.n_layers, 2, self.heads, self.capacity,
                                                  self.head_dim)

    def self_mask(self, buf):
        """B x 1 x 1 x capacity additive mask of the target tokens so far (0 / lowest at padding)."""
        start = lean.aligned(self._self_kv_size())
        return buf[:, start:start + self.capacity].view(buf.size(0), 1, 1, self.capacity)

    def cross_kv(self, buf):
        """B' x N x 2 x KH x S x d."""
        return buf[:, :self.n_layers * 2 * self.kinds * self.heads * self.src_len * self.head_dim].view(
            buf.size(0), self.n_layers, 2, self.kinds * self.heads, self.src_len, self.head_dim)

    def cross_mask(self, buf):
        return buf[:, self.cross_kv_size:self.cross_kv_size + self.src_len].view(buf.size(0), 1, 1, self.src_len)


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
        parser.add_argument("--encoder-blocks", type=int, metavar="N",
                            help="number of encoder blocks N (= decoder layers); paper: 6")
        parser.add_argument("--encoder-layers-per-block", type=int, metavar="M",
                            help="encoder layers per block M; encoder depth = N*M "
                                 "(paper: 6x6=36, 6x8=48, 6x9=54, 6x12=72)")
        parser.add_argument("--msc-fusion", choices=FUSIONS,
                            help="fuse hidden and context attention with the sigmoid gate of "
                                 "Eqs. 12-13 (gate) or by addition (add; table 5 ablation)")
        parser.add_argument("--context-cell", choices=CONTEXT_CELLS,
                            help="contextual collaboration cell Q of Eq. 9: gru, or ffn "
                                 "(table 5 ablation)")
        parser.add_argument("--no-context-attention", action="store_true",
                            help="remove the encoder's attention over C^{n-1} (CXT-ENC "
                                 "attention, table 5); the decoder still attends C^n")
        parser.add_argument("--no-contextual-collaboration", action="store_true",
                            help="remove the context cell and all context attention (table 5)")
        parser.add_argument("--no-block-collaboration", action="store_true",
                            help="every decoder layer attends the top encoder block; with "
                                 "--no-contextual-collaboration this is the plain deep pre-norm "
                                 "Transformer of figure 2")
        parser.add_argument("--encoder-l2", type=float, metavar="LAMBDA",
                            help="L2 penalty LAMBDA*sum ||W||^2 over encoder weight matrices "
                                 "(not embeddings, biases or LayerNorm), added to the per-token "
                                 "training loss; paper: 1e-5 for 72-layer IWSLT (table 2)")
        parser.add_argument("--log-encoder-grad-norms", action="store_true",
                            help="during training, write per-encoder-layer gradient norms "
                                 "(figure 5) as JSONL to --encoder-grad-norms-file")
        parser.add_argument("--encoder-grad-norms-file", type=str, metavar="PATH",
                            help=f"default: <save-dir>/{GRAD_NORMS_FILENAME}")
        parser.add_argument("--encoder-grad-norms-interval", type=int, metavar="K",
                            help="log every K updates (default 1)")

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

        if args.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError("--share-all-embeddings requires a joined dictionary")
            if args.decoder_embed_path and args.decoder_embed_path != args.encoder_embed_path:
                raise ValueError("--share-all-embeddings not compatible with --decoder-embed-path")
            encoder_embed = build_embedding(src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            decoder_embed = encoder_embed
            args.share_decoder_input_output_embed = True
        else:
            encoder_embed = build_embedding(src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            decoder_embed = build_embedding(tgt_dict, args.decoder_embed_dim, args.decoder_embed_path)
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

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        lprobs = super().get_normalized_probs(net_output, log_probs, sample)
        hooked = self.encoder_l2 > 0 or self.grad_norm_logger is not None
        if not (hooked and self.training and log_probs and lprobs.requires_grad):
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


# ----------------------------------------------------------------------------
# Architectures
# ----------------------------------------------------------------------------


@register_model_architecture("msc", "msc")
def msc_base_architecture(args):
    args.encoder_blocks = getattr(args, "encoder_blocks", 6)
    args.encoder_layers_per_block = getattr(args, "encoder_layers_per_block", 1)
    args.encoder_layers = getattr(args, "encoder_layers",
                                  args.encoder_blocks * args.encoder_layers_per_block)
    args.decoder_layers = getattr(args, "decoder_layers", args.encoder_blocks)
    # MSC layers are pre-norm by construction (section 2).
    args.encoder_normalize_before = True
    args.decoder_normalize_before = True
    args.attention_dropout = getattr(args, "attention_dropout", 0.1)  # dp_a (table 2)
    args.msc_fusion = getattr(args, "msc_fusion", "gate")
    args.context_cell = getattr(args, "context_cell", "gru")
    args.no_context_attention = getattr(args, "no_context_attention", False)
    args.no_contextual_collaboration = getattr(args, "no_contextual_collaboration", False)
    args.no_block_collaboration = getattr(args, "no_block_collaboration", False)
    args.encoder_l2 = getattr(args, "encoder_l2", 0.0)
    args.log_encoder_grad_norms = getattr(args, "log_encoder_grad_norms", False)
    args.encoder_grad_norms_file = getattr(args, "encoder_grad_norms_file", None)
    args.encoder_grad_norms_interval = getattr(args, "encoder_grad_norms_interval", 1)
    transformer_legacy.base_architecture(args)


@register_model_architecture("msc", "msc_iwslt_de_en")
def msc_iwslt_de_en(args):
    """transformer_iwslt_de_en sizes (256 / 512 / 4 heads), table 2."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 256)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 512)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 256)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 512)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    msc_base_architecture(args)


@register_model_architecture("msc", "msc_base")
def msc_base(args):
    """transformer_base sizes (512 / 2048 / 8 heads), table 4."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 512)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 2048)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 8)
    msc_base_architecture(args)


@register_model_architecture("msc", "msc_big")
def msc_big(args):
    """transformer_big sizes (1024 / 4096 / 16 heads), table 4."""
    transformer_big_sizes(args)
    msc_base_architecture(args)


families.register(families.Family(
    name="msc", title="MSC", paper="Wei et al., ACL 2020: Multiscale Collaborative Deep Models for NMT",
    model=MSCModel, encoder=MSCEncoder, layers=(MSCEncoderLayer, MSCDecoderLayer),
    bench_rows={"msc": families.BenchRow("msc_base", "msc_big", quick=dict(encoder_blocks=2, encoder_layers_per_block=1),
                                         baseline="transformer_dropout")}))
