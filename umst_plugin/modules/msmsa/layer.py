"""MSMSA's attention and layers behind fairseq's interfaces: multi-scale self-attention with the call
signature and incremental state of fairseq's MultiheadAttention, and the encoder / decoder layers that use it
(``--msmsa-no-ffn``: the paper's Eq. 10 layer without FFN)."""
from typing import Dict, List, Optional

import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor

from umst_plugin.modules.msmsa.windowed_attention import DEFAULT_DENSE_MAX_LEN, MultiScaleSelfAttention, Scale


@with_incremental_state
class FairseqMultiScaleSelfAttention(MultiScaleSelfAttention):
    """MultiScaleSelfAttention behind fairseq MultiheadAttention's call signature and incremental state."""

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = False, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        if (key is not None and key is not query) or (value is not None and value is not query) or static_kv:
            raise ValueError("multi-scale attention is self-attention only (query, key and value must be the same)")
        if before_softmax:
            raise ValueError("multi-scale attention does not return pre-softmax scores")
        if attn_mask is not None and not self.causal:
            raise ValueError("multi-scale encoder attention builds its own window masks; attn_mask is not supported")
        # (the decoder's attn_mask is fairseq's future mask: causal heads already look left only)
        cache = None
        if incremental_state is not None:
            cache = self._get_input_buffer(incremental_state)
        out, weights = super().forward(query, key_padding_mask, cache=cache,
                                       need_weights=need_weights or need_head_weights)
        if incremental_state is not None:
            self._set_input_buffer(incremental_state, cache)
        if weights is not None and not need_head_weights:
            weights = weights.mean(dim=1)  # fairseq averages over heads unless asked for each head
        return out, weights

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "attn_state")
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            for name, value in buffer.items():
                if value is not None:
                    buffer[name] = value.index_select(0, new_order)
            incremental_state = self._set_input_buffer(incremental_state, buffer)
        return incremental_state


class MSMSAEncoderLayer(TransformerEncoderLayerBase):
    """Transformer encoder layer with multi-scale self-attention; without FFN if ``no_ffn`` (Eq. 10)."""

    def __init__(self, cfg, head_scales: List[Scale], no_ffn: bool = False, min_block: int = 16,
                 dense_max_len: int = DEFAULT_DENSE_MAX_LEN):
        self.head_scales = head_scales  # read by build_self_attention inside super().__init__
        self.min_block = min_block
        self.dense_max_len = dense_max_len
        super().__init__(cfg)
        self.no_ffn = no_ffn
        if no_ffn:
            self.fc1 = self.fc2 = self.final_layer_norm = None

    def build_self_attention(self, embed_dim, cfg):
        return FairseqMultiScaleSelfAttention(embed_dim, cfg.encoder.attention_heads, self.head_scales,
                                              dropout=cfg.attention_dropout, causal=False, min_block=self.min_block,
                                              dense_max_len=self.dense_max_len)

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if not self.no_ffn:
            return super().forward(x, encoder_padding_mask, attn_mask)
        # Eq. 10: H_{l+1} = norm(H_l + ReLU(MSMSA(H_l))), with the layer norm placed as cfg says
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask, attn_mask=attn_mask)
        x = self.dropout_module(F.relu(x))
        x = residual + x
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        return x


class MSMSADecoderLayer(TransformerDecoderLayerBase):
    """Transformer decoder layer whose self-attention has causal multi-scale heads."""

    def __init__(self, cfg, head_scales: List[Scale], no_encoder_attn=False, min_block: int = 16,
                 dense_max_len: int = DEFAULT_DENSE_MAX_LEN):
        self.head_scales = head_scales
        self.min_block = min_block
        self.dense_max_len = dense_max_len
        super().__init__(cfg, no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError("--msmsa-decoder does not combine with bias_kv, zero_attn or --cross-self-attention")
        return FairseqMultiScaleSelfAttention(embed_dim, cfg.decoder.attention_heads, self.head_scales,
                                              dropout=cfg.attention_dropout, causal=True, min_block=self.min_block,
                                              dense_max_len=self.dense_max_len)
