"""MSC's decoder: fairseq's pre-norm transformer decoder whose layer n reads encoder block n and the context C^n
(block-scale and contextual collaboration, Eqs. 5-7 and 13), with its lean path and incremental cache."""
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq.models.transformer.transformer_decoder import TransformerDecoder

from umst_plugin.models.msc.encoder import stacked_states
from umst_plugin.modules.msc import lean
from umst_plugin.modules.msc.layer import DecoderStep, MSCDecoderLayer


class MSCDecoder(TransformerDecoder):
    """fairseq's pre-norm Transformer decoder whose layer n reads encoder block n and C^n.

    Lean path (the default): the self-attention mask (causal + target padding) and the source key mask are
    built once per forward for all layers, and the keys and values of every layer's two cross-attentions (over
    B^n and C^n) come from one ``baddbmm`` over the encoder's stacked states. Incremental decoding keeps one
    preallocated cache for all layers' self-attention keys/values and the target padding mask (one
    ``index_select`` per beam reorder) and one for the cross-attention keys/values and source mask, built at
    the first step (once per sentence under a beam, as fairseq's beamable attention; reordered only when the
    batch shrinks, fairseq's rule), and the layers' packed weights, cast and concatenated once per decoding.
    ``reference = True`` (``modules.common.lean_ops.use_reference_path``) runs the decoder as first written (fairseq's
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
