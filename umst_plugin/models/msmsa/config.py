"""MSMSA's options (``add_args``; docs/msmsa.md), the defaults both archs share, and the per-layer head scales
the options describe (:func:`layer_head_scales`)."""
from typing import List

from umst_plugin.modules.msmsa.windowed_attention import (
    DEFAULT_DENSE_MAX_LEN,
    DEFAULT_SCALES,
    Scale,
    alpha_head_allocation,
    heads_from_counts,
    parse_head_allocation,
    parse_scales,
)


def add_args(parser):
    """MSMSA's options (fairseq's transformer options come first, from the model's ``add_args``)."""
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


def msmsa_defaults(args):
    """The defaults both MSMSA archs share (getattr defaults: user flags win)."""
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
