"""The floor of TranSFormer's shape for ``bench_launches.py --floor``: ``transformer_sf_shape``.

TranSFormer's encoder runs two branches of 6 blocks each, the subword one at width 512 and the character one at
width 32 over a sequence 5-6 times longer, and each block has a cross-attention per direction. Whatever its layers
do, that shape launches more kernels per FLOP than fairseq's 6+6 transformer: the character branch's products
launch as many kernels as the subword branch's for a sixteenth of the work. This model is what the shape alone
costs: ``transformer_sf_base`` (the same embeddings, character table, subword decoder, dropouts) whose encoder
stack is made of fairseq's own transformer layers, nothing of TranSFormer's:

* subword block i: fairseq's ``TransformerDecoderLayerBase`` at 512 / 2048 / 8 heads, its self-attention without
  the causal mask, its cross-attention reading the character branch (keys and values of width 32, fairseq's
  ``MultiheadAttention`` with ``kdim = vdim = 32``): self-attention, cross-attention, FFN, as TranSFormer's block;
* character block i < 6: the same layer at 32 / 128 / 2 heads reading the subword branch (``kdim = 512``);
* character block 6: fairseq's ``TransformerEncoderLayerBase`` (self-attention and FFN; TranSFormer's last
  character block has its self-attention only, which the last subword cross-attention reads);
* the subword branch's final LayerNorm, as TranSFormer's.

No GCN, no relative positions, no layer norm of the other branch before a cross-attention. Registered only in the
benchmark's process (importing this module), not by the plugin.
"""
import copy

import torch.nn as nn

from fairseq.models import ARCH_MODEL_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from umst_plugin.models.transformer_sf.encoder import SlowFastEncoder
from umst_plugin.models.transformer_sf.model import TransformerSlowFastModel, transformer_sf_base

NAME = "transformer_sf_shape"


def _layer_config(args, width, ffn, heads, other_width):
    cfg = copy.deepcopy(TransformerConfig.from_namespace(args))
    for part in (cfg.encoder, cfg.decoder):
        part.embed_dim, part.ffn_embed_dim, part.attention_heads = width, ffn, heads
        part.normalize_before = True
    cfg.encoder.embed_dim = other_width  # what the decoder layer's cross-attention reads (kdim, vdim)
    return cfg


class PlainShapeStack(nn.Module):
    """``SlowFastEncoderStack``'s interface (embedded branches and ``side`` in, the final-normed slow branch out)
    with fairseq's transformer layers in TranSFormer's shape."""

    def __init__(self, args):
        super().__init__()
        slow, fast, layers = args.encoder_embed_dim, args.fast_embed_dim, args.encoder_layers
        slow_cfg = _layer_config(args, slow, args.encoder_ffn_embed_dim, args.encoder_attention_heads, fast)
        fast_cfg = _layer_config(args, fast, args.fast_ffn_embed_dim, args.fast_attention_heads, slow)
        self.slow_layers = nn.ModuleList(TransformerDecoderLayerBase(slow_cfg) for _ in range(layers))
        fast_last_cfg = copy.deepcopy(fast_cfg)
        fast_last_cfg.encoder.embed_dim = fast
        self.fast_layers = nn.ModuleList([TransformerDecoderLayerBase(fast_cfg) for _ in range(layers - 1)]
                                         + [TransformerEncoderLayerBase(fast_last_cfg)])
        self.slow_layer_norm = nn.LayerNorm(slow)

    def forward(self, x_slow, x_fast, side):
        return self.blocks(*self.prepare(x_slow, x_fast, side))

    def prepare(self, x_slow, x_fast, side):
        return x_slow, x_fast, side  # nothing shared between the blocks to build

    def blocks(self, x_slow, x_fast, side):
        slow_mask, fast_mask = side["slow_padding_mask"], side["fast_padding_mask"]
        for slow_layer, fast_layer in zip(self.slow_layers, self.fast_layers):
            slow_in = x_slow
            if isinstance(fast_layer, TransformerEncoderLayerBase):
                x_fast = fast_layer(x_fast, fast_mask)
            x_slow = slow_layer(x_slow, x_fast, fast_mask, self_attn_padding_mask=slow_mask)[0]
            if isinstance(fast_layer, TransformerDecoderLayerBase):
                x_fast = fast_layer(x_fast, slow_in, slow_mask, self_attn_padding_mask=fast_mask)[0]
        return self.slow_layer_norm(x_slow), None


class PlainShapeEncoder(SlowFastEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens)
        self.stack = PlainShapeStack(args)


def register():
    """Register the model and its arch (once) in this process."""
    if NAME in ARCH_MODEL_REGISTRY:
        return

    @register_model(NAME)
    class TransformerSlowFastShapeModel(TransformerSlowFastModel):
        @classmethod
        def build_encoder(cls, args, src_dict, embed_tokens):
            return PlainShapeEncoder(args, src_dict, embed_tokens)

    register_model_architecture(NAME, NAME)(transformer_sf_base)
