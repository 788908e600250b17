"""MSMSA's encoder: fairseq's transformer encoder whose layers are multi-scale
(:mod:`umst_plugin.modules.msmsa.layer`), one window mask cache for the whole stack; and the layer-building
helpers the decoder shares."""
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerConfig, TransformerEncoder
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from umst_plugin.models.msmsa.config import layer_head_scales
from umst_plugin.modules.msmsa.layer import MSMSAEncoderLayer
from umst_plugin.modules.msmsa.windowed_attention import MultiScaleSelfAttention, share_window_masks


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping of a built layer, as fairseq's build_encoder_layer /
    build_decoder_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def transformer_config(cfg_or_args):
    """fairseq's TransformerConfig of ``cfg_or_args`` (a Namespace or already one)."""
    return cfg_or_args if isinstance(cfg_or_args, TransformerConfig) else TransformerConfig.from_namespace(cfg_or_args)


def shared_window_masks(stack):
    """One WindowMasks for the multi-scale attention of every layer of ``stack`` (built once per forward)."""
    return share_window_masks([m for m in stack.layers.modules() if isinstance(m, MultiScaleSelfAttention)])


class MSMSAEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        self.layer_scales = layer_head_scales(args)
        super().__init__(args, dictionary, embed_tokens)
        self.window_masks = shared_window_masks(self)

    def forward_scriptable(self, *args, **kwargs):
        # every layer's window bias is built by the first layer and dropped when the stack is done
        with self.window_masks.scope():
            return super().forward_scriptable(*args, **kwargs)

    def build_encoder_layer(self, cfg):
        # fairseq passes its TransformerConfig here; the msmsa options live on the Namespace (self.args)
        index = len(getattr(self, "_built_layers", []))
        cfg = transformer_config(cfg)
        layer = MSMSAEncoderLayer(cfg, self.layer_scales[index], no_ffn=self.args.msmsa_no_ffn,
                                  min_block=self.args.msmsa_min_block, dense_max_len=self.args.msmsa_dense_max_len)
        self._built_layers = getattr(self, "_built_layers", []) + [index]
        return wrap_layer(layer, cfg)
