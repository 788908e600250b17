"""MSMSA: multi-scale multi-head self-attention (Guo et al., AAAI 2020) as a fairseq translation model.

The encoder is a (pre-norm, as in the UMST paper's re-implementation, its table 2)
transformer whose self-attention heads each see a window of their own scale
(``umst_plugin.modules.windowed_attention``); the scales of each layer's heads
come from the control factor alpha (Eq. 11-12) or an explicit allocation. The
decoder is the standard transformer decoder unless ``--msmsa-decoder`` gives its
self-attention causal (left-only) multi-scale heads. ``--msmsa-no-ffn`` is the
paper's classification layer (Eq. 10): ``H + ReLU(MSMSA(H))``, no FFN.

The attention modules have exactly the parameters of fairseq's
MultiheadAttention, so ``msmsa_base`` has the parameter count of the pre-norm
transformer base (the UMST paper lists both at 65M).
"""
from typing import Dict, List, Optional

import torch.nn.functional as F
from fairseq.distributed import fsdp_wrap
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerEncoder,
    TransformerModel,
    base_architecture,
    transformer_vaswani_wmt_en_de_big,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor

from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.modules.windowed_attention import (
    DEFAULT_SCALES,
    MultiScaleSelfAttention,
    Scale,
    alpha_head_allocation,
    heads_from_counts,
    parse_head_allocation,
    parse_scales,
)


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

    def __init__(self, cfg, head_scales: List[Scale], no_ffn: bool = False, min_block: int = 16):
        self.head_scales = head_scales  # read by build_self_attention inside super().__init__
        self.min_block = min_block
        super().__init__(cfg)
        self.no_ffn = no_ffn
        if no_ffn:
            self.fc1 = self.fc2 = self.final_layer_norm = None

    def build_self_attention(self, embed_dim, cfg):
        return FairseqMultiScaleSelfAttention(embed_dim, cfg.encoder.attention_heads, self.head_scales,
                                              dropout=cfg.attention_dropout, causal=False, min_block=self.min_block)

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

    def __init__(self, cfg, head_scales: List[Scale], no_encoder_attn=False, min_block: int = 16):
        self.head_scales = head_scales
        self.min_block = min_block
        super().__init__(cfg, no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError("--msmsa-decoder does not combine with bias_kv, zero_attn or --cross-self-attention")
        return FairseqMultiScaleSelfAttention(embed_dim, cfg.decoder.attention_heads, self.head_scales,
                                              dropout=cfg.attention_dropout, causal=True, min_block=self.min_block)


def _wrap(layer, cfg):
    # as fairseq's build_encoder_layer / build_decoder_layer
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def _config(cfg_or_args):
    return cfg_or_args if isinstance(cfg_or_args, TransformerConfig) else TransformerConfig.from_namespace(cfg_or_args)


def layer_head_scales(args, decoder: bool = False) -> List[List[Scale]]:
    """One list of per-head scales for each layer of the encoder (or decoder) from the msmsa args."""
    side = "decoder" if decoder else "encoder"
    spec = (getattr(args, "msmsa_decoder_scales", None) if decoder else None) or args.msmsa_scales
    allocation = getattr(args, f"msmsa_{side}_head_allocation" if decoder else "msmsa_head_allocation", None)
    scales = parse_scales(spec)
    heads = getattr(args, f"{side}_attention_heads")
    layers = getattr(args, f"{side}_layers")
    if allocation:
        counts = parse_head_allocation(allocation, len(scales), heads, layers)
    else:
        counts = alpha_head_allocation(heads, len(scales), layers, args.msmsa_alpha)
    return [heads_from_counts(scales, layer_counts) for layer_counts in counts]


class MSMSAEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        self.layer_scales = layer_head_scales(args)
        super().__init__(args, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        # fairseq passes its TransformerConfig here; the msmsa options live on the Namespace (self.args)
        index = len(getattr(self, "_built_layers", []))
        cfg = _config(cfg)
        layer = MSMSAEncoderLayer(cfg, self.layer_scales[index], no_ffn=self.args.msmsa_no_ffn,
                                  min_block=self.args.msmsa_min_block)
        self._built_layers = getattr(self, "_built_layers", []) + [index]
        return _wrap(layer, cfg)


class MSMSADecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.layer_scales = layer_head_scales(args, decoder=True)
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, output_projection)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        index = len(getattr(self, "_built_layers", []))
        cfg = _config(cfg)
        layer = MSMSADecoderLayer(cfg, self.layer_scales[index], no_encoder_attn,
                                  min_block=self.args.msmsa_min_block)
        self._built_layers = getattr(self, "_built_layers", []) + [index]
        return _wrap(layer, cfg)


@register_model("msmsa")
class MSMSAModel(RawTextFromPretrained, TransformerModel):
    """Transformer whose encoder self-attention heads each attend within a window of their own scale."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        parser.add_argument("--msmsa-scales", type=str, metavar="LIST",
                            help=f"candidate attention scales, smallest first (default {DEFAULT_SCALES}): odd "
                                 "integers are fixed windows in tokens, N/k a window of 1/k of each sentence's "
                                 "own length made odd (2*floor(n/2k)+1), 'global' no window")
        parser.add_argument("--msmsa-alpha", type=float, metavar="A",
                            help="control factor of the scale distribution over layers (Eq. 11-12; default 0.5): "
                                 ">0 more small-scale heads in lower layers, 0 the same mix everywhere; the top "
                                 "layer is uniform")
        parser.add_argument("--msmsa-head-allocation", type=str, metavar="SPEC",
                            help="explicit heads per scale, layers separated by ';' (e.g. '4,2,1,1,0;...'), "
                                 "one group = every layer; overrides --msmsa-alpha")
        parser.add_argument("--msmsa-no-ffn", action="store_true",
                            help="encoder layers without FFN: H + ReLU(MSMSA(H)) (the paper's Eq. 10)")
        parser.add_argument("--msmsa-decoder", action="store_true",
                            help="causal (left-only) multi-scale heads in the decoder self-attention too")
        parser.add_argument("--msmsa-decoder-scales", type=str, metavar="LIST",
                            help="scales of the decoder heads (default: --msmsa-scales); N is the prefix length")
        parser.add_argument("--msmsa-decoder-head-allocation", type=str, metavar="SPEC",
                            help="explicit decoder heads per scale per layer (default: from --msmsa-alpha)")
        parser.add_argument("--msmsa-min-block", type=int, metavar="N",
                            help="smallest query block of the banded attention (default 16); efficiency only")

    @classmethod
    def build_model(cls, args, task):
        _msmsa_defaults(args)
        layer_head_scales(args)  # fail early, with the reason, on a bad scale list or allocation
        if args.msmsa_decoder:
            layer_head_scales(args, decoder=True)
        # fairseq's TransformerModel.build_model hands build_encoder/build_decoder a TransformerConfig,
        # which drops the msmsa options: keep the Namespace at hand while it runs.
        cls._namespace = args
        try:
            return super().build_model(args, task)
        finally:
            del cls._namespace

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return MSMSAEncoder(cls._namespace, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        args = cls._namespace
        if not args.msmsa_decoder:
            return TransformerDecoder(args, tgt_dict, embed_tokens,
                                      no_encoder_attn=getattr(args, "no_cross_attention", False))
        return MSMSADecoder(args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False))


def _msmsa_defaults(args):
    args.msmsa_scales = getattr(args, "msmsa_scales", None) or DEFAULT_SCALES
    args.msmsa_alpha = getattr(args, "msmsa_alpha", None)
    if args.msmsa_alpha is None:
        args.msmsa_alpha = 0.5
    args.msmsa_head_allocation = getattr(args, "msmsa_head_allocation", None)
    args.msmsa_no_ffn = getattr(args, "msmsa_no_ffn", False)
    args.msmsa_decoder = getattr(args, "msmsa_decoder", False)
    args.msmsa_decoder_scales = getattr(args, "msmsa_decoder_scales", None)
    args.msmsa_decoder_head_allocation = getattr(args, "msmsa_decoder_head_allocation", None)
    args.msmsa_min_block = getattr(args, "msmsa_min_block", None) or 16


@register_model_architecture("msmsa", "msmsa_base")
def msmsa_base(args):
    # transformer base, pre-norm (the UMST paper's baselines, table 2)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    _msmsa_defaults(args)
    base_architecture(args)


@register_model_architecture("msmsa", "msmsa_big")
def msmsa_big(args):
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    _msmsa_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)
