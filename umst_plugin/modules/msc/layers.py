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
"""

from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq.modules import FairseqDropout, LayerNorm, MultiheadAttention

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
    ) -> Tensor:
        """x: T x B x C; padding_mask: B x T (True at pads); context: T x B x C."""
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
        memory: Tensor,
        memory_padding_mask: Optional[Tensor],
        context: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """x: T_tgt x B x C; memory/context: T_src x B x C; masks B x T (True at pads).

        Returns (x, attention over ``memory`` or None).
        """
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
