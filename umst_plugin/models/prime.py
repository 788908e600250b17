"""Unified Transformer with Prime modules (Zhao et al., "Unified Transformer for Sequence-to-Sequence
Learning"; the authors' code is MUSE, lancopku/Prime).

Registered model ``prime`` with architectures ``prime_base``, ``prime_big`` (Prime: attention,
dynamic convolution and FFN in parallel, Eq. 4) and ``prime_simple_base``, ``prime_simple_big``
(attention and FFN in parallel, Eq. 1). Embeddings, positions, output projection, beam
reordering of the encoder output and incremental plumbing are fairseq's TransformerEncoder /
TransformerDecoder; only the layers are replaced by :class:`~umst_plugin.modules.prime.layer.PrimeLayer`.

Prime needs no side data: it trains with fairseq's plain ``translation`` task, and with
``multiscale_translation`` it accepts and ignores the extra encoder inputs
(``src_word_ids``, ``src_word_heads``).
"""
import logging
from typing import List

from fairseq import utils
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerDecoder,
    TransformerEncoder,
    TransformerModel,
    base_architecture,
)

from umst_plugin import families
from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.modules.prime.layer import PrimeDecoderLayer, PrimeEncoderLayer, share_mask_memo

logger = logging.getLogger(__name__)


def parse_kernel_list(spec, flag: str) -> List[int]:
    """'3,15' -> [3, 15] with a clear error for anything that is not a list of positive ints."""
    if isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        items = [s for s in str(spec).replace(" ", "").split(",") if s != ""]
    try:
        kernels = [int(s) for s in items]
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated positive integers, got {spec!r}") from None
    if not kernels or any(k < 1 for k in kernels):
        raise ValueError(f"{flag} expects comma-separated positive integers, got {spec!r}")
    return kernels


def layer_kernels(args, layer_index: int, num_layers: int) -> List[int]:
    """Kernel sizes of the convolution cells of one layer.

    ``--prime-kernels 3,15``: every layer mixes these cells (Eq. 7). ``--prime-layer-kernels
    3,7,15,31``: one kernel per layer, growing from bottom to top; the N layers are split into
    len(list) equal consecutive groups (12 layers and 4 sizes: 3 layers each).
    """
    if getattr(args, "prime_layer_kernels", None):
        schedule = parse_kernel_list(args.prime_layer_kernels, "--prime-layer-kernels")
        if len(schedule) > num_layers:
            raise ValueError(f"--prime-layer-kernels has {len(schedule)} entries for {num_layers} layers")
        return [schedule[layer_index * len(schedule) // num_layers]]
    return parse_kernel_list(args.prime_kernels, "--prime-kernels")


def prime_layer_kwargs(args, layer_index: int, decoder: bool) -> dict:
    side = "decoder" if decoder else "encoder"
    num_layers = getattr(args, f"{side}_layers")
    # the ablation flags act on the sides named by --prime-ablation-scope; elsewhere the layer is standard Prime
    ablate = args.prime_ablation_scope in ("both", side)
    conv_type = None if args.prime_conv_type == "none" else args.prime_conv_type
    if conv_type == "standard" and not ablate:
        conv_type = "dynamic"
    heads = getattr(args, f"{side}_attention_heads")
    return dict(
        embed_dim=getattr(args, f"{side}_embed_dim"),
        num_heads=heads,
        ffn_dim=getattr(args, f"{side}_ffn_embed_dim"),
        causal=decoder,
        cross_attention=decoder and not getattr(args, "no_cross_attention", False),
        encoder_dim=args.encoder_embed_dim,
        conv_type=conv_type,
        conv_kernels=layer_kernels(args, layer_index, num_layers) if conv_type else (),
        conv_heads=args.prime_conv_heads or heads,
        shared_projection=not (ablate and args.separate_projection),
        ffn=not (ablate and args.no_ffn),
        ffn_shares_conv_projection=ablate and args.ffn_shares_conv_projection,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=getattr(args, "activation_dropout", 0.0) or getattr(args, "relu_dropout", 0.0) or 0.0,
        input_dropout=args.input_dropout,
        conv_weight_dropout=args.prime_conv_weight_dropout,
        activation_fn=utils.get_activation_fn(getattr(args, "activation_fn", "relu") or "relu"),
        fused=not args.prime_unfused_projections,
        init=args.prime_init,
    )


def validate_prime_args(args):
    """Reject fairseq transformer options that Prime's layers do not implement."""
    if args.prime_ablation_scope not in ("both", "encoder", "decoder"):
        raise ValueError(f"--prime-ablation-scope must be both, encoder or decoder, got {args.prime_ablation_scope!r}")
    if args.prime_conv_type not in ("dynamic", "standard", "none"):
        raise ValueError(f"--prime-conv-type must be dynamic, standard or none, got {args.prime_conv_type!r}")
    if args.encoder_normalize_before or args.decoder_normalize_before:
        raise ValueError("Prime layers are post-norm (X_i = LN(X_{i-1} + ...), Eqs. 1 and 4); "
                         "--encoder/decoder-normalize-before is not supported")
    if getattr(args, "cross_self_attention", False):
        raise ValueError("--cross-self-attention is not supported by Prime layers")
    if getattr(args, "checkpoint_activations", False) or getattr(args, "offload_activations", False):
        raise ValueError("--checkpoint-activations is not supported by Prime layers")
    if args.ffn_shares_conv_projection and args.prime_conv_type == "none":
        raise ValueError("--ffn-shares-conv-projection needs a convolution (not --prime-conv-type none)")
    if args.ffn_shares_conv_projection and args.no_ffn:
        raise ValueError("--ffn-shares-conv-projection contradicts --no-ffn")
    if args.prime_conv_type != "none":
        parse_kernel_list(args.prime_kernels, "--prime-kernels")
        for side in ("encoder", "decoder"):
            heads = args.prime_conv_heads or getattr(args, f"{side}_attention_heads")
            dim = getattr(args, f"{side}_embed_dim")
            if dim % heads != 0:
                raise ValueError(f"{side} embed dim {dim} is not divisible by {heads} convolution heads")
    if args.encoder_embed_dim != args.decoder_embed_dim and getattr(args, "decoder_input_dim", None) not in (
        None, args.decoder_embed_dim
    ):
        raise ValueError("Prime does not support --decoder-input-dim different from --decoder-embed-dim")


class PrimeEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        self._next_layer = 0  # build_encoder_layer is called once per layer, bottom first
        super().__init__(args, dictionary, embed_tokens)
        share_mask_memo(self.layers)  # the attention masks are built once per forward pass, not once per layer

    def build_encoder_layer(self, cfg):
        layer = PrimeEncoderLayer(**prime_layer_kwargs(self.args, self._next_layer, decoder=False))
        self._next_layer += 1
        return layer

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        """As TransformerEncoder.forward; extra inputs of side-data tasks (src_word_ids, ...) are ignored."""
        return self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)

    beam_size = 1  # set by PrimeModel.set_beam_size (fairseq's SequenceGenerator)

    def reorder_encoder_out(self, encoder_out, new_order):
        """TransformerEncoder's reorder, plus the beam mark ``prime_beams``: fairseq's SequenceGenerator first
        reorders the encoder output with each sentence repeated ``beam_size`` times in a row (new_order =
        arange(bsz).repeat_interleave(beam)); later reorders keep whole sentences. Whether a reorder is that
        expansion is read from the sizes alone (bsz rows in, bsz x beam_size out), so no host-device sync;
        the mark tells the decoder's Prime layers that they may keep one copy of the cross-attention keys per
        sentence."""
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        beams = encoder_out.get("prime_beams", [1])[0] if isinstance(encoder_out, dict) else 1
        if beams == 1 and self.beam_size > 1 and encoder_out["encoder_out"]:
            if new_order.numel() == self.beam_size * encoder_out["encoder_out"][0].size(1):
                beams = self.beam_size
        if beams > 1 and new_order.numel() % beams == 0:
            reordered["prime_beams"] = [beams]
        return reordered


class PrimeDecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        self._next_layer = 0
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        share_mask_memo(self.layers)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = PrimeDecoderLayer(**prime_layer_kwargs(self.args, self._next_layer, decoder=True))
        self._next_layer += 1
        return layer

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        """TransformerDecoder.forward; first hands the encoder output's beam mark to the layers (per call, so no
        mark outlives the decoding it belongs to)."""
        beams = encoder_out.get("prime_beams", [1])[0] if isinstance(encoder_out, dict) else 1
        for layer in self.layers:
            layer.shared_beams = beams
        return super().forward(prev_output_tokens, encoder_out=encoder_out, incremental_state=incremental_state,
                               **kwargs)


@register_model("prime")
class PrimeModel(RawTextFromPretrained, TransformerModel):
    """Unified Transformer built from Prime layers (post-norm, parallel branches)."""

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        parser.add_argument("--prime-conv-type", choices=["dynamic", "standard", "none"],
                            help="convolution branch: dynamic depthwise convolution (Prime, Eq. 6), a standard "
                                 "non-separable convolution (table 6 ablation), or none (Prime-simple, Eq. 1)")
        parser.add_argument("--prime-kernels", type=str, metavar="K1,K2,...",
                            help="kernel sizes of the convolution cells mixed in every layer by softmax over "
                                 "learned scalars (Eq. 7); default 3,15; a single value gives one kernel")
        parser.add_argument("--prime-layer-kernels", type=str, metavar="K1,K2,...",
                            help="one kernel size per layer, growing bottom to top (e.g. 3,7,15,31: the layers "
                                 "are split into that many equal groups); overrides --prime-kernels")
        parser.add_argument("--prime-conv-heads", type=int, metavar="N",
                            help="dynamic convolution heads (one predicted kernel per head); default: the "
                                 "number of attention heads")
        parser.add_argument("--prime-conv-weight-dropout", type=float, metavar="D",
                            help="DropConnect probability on the predicted convolution kernels (default 0.1)")
        parser.add_argument("--input-dropout", type=float, metavar="D",
                            help="dropout on the input of the self-attention and convolution projections only "
                                 "(not the FFN, the cross-attention query or the residual), the authors' "
                                 "--input_dropout; default 0.1 for prime_big (their WMT Prime recipe), else 0")
        parser.add_argument("--separate-projection", action="store_true",
                            help="give the convolution its own input projection W_1^C instead of sharing the "
                                 "attention's value projection (table 6 'without Shared Projection')")
        parser.add_argument("--no-ffn", action="store_true",
                            help="drop the point-wise FFN branch (table 7 'Prime without FFN')")
        parser.add_argument("--ffn-shares-conv-projection", action="store_true",
                            help="the FFN reads relu(X W_1^C), sharing the convolution's input projection; the "
                                 "attention keeps its own value projection; FFN width = embed dim (table 7)")
        parser.add_argument("--prime-ablation-scope", choices=["both", "encoder", "decoder"],
                            help="layers that --separate-projection, --no-ffn, --ffn-shares-conv-projection and "
                                 "--prime-conv-type standard act on (default both; the paper's table 7 ablations "
                                 "were run on the encoder only, its footnote 6)")
        parser.add_argument("--prime-unfused-projections", action="store_true",
                            help="compute the input/output projections branch by branch instead of as one "
                                 "matrix multiply each (same parameters, same result; for speed comparison)")
        parser.add_argument("--prime-init", choices=["pytorch", "xavier"],
                            help="initialisation of the Prime projections: PyTorch's nn.Linear default "
                                 "(paper section 2.1, default) or Xavier-uniform")

    @classmethod
    def build_model(cls, args, task):
        prime_defaults(args)
        validate_prime_args(args)
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        if args.encoder_layers_to_keep:
            args.encoder_layers = len(args.encoder_layers_to_keep.split(","))
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))

        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if args.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError("--share-all-embeddings requires a joined dictionary")
            if args.encoder_embed_dim != args.decoder_embed_dim:
                raise ValueError("--share-all-embeddings requires --encoder-embed-dim to match --decoder-embed-dim")
            encoder_embed = cls.build_embedding(args, src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            decoder_embed = encoder_embed
            args.share_decoder_input_output_embed = True
        else:
            encoder_embed = cls.build_embedding(args, src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            decoder_embed = cls.build_embedding(args, tgt_dict, args.decoder_embed_dim, args.decoder_embed_path)
        encoder = cls.build_encoder(args, src_dict, encoder_embed)
        decoder = cls.build_decoder(args, tgt_dict, decoder_embed)
        return cls(args, encoder, decoder)

    def set_beam_size(self, beam_size: int):
        """fairseq's SequenceGenerator calls this before beam search (``set_decoder_beam_size``); the decoder's Prime
        layers then keep one copy of the cross-attention keys and values per sentence instead of one per beam."""
        self.decoder.set_beam_size(beam_size)
        self.encoder.beam_size = beam_size

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return PrimeEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return PrimeDecoder(args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False))


def prime_defaults(args):
    """Prime options shared by every architecture, then fairseq's transformer defaults."""
    args.prime_conv_type = getattr(args, "prime_conv_type", "dynamic")
    args.prime_kernels = getattr(args, "prime_kernels", "3,15")
    args.prime_layer_kernels = getattr(args, "prime_layer_kernels", None)
    args.prime_conv_heads = getattr(args, "prime_conv_heads", None)
    args.prime_conv_weight_dropout = getattr(args, "prime_conv_weight_dropout", 0.1)
    args.separate_projection = getattr(args, "separate_projection", False)
    args.no_ffn = getattr(args, "no_ffn", False)
    args.ffn_shares_conv_projection = getattr(args, "ffn_shares_conv_projection", False)
    args.prime_unfused_projections = getattr(args, "prime_unfused_projections", False)
    args.prime_ablation_scope = getattr(args, "prime_ablation_scope", "both")
    args.prime_init = getattr(args, "prime_init", "pytorch")
    args.input_dropout = getattr(args, "input_dropout", 0.0)
    base_architecture(args)


def prime_sizes(args, embed_dim, ffn_dim, heads, dropout):
    """12+12 Prime layers of the given width (paper 3.1.3); decoder sizes follow the encoder's unless set, so one
    --encoder-embed-dim re-sizes both sides (table 5's re-scaling); user flags win over every default."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", embed_dim)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", ffn_dim)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", heads)
    args.encoder_layers = getattr(args, "encoder_layers", 12)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", args.encoder_embed_dim)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", args.encoder_ffn_embed_dim)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", args.encoder_attention_heads)
    args.decoder_layers = getattr(args, "decoder_layers", 12)
    args.dropout = getattr(args, "dropout", dropout)
    prime_defaults(args)


@register_model_architecture("prime", "prime_base")
def prime_base(args):
    """IWSLT-size Unified Transformer (paper 3.1.3): 12+12 layers, d=384, FFN 768, 4 heads, dropout 0.4."""
    prime_sizes(args, embed_dim=384, ffn_dim=768, heads=4, dropout=0.4)


@register_model_architecture("prime", "prime_big")
def prime_big(args):
    """WMT-size Unified Transformer (paper 3.1.3/3.1.4): 12+12 layers, d=768, FFN 3072, 16 heads, dropout 0.3;
    input dropout 0.1, as every WMT Prime command of the authors' README (``--input_dropout 0.1``)."""
    args.input_dropout = getattr(args, "input_dropout", 0.1)
    prime_sizes(args, embed_dim=768, ffn_dim=3072, heads=16, dropout=0.3)


@register_model_architecture("prime", "prime_simple_base")
def prime_simple_base(args):
    """Prime-simple (Eq. 1: attention and FFN in parallel, no convolution) at the base size."""
    args.prime_conv_type = getattr(args, "prime_conv_type", "none")
    prime_base(args)


@register_model_architecture("prime", "prime_simple_big")
def prime_simple_big(args):
    """Prime-simple (Eq. 1) at the big size; no input dropout (the authors' WMT Prime-simple command sets none)."""
    args.prime_conv_type = getattr(args, "prime_conv_type", "none")
    args.input_dropout = getattr(args, "input_dropout", 0.0)
    prime_big(args)


# Prime's shape (12+12 layers, narrower and deeper than the transformer's 6+6): activations grow with layers x
# width and matmul FLOPs with layers x width^2, so a narrower model keeps more bytes per FLOP whatever its layers
# are. This transformer tells the shape's share of Prime's ratio from the layers'.
_PRIME_SHAPE = families.BenchRow(
    "transformer", "transformer_vaswani_wmt_en_de_big",
    overrides=dict(encoder_normalize_before=True, decoder_normalize_before=True, encoder_layers=12, decoder_layers=12,
                   encoder_embed_dim=384, decoder_embed_dim=384, encoder_ffn_embed_dim=768, decoder_ffn_embed_dim=768,
                   encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.4),
    big_overrides=dict(encoder_embed_dim=768, decoder_embed_dim=768, encoder_ffn_embed_dim=3072,
                       decoder_ffn_embed_dim=3072, encoder_attention_heads=16, decoder_attention_heads=16, dropout=0.3),
    label=" (Prime's shape)", baseline_only=True)
families.register(families.Family(
    name="prime", title="Prime", paper="Zhao et al. 2019: MUSE, Parallel Multi-Scale Attention (Unified Transformer)",
    model=PrimeModel, encoder=PrimeEncoder, layers=(PrimeEncoderLayer, PrimeDecoderLayer),
    bench_rows={"prime": families.BenchRow("prime_base", "prime_big", shape_baseline="transformer_prime_shape"),
                "prime_simple": families.BenchRow("prime_simple_base", "prime_simple_big",
                                                  shape_baseline="transformer_prime_shape"),
                "transformer_prime_shape": _PRIME_SHAPE}))
