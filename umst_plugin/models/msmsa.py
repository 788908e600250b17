"""MSMSA: multi-scale multi-head self-attention (Guo et al., AAAI 2020) as a fairseq translation model.

The encoder is a (pre-norm, as in the UMST paper's re-implementation, its table 2)
transformer whose self-attention heads each see a window of their own scale
(``umst_plugin.modules.msmsa.windowed_attention``); the scales of each layer's heads
come from the control factor alpha (Eq. 11-12) or an explicit allocation. The
decoder is the standard transformer decoder unless ``--msmsa-decoder`` gives its
self-attention causal (left-only) multi-scale heads. ``--msmsa-no-ffn`` is the
paper's classification layer (Eq. 10): ``H + ReLU(MSMSA(H))``, no FFN.

The attention modules have exactly the parameters of fairseq's
MultiheadAttention, so ``msmsa_base`` has the parameter count of the pre-norm
transformer base (the UMST paper lists both at 65M).
"""
from typing import List

from fairseq.distributed import fsdp_wrap
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

from umst_plugin import families
from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.modules.msmsa.layers import FairseqMultiScaleSelfAttention, MSMSADecoderLayer, MSMSAEncoderLayer  # noqa: F401
from umst_plugin.modules.msmsa.windowed_attention import (
    DEFAULT_DENSE_MAX_LEN,
    DEFAULT_SCALES,
    MultiScaleSelfAttention,
    Scale,
    alpha_head_allocation,
    heads_from_counts,
    parse_head_allocation,
    parse_scales,
    share_window_masks,
)


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


def _share_window_masks(stack):
    """One WindowMasks for the multi-scale attention of every layer of ``stack`` (built once per forward)."""
    return share_window_masks([m for m in stack.layers.modules() if isinstance(m, MultiScaleSelfAttention)])


class MSMSAEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        self.layer_scales = layer_head_scales(args)
        super().__init__(args, dictionary, embed_tokens)
        self.window_masks = _share_window_masks(self)

    def forward_scriptable(self, *args, **kwargs):
        # every layer's window bias is built by the first layer and dropped when the stack is done
        with self.window_masks.scope():
            return super().forward_scriptable(*args, **kwargs)

    def build_encoder_layer(self, cfg):
        # fairseq passes its TransformerConfig here; the msmsa options live on the Namespace (self.args)
        index = len(getattr(self, "_built_layers", []))
        cfg = _config(cfg)
        layer = MSMSAEncoderLayer(cfg, self.layer_scales[index], no_ffn=self.args.msmsa_no_ffn,
                                  min_block=self.args.msmsa_min_block, dense_max_len=self.args.msmsa_dense_max_len)
        self._built_layers = getattr(self, "_built_layers", []) + [index]
        return _wrap(layer, cfg)


class MSMSADecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.layer_scales = layer_head_scales(args, decoder=True)
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.window_masks = _share_window_masks(self)

    def extract_features_scriptable(self, *args, **kwargs):
        with self.window_masks.scope():
            return super().extract_features_scriptable(*args, **kwargs)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        index = len(getattr(self, "_built_layers", []))
        cfg = _config(cfg)
        layer = MSMSADecoderLayer(cfg, self.layer_scales[index], no_encoder_attn,
                                  min_block=self.args.msmsa_min_block, dense_max_len=self.args.msmsa_dense_max_len)
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
        parser.add_argument("--msmsa-dense-max-len", type=int, metavar="T",
                            help=f"batches padded to at most T tokens run every head of a layer in one fused "
                                 f"attention call with a dense window mask (built once per forward, B x heads x "
                                 f"T x T per layer); longer ones run one banded call per scale, O(T x window) "
                                 f"memory (default {DEFAULT_DENSE_MAX_LEN}; 0: always banded); same results")

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
    if getattr(args, "msmsa_dense_max_len", None) is None:
        args.msmsa_dense_max_len = DEFAULT_DENSE_MAX_LEN


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


families.register(families.Family(
    name="msmsa", title="MSMSA", paper="Guo et al., AAAI 2020: Multi-Scale Self-Attention for Text Classification",
    model=MSMSAModel, encoder=MSMSAEncoder, layers=(MSMSAEncoderLayer, MSMSADecoderLayer),
    bench_rows={"msmsa": families.BenchRow("msmsa_base", "msmsa_big")}))
