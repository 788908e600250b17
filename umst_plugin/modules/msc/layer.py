"""Layers of the Multiscale Collaborative (MSC) deep NMT model.

Wei et al., "Multiscale Collaborative Deep Models for Neural Machine
Translation", ACL 2020 (../shared/papers/msc-acl2020.txt), section 3.

Plain PyTorch modules over time-major tensors (T x B x C); they reuse
fairseq's MultiheadAttention (and its incremental state), LayerNorm and
dropout, but know nothing of dictionaries, arguments or encoder-out dicts.

* :class:`FeatureFusion`   -- Eq. 12 / 13 gate  ``g*ATTN_h + (1-g)*ATTN_c``
                              (or plain addition, table 5 ablation).
* :class:`ContextCell`     -- Eq. 9 ``C^n = Q(C^{n-1}, B^n)``: a GRU cell
                              applied position-wise (or an FFN, table 5).
* :class:`MSCEncoderLayer` -- Eq. 10 / 12: pre-norm layer whose self-attention
                              is fused with attention over the context C^{n-1}.
* :class:`MSCDecoderLayer` -- Eq. 11 / 13: pre-norm decoder layer whose
                              cross-attention over block B^n is fused with
                              attention over the context C^n.

Every layer has two forms of the same math: the lean default (``lean.py``: the two attentions of Eq. 12 / 13
as one attention call, packed projections, one-kernel gate and dropout, masks and cross-attention keys/values
built once per stack by the caller; a preallocated incremental cache) and the reference form (``reference =
True``, ``modules.common.lean_ops.use_reference_path``): fairseq's attention modules one by one, as first written. Tests check they
agree (tests/test_msc_lean.py).
"""

from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq.modules import FairseqDropout, LayerNorm, MultiheadAttention

from umst_plugin.modules.msc import lean

FUSIONS = ("gate", "add")
CONTEXT_CELLS = ("gru", "ffn")


class FeatureFusion(nn.Module):
    """Fuse the hidden-state attention with the context attention.

    ``gate`` (Eq. 12): ``g = sigmoid(W1 a_h + W2 a_c + b)``,
    ``out = g * a_h + (1 - g) * a_c``.  W1 and W2 are stored as one
    ``Linear(2C, C)`` over ``[a_h; a_c]`` -- the same map and parameter count.
    ``add`` (table 5, "feature fusion with addition"): ``out = a_h + a_c``.

    ``record``: None (default, nothing kept) or a list to which every gated forward appends its gate
    ``g`` (like ``attn_hidden``, detached); set per instance by ``umst-inspect``.
    """

    record = None

    def __init__(self, embed_dim: int, mode: str = "gate"):
        super().__init__()
        if mode not in FUSIONS:
            raise ValueError(f"--msc-fusion must be one of {FUSIONS}, got {mode!r}")
        self.mode = mode
        self.gate_proj = nn.Linear(2 * embed_dim, embed_dim) if mode == "gate" else None
        if self.gate_proj is not None:
            nn.init.xavier_uniform_(self.gate_proj.weight)
            nn.init.zeros_(self.gate_proj.bias)

    def forward(self, attn_hidden: Tensor, attn_context: Tensor) -> Tensor:
        if self.gate_proj is None:
            return attn_hidden + attn_context
        gate = torch.sigmoid(self.gate_proj(torch.cat([attn_hidden, attn_context], dim=-1)))
        if self.record is not None:
            self.record.append(gate.detach())
        return gate * attn_hidden + (1.0 - gate) * attn_context


class ContextCell(nn.Module):
    """The contextual-collaboration cell Q of Eq. 9, applied position-wise.

    ``gru``: ``C^n = GRUCell(input=B^n, hidden=C^{n-1})`` at every source
    position (the recurrence runs over blocks, not over time).
    ``ffn`` (table 5 ablation, "implement Q as FFN"): the paper gives no
    formula; we use ``C^n = W2 ReLU(W1 [C^{n-1}; B^n] + b1) + b2`` with the
    encoder FFN width as hidden size.
    """

    def __init__(self, embed_dim: int, kind: str = "gru", ffn_dim: Optional[int] = None):
        super().__init__()
        if kind not in CONTEXT_CELLS:
            raise ValueError(f"--context-cell must be one of {CONTEXT_CELLS}, got {kind!r}")
        self.kind = kind
        if kind == "gru":
            self.gru = nn.GRUCell(embed_dim, embed_dim)
        else:
            hidden = ffn_dim or 4 * embed_dim
            self.fc1 = nn.Linear(2 * embed_dim, hidden)
            self.fc2 = nn.Linear(hidden, embed_dim)

    def forward(self, prev_context: Tensor, block_out: Tensor) -> Tensor:
        if self.kind == "ffn":
            return self.fc2(F.relu(self.fc1(torch.cat([prev_context, block_out], dim=-1))))
        shape = prev_context.shape
        # nn.GRUCell only takes 2-D input: flatten positions into the batch.
        new = self.gru(block_out.reshape(-1, shape[-1]), prev_context.reshape(-1, shape[-1]))
        return new.view(shape)


class _PreNormMSCLayer(nn.Module):
    """What MSC encoder and decoder layers share: pre-norm self-attention, the
    optional context attention fused with the layer's main attention (Eqs. 12 / 13),
    and the pre-norm FFN sub-layer."""

    compile_region = True  # --compile compiles it as one program (umst_plugin/compilation/regions.py)
    reference = False  # True: the reference form (fairseq's attention modules one by one); use_reference_path
    reference_switch = True  # (modules.common.lean_ops) switches it

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        num_heads: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        context_attention: bool = True,
        fusion: str = "gate",
    ):
        super().__init__()
        self.embed_dim = embed_dim
        self.self_attn = MultiheadAttention(
            embed_dim, num_heads, dropout=attention_dropout, self_attention=True
        )
        self.self_attn_layer_norm = LayerNorm(embed_dim)
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        if context_attention:
            # Keys/values come from the context state, queries from the layer's
            # normalised input: an encoder-decoder style attention with its own parameters.
            self.context_attn = self.new_cross_attention()
            self.fusion = FeatureFusion(embed_dim, fusion)
        else:
            self.context_attn = None
            self.fusion = None
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.activation_dropout_module = FairseqDropout(
            activation_dropout, module_name=self.__class__.__name__
        )
        # Default nn.Linear init, as fairseq's TransformerEncoderLayer uses.
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = LayerNorm(embed_dim)

    def new_cross_attention(self) -> MultiheadAttention:
        return MultiheadAttention(self.embed_dim, self.num_heads, dropout=self.attention_dropout,
                                  encoder_decoder_attention=True)

    def fuse_context(self, attn_h: Tensor, query: Tensor, context: Optional[Tensor],
                     padding_mask: Optional[Tensor], incremental_state=None) -> Tensor:
        """``Fuse(attn_h, ATTN_c(query, C, C))``; ``attn_h`` unchanged without context attention."""
        if self.context_attn is None:
            return attn_h
        if context is None:
            raise ValueError(f"this {self.__class__.__name__} has context attention: pass `context`")
        attn_c, _ = self.context_attn(
            query=query, key=context, value=context, key_padding_mask=padding_mask,
            incremental_state=incremental_state, static_kv=True, need_weights=False,
        )
        return self.fusion(attn_h, attn_c)

    def ffn_sublayer(self, x: Tensor) -> Tensor:
        """``FFN(LN(x)) + x``."""
        h = self.activation_dropout_module(F.relu(self.fc1(self.final_layer_norm(x))))
        return x + self.dropout_module(self.fc2(h))

    def lean_ffn_sublayer(self, x: Tensor) -> Tensor:
        """``FFN(LN(x)) + x`` with one-kernel dropouts (the same masks as :meth:`ffn_sublayer`)."""
        h = lean.dropout(F.relu(self.fc1(self.final_layer_norm(x))), self.activation_dropout_module)
        return x + lean.dropout(self.fc2(h), self.dropout_module)

    def attention_dropout_p(self, attn: MultiheadAttention) -> float:
        module = attn.dropout_module
        return module.p if module.p > 0 and (self.training or module.apply_during_inference) else 0.0


class MSCEncoderLayer(_PreNormMSCLayer):
    """One pre-norm encoder layer of block n (Eqs. 1, 10, 12).

    ``O = Fuse(ATTN_h(LN(H), LN(H), LN(H)), ATTN_c(LN(H), C, C)) + H``
    ``H' = FFN(LN(O)) + O``

    With ``context_attention=False`` (``--no-context-attention`` or
    ``--no-contextual-collaboration``) this is exactly fairseq's pre-norm
    TransformerEncoderLayer.
    """

    def forward(
        self,
        x: Tensor,
        padding_mask: Optional[Tensor],
        context: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        context_kv: Optional[Tensor] = None,
    ) -> Tensor:
        """x: T x B x C; padding_mask: B x T (True at pads); context: T x B x C; attn_mask: the additive key
        mask of ``padding_mask`` (``lean.key_mask``); context_kv: T x B x 2C, ``[k; v]`` of the context attention
        over ``context`` (the encoder computes those of a block's layers in one product). Both built here when
        not given."""
        if self.reference:
            return self.reference_forward(x, padding_mask, context)
        if self.context_attn is not None and context is None:
            raise ValueError(f"this {self.__class__.__name__} has context attention: pass `context`")
        tgt_len, bsz, dim = x.shape
        n_heads, device_type = self.num_heads, x.device.type
        if attn_mask is None and padding_mask is not None:
            attn_mask = lean.key_mask(padding_mask, lean.compute_dtype(x))
        sa, ca = self.self_attn, self.context_attn
        p = self.attention_dropout_p(sa)
        h = self.self_attn_layer_norm(x)
        if ca is None:
            weight, bias = lean.packed((sa.q_proj, sa.k_proj, sa.v_proj), device_type)
            q, k, v = F.linear(h, weight, bias).view(tgt_len, bsz, 3, n_heads, dim // n_heads).permute(
                2, 1, 3, 0, 4).unbind(0)
            attn_h = sa.out_proj(lean.merge_heads(lean.attend(q, k, v, attn_mask, p, sa.scaling)))
        else:
            # ATTN_h and ATTN_c (Eq. 12) as one attention of 2H heads: queries [q_h; q_c] from LN(H), keys and
            # values [k_h; k_c], [v_h; v_c] from LN(H) and C
            weight, bias = lean.packed((sa.q_proj, ca.q_proj, sa.k_proj, sa.v_proj), device_type)
            q, kv_h = F.linear(h, weight, bias).split([2 * dim, 2 * dim], dim=-1)
            kv_c = context_kv if context_kv is not None else F.linear(
                context, *lean.packed((ca.k_proj, ca.v_proj), device_type))
            kv = torch.cat([kv_h.view(tgt_len, bsz, 2, 1, dim), kv_c.view(tgt_len, bsz, 2, 1, dim)], dim=3)
            k, v = kv.view(tgt_len, bsz, 2, 2 * n_heads, dim // n_heads).permute(2, 1, 3, 0, 4).unbind(0)
            o = lean.attend(lean.heads(q, 2 * n_heads), k, v, attn_mask, p, sa.scaling)
            attn_h = lean.pair_out_and_fuse(lean.merge_heads(o, 2), sa.out_proj, ca.out_proj, self.fusion,
                                            shape=x.shape).view(x.shape)
        x = x + lean.dropout(attn_h, self.dropout_module)
        return self.lean_ffn_sublayer(x)

    def reference_forward(self, x: Tensor, padding_mask: Optional[Tensor], context: Optional[Tensor] = None
                          ) -> Tensor:
        """The reference form: fairseq's attention modules one by one."""
        residual = x
        h = self.self_attn_layer_norm(x)
        attn_h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=padding_mask,
                                   need_weights=False)
        attn_h = self.fuse_context(attn_h, h, context, padding_mask)
        x = residual + self.dropout_module(attn_h)
        return self.ffn_sublayer(x)


class MSCDecoderLayer(_PreNormMSCLayer):
    """One pre-norm decoder layer = decoder block n (Eqs. 2, 7, 11, 13).

    ``O = ATTN(LN(X), LN(X), LN(X)) + X`` (causal self-attention)
    ``S = Fuse(ATTN_h(LN(O), B^n, B^n), ATTN_c(LN(O), C^n, C^n)) + O``
    ``X' = FFN(LN(S)) + S``

    (Eq. 2 of the paper writes ``+ O`` in the FFN residual; that is a typo
    for ``+ S`` -- the standard pre-norm residual, which we follow.)
    Self-attention and both cross-attentions keep fairseq incremental state
    (cross-attention keys/values are cached with ``static_kv``).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.encoder_attn = self.new_cross_attention()
        self.encoder_attn_layer_norm = LayerNorm(self.embed_dim)
        self.need_attn = True

    def forward(
        self,
        x: Tensor,
        memory: Optional[Tensor],
        memory_padding_mask: Optional[Tensor],
        context: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
        self_mask: Optional[Tensor] = None,
        cross_mask: Optional[Tensor] = None,
        cross_kv: Optional[Tensor] = None,
        step: Optional["DecoderStep"] = None,
        need_weights: Optional[bool] = None,
    ):
        """x: T_tgt x B x C; memory/context: T_src x B x C; masks B x T (True at pads).

        Lean inputs the decoder builds once for all layers (each built here when not given): ``self_mask``
        (B x 1 x T x T additive: ``self_attn_mask`` and ``self_attn_padding_mask`` together), ``cross_mask``
        (B x 1 x 1 x S additive, of ``memory_padding_mask``), ``cross_kv`` (2 x B x KH x S x d: the keys and
        values of ``memory`` and, K = 2, ``context``); ``step``: the incremental cache (the lean incremental
        path; without it an ``incremental_state`` runs the reference form). ``need_weights``: whether to return
        the attention over ``memory`` (default: ``need_attn``, or in eval fairseq's ``self.need_attn``; the
        decoder asks only the layer whose attention it returns).

        Returns (x, attention over ``memory`` or None).
        """
        if need_head_weights:
            need_attn = True
        if need_weights is None:
            need_weights = need_attn or (not self.training and self.need_attn)
        if self.reference or (incremental_state is not None and step is None):
            return self.reference_forward(x, memory, memory_padding_mask, context, incremental_state,
                                          self_attn_mask, self_attn_padding_mask, need_attn, need_head_weights)
        if step is not None:
            return self.lean_step(x, step, need_weights, need_head_weights)
        tgt_len, bsz, dim = x.shape
        n_heads, device_type = self.num_heads, x.device.type
        head_dim = dim // n_heads
        dtype = lean.compute_dtype(x)
        if self_mask is None and (self_attn_mask is not None or self_attn_padding_mask is not None):
            self_mask = lean.causal_key_mask(self_attn_padding_mask, self_attn_mask, bsz, tgt_len, dtype,
                                             x.device)
        if cross_mask is None and memory_padding_mask is not None:
            cross_mask = lean.key_mask(memory_padding_mask, dtype)
        if cross_kv is None:
            cross_kv = self.cross_kv(memory, context)
        sa, ea, ca = self.self_attn, self.encoder_attn, self.context_attn

        residual = x
        h = self.self_attn_layer_norm(x)
        weight, bias = lean.packed((sa.q_proj, sa.k_proj, sa.v_proj), device_type)
        q, k, v = F.linear(h, weight, bias).view(tgt_len, bsz, 3, n_heads, head_dim).permute(
            2, 1, 3, 0, 4).unbind(0)
        o = lean.attend(q, k, v, self_mask, self.attention_dropout_p(sa), sa.scaling)
        x = residual + lean.dropout(sa.out_proj(lean.merge_heads(o)), self.dropout_module)

        # ATTN_h(LN(O), B^n, B^n) and ATTN_c(LN(O), C^n, C^n) (Eq. 13) as one attention of 2H heads
        residual = x
        h = self.encoder_attn_layer_norm(x)
        if ca is None:
            q = lean.heads(ea.q_proj(h), n_heads)
        else:
            weight, bias = lean.packed((ea.q_proj, ca.q_proj), device_type)
            q = lean.heads(F.linear(h, weight, bias), 2 * n_heads)
        k, v = cross_kv.unbind(0)
        o = lean.attend(q, k, v, cross_mask, self.attention_dropout_p(ea), ea.scaling)
        attn: Optional[Tensor] = None
        if need_weights:  # over B^n, before dropout, as fairseq's attention returns them: H x B x T x S
            attn = lean.attention_probs(q[:, :n_heads], k[:, :n_heads], cross_mask, ea.scaling).transpose(0, 1)
            if not need_head_weights:
                attn = attn.mean(dim=0)
        if ca is None:
            attn_h = ea.out_proj(lean.merge_heads(o))
        else:
            attn_h = lean.pair_out_and_fuse(lean.merge_heads(o, 2), ea.out_proj, ca.out_proj, self.fusion,
                                            shape=x.shape).view(x.shape)
        x = residual + lean.dropout(attn_h, self.dropout_module)
        return self.lean_ffn_sublayer(x), attn

    def cross_kv(self, memory: Tensor, context: Optional[Tensor]) -> Tensor:
        """The keys and values of both cross-attentions, 2 x B x KH x S x d (heads: ``encoder_attn``'s, then
        ``context_attn``'s), from one product."""
        attns = [self.encoder_attn] + ([self.context_attn] if self.context_attn is not None else [])
        if len(attns) == 2 and context is None:
            raise ValueError(f"this {self.__class__.__name__} has context attention: pass `context`")
        streams = torch.stack([memory, context]) if len(attns) == 2 else memory.unsqueeze(0)
        n_kinds, src_len, bsz, dim = streams.shape
        kv = lean.cross_kv_streams(streams, attns, memory.device.type)
        return kv.view(n_kinds, src_len, bsz, 2, self.num_heads, dim // self.num_heads).permute(
            3, 2, 0, 4, 1, 5).reshape(2, bsz, n_kinds * self.num_heads, src_len, dim // self.num_heads)

    def step_weights(self, device_type: str):
        """The packed weights of :meth:`lean_step` (built once per decoding by the decoder)."""
        sa, ea, ca = self.self_attn, self.encoder_attn, self.context_attn
        qkv = lean.packed((sa.q_proj, sa.k_proj, sa.v_proj), device_type)
        if ca is None:
            return qkv, (lean.cast(ea.q_proj.weight, device_type), lean.cast(ea.q_proj.bias, device_type)), None
        return (qkv, lean.packed((ea.q_proj, ca.q_proj), device_type),
                lean.pair_weights(ea.out_proj, ca.out_proj, self.fusion, device_type))

    def lean_step(self, x: Tensor, step: "DecoderStep", need_weights: bool, need_head_weights: bool):
        """One incremental decoding step (x: 1 x B x C) on the decoder's preallocated cache ``step``."""
        _, bsz, dim = x.shape
        n_heads = self.num_heads
        head_dim = dim // n_heads
        sa, ea, ca = self.self_attn, self.encoder_attn, self.context_attn
        (w_qkv, b_qkv), (w_q, b_q), pair = step.weights

        residual = x
        qkv = F.linear(self.self_attn_layer_norm(x), w_qkv, b_qkv).view(bsz, 3, n_heads, head_dim)
        step.self_kv[:, :, :, step.index].copy_(qkv[:, 1:])  # this token's key and value into the cache
        k = step.self_kv[:, 0, :, :step.index + 1]
        v = step.self_kv[:, 1, :, :step.index + 1]
        o = lean.attend(qkv[:, 0].unsqueeze(2), k, v, step.self_mask, self.attention_dropout_p(sa), sa.scaling)
        x = residual + lean.dropout(sa.out_proj(o.reshape(1, bsz, dim)), self.dropout_module)

        residual = x
        kinds = 1 if ca is None else 2
        q = F.linear(self.encoder_attn_layer_norm(x), w_q, b_q)
        # the cross keys/values are stored once per sentence when the decoder runs a beam (fairseq's beamable
        # cross-attention): a sentence's hypotheses are its queries
        kv_bsz = step.cross_k.size(0)
        beam = bsz // kv_bsz
        q = q.view(kv_bsz, beam, kinds * n_heads, head_dim).transpose(1, 2)
        o = lean.attend(q, step.cross_k, step.cross_v, step.cross_mask, self.attention_dropout_p(ea), ea.scaling)
        o = o.transpose(1, 2).reshape(bsz, kinds, dim)
        attn: Optional[Tensor] = None
        if need_weights:
            probs = lean.attention_probs(q[:, :n_heads], step.cross_k[:, :n_heads], step.cross_mask, ea.scaling)
            attn = probs.permute(1, 0, 2, 3).reshape(n_heads, bsz, 1, -1)
            if not need_head_weights:
                attn = attn.mean(dim=0)
        if ca is None:
            attn_h = ea.out_proj(o.view(1, bsz, dim))
        else:
            attn_h = lean.pair_out_and_fuse(o.transpose(0, 1), ea.out_proj, ca.out_proj, self.fusion,
                                            weights=pair, shape=x.shape).view(x.shape)
        x = residual + lean.dropout(attn_h, self.dropout_module)
        return self.lean_ffn_sublayer(x), attn

    def reference_forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_padding_mask: Optional[Tensor],
        context: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """The reference form: fairseq's attention modules one by one (their own incremental state)."""
        if need_head_weights:
            need_attn = True
        residual = x
        h = self.self_attn_layer_norm(x)
        h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                              incremental_state=incremental_state, need_weights=False,
                              attn_mask=self_attn_mask)
        x = residual + self.dropout_module(h)

        residual = x
        h = self.encoder_attn_layer_norm(x)
        attn_h, attn = self.encoder_attn(
            query=h, key=memory, value=memory, key_padding_mask=memory_padding_mask,
            incremental_state=incremental_state, static_kv=True,
            need_weights=need_attn or (not self.training and self.need_attn),
            need_head_weights=need_head_weights,
        )
        attn_h = self.fuse_context(attn_h, h, context, memory_padding_mask, incremental_state)
        x = residual + self.dropout_module(attn_h)
        return self.ffn_sublayer(x), attn

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.need_attn = need_attn


class DecoderStep:
    """What one lean incremental step of a decoder layer reads and writes (views of the decoder's cache):
    ``self_kv`` B x 2 x H x capacity x d (keys and values of the tokens so far; this step writes position
    ``index``), ``self_mask`` B x 1 x 1 x (index + 1) additive (or None), ``cross_k``/``cross_v`` B' x KH x S x d
    and ``cross_mask`` B' x 1 x 1 x S (B' = B, or the sentences of a beam), ``weights`` (``step_weights``)."""

    __slots__ = ("self_kv", "index", "self_mask", "cross_k", "cross_v", "cross_mask", "weights")

    def __init__(self, self_kv, index, self_mask, cross_k, cross_v, cross_mask, weights):
        self.self_kv, self.index, self.self_mask = self_kv, index, self_mask
        self.cross_k, self.cross_v, self.cross_mask, self.weights = cross_k, cross_v, cross_mask, weights
