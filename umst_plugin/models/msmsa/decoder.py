"""MSMSA's decoder (``--msmsa-decoder``): fairseq's transformer decoder whose self-attention heads are causal
(left-only) multi-scale heads."""
from fairseq.models.transformer import TransformerDecoder

from umst_plugin.models.msmsa.config import layer_head_scales
from umst_plugin.models.msmsa.encoder import shared_window_masks, transformer_config, wrap_layer
from umst_plugin.modules.msmsa.layer import MSMSADecoderLayer


class MSMSADecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.layer_scales = layer_head_scales(args, decoder=True)
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.window_masks = shared_window_masks(self)

    def extract_features_scriptable(self, *args, **kwargs):
        with self.window_masks.scope():
            return super().extract_features_scriptable(*args, **kwargs)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        index = len(getattr(self, "_built_layers", []))
        cfg = transformer_config(cfg)
        layer = MSMSADecoderLayer(cfg, self.layer_scales[index], no_encoder_attn,
                                  min_block=self.args.msmsa_min_block, dense_max_len=self.args.msmsa_dense_max_len)
        self._built_layers = getattr(self, "_built_layers", []) + [index]
        return wrap_layer(layer, cfg)
