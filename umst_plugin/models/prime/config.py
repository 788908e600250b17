"""Prime's options (``add_args``; docs/prime.md), their checks, the keyword arguments of each layer they
describe, and the defaults and sizes the archs share."""
from typing import List

from fairseq import utils
from fairseq.models.transformer import base_architecture


def add_args(parser):
    """Prime's options (fairseq's transformer options come first, from the model's ``add_args``)."""
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
                             "number of attention heads; must divide the width where the convolution is dynamic")
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


def _side_conv_type(args, side: str):
    """The convolution of ``side``'s layers: None (Prime-simple), "dynamic", or "standard" where
    --prime-ablation-scope names that side (the ablation acts there only; elsewhere the layer is Prime's own)."""
    if args.prime_conv_type == "none":
        return None
    if args.prime_conv_type == "standard" and args.prime_ablation_scope not in ("both", side):
        return "dynamic"
    return args.prime_conv_type


def prime_layer_kwargs(args, layer_index: int, decoder: bool) -> dict:
    side = "decoder" if decoder else "encoder"
    num_layers = getattr(args, f"{side}_layers")
    # the ablation flags act on the sides named by --prime-ablation-scope; elsewhere the layer is standard Prime
    ablate = args.prime_ablation_scope in ("both", side)
    conv_type = _side_conv_type(args, side)
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
            if _side_conv_type(args, side) != "dynamic":
                continue  # a standard convolution has one full kernel, no heads: any width takes it
            heads = args.prime_conv_heads or getattr(args, f"{side}_attention_heads")
            dim = getattr(args, f"{side}_embed_dim")
            if dim % heads != 0:
                raise ValueError(f"{side} embed dim {dim} is not divisible by {heads} convolution heads")
    if args.encoder_embed_dim != args.decoder_embed_dim and getattr(args, "decoder_input_dim", None) not in (
        None, args.decoder_embed_dim
    ):
        raise ValueError("Prime does not support --decoder-input-dim different from --decoder-embed-dim")


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
