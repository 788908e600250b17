"""TranSFormer's options (``add_args``; docs/transformer_sf.md), the encoder stack's configuration
(:class:`SlowFastConfig`, built from the args by :func:`slowfast_config_from_args`) and the defaults the archs
share."""
from dataclasses import dataclass, field
from typing import FrozenSet

from fairseq.models.transformer import base_architecture

from umst_plugin.modules.transformer_sf.char_table import STYLES
from umst_plugin.modules.transformer_sf.fusion import FUSIONS


ENCODER_OUTPUTS = ("slow", "fast", "both")
SLOW_GCN = ("input", "every-layer", "none")
INTERACTION_PRESETS = ("all", "last", "bottom3", "top3", "every2", "none")


def parse_interaction_layers(spec, num_layers):
    """'all' | 'last' | 'bottom3' | 'top3' | 'every2' | 'none' | '1,3,5' (1-based) -> frozenset of 1-based ids."""
    spec = str(spec).strip()
    if spec == "none":  # the branches never meet (fast only: --sf-encoder-output fast)
        layers = []
    elif spec == "all":
        layers = range(1, num_layers + 1)
    elif spec == "last":
        layers = [num_layers]
    elif spec == "bottom3":
        layers = range(1, min(3, num_layers) + 1)
    elif spec == "top3":
        layers = range(max(1, num_layers - 2), num_layers + 1)
    elif spec == "every2":
        layers = range(1, num_layers + 1, 2)
    else:
        try:
            layers = [int(p) for p in spec.split(",") if p.strip()]
        except ValueError:
            raise ValueError(
                f"interaction layers {spec!r}: expected one of {INTERACTION_PRESETS} or a comma list like 1,3,5"
            ) from None
        bad = [i for i in layers if not 1 <= i <= num_layers]
        if bad or not layers:
            raise ValueError(f"interaction layers {spec!r}: ids must be in 1..{num_layers}")
    return frozenset(layers)


@dataclass
class SlowFastConfig:  # its defaults are transformer_sf_base's configuration (tests/test_transformer_sf.py)
    slow_dim: int = 512
    slow_ffn_dim: int = 2048
    slow_heads: int = 8
    fast_dim: int = 32
    fast_ffn_dim: int = 128
    fast_heads: int = 2  # H_f / 16 (head dim 16), as the archs default it (slowfast_defaults)
    layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation_dropout: float = 0.1
    fusion: str = "cga"
    interaction_layers: FrozenSet[int] = field(default_factory=lambda: frozenset(range(1, 7)))
    unidirectional: bool = False  # fast -> slow only (table 5 #2)
    encoder_output: str = "slow"
    slow_gcn: str = "input"
    char_gcn: bool = True  # False: --no-char-boundary (table 5 #3)
    boundary_pe_distance: int = 3  # k; 0 = --no-boundary-pe (table 5 #5)
    # training: recompute the fast (character) branch's attention and fusion sub-layers in backward instead of
    # keeping their activations (same values, same dropout masks): less memory, more kernel launches
    # (--sf-recompute-fast; docs/transformer_sf.md). Its GCN and FFN keep little either way (lean.py).
    recompute_fast: bool = False
    # the launch-lean implementation (modules/transformer_sf/lean.py); False runs the reference modules
    # (the same function, more and smaller ops: tests compare the two)
    lean: bool = True

    def validate(self):
        if self.fusion not in FUSIONS:
            raise ValueError(f"--sf-fusion {self.fusion!r}: expected one of {FUSIONS}")
        if self.encoder_output not in ENCODER_OUTPUTS:
            raise ValueError(f"--sf-encoder-output {self.encoder_output!r}: expected one of {ENCODER_OUTPUTS}")
        if self.slow_gcn not in SLOW_GCN:
            raise ValueError(f"--sf-slow-gcn {self.slow_gcn!r}: expected one of {SLOW_GCN}")
        if self.encoder_output == "slow" and not self.interaction_layers:
            raise ValueError("the fast branch never reaches the slow output: no interaction layers "
                             "(a slow-only model is fairseq's transformer)")
        if self.encoder_output == "fast" and self.unidirectional:
            raise ValueError("--unidirectional-cga (fast -> slow only) with --sf-encoder-output fast "
                             "leaves the slow branch unread")


def add_args(parser):
    """TranSFormer's options (fairseq's transformer options come first, from the model's ``add_args``)."""
    parser.add_argument("--fast-embed-dim", type=int, metavar="N",
                        help="fast (character) branch width H_f (paper: 32 base, 64 big; table 4a 16..256)")
    parser.add_argument("--fast-ffn-embed-dim", type=int, metavar="N",
                        help="fast branch FFN width (paper: 4 x H_f, 128 for H_f = 32)")
    parser.add_argument("--fast-attention-heads", type=int, metavar="N",
                        help="fast branch heads (paper does not say; default H_f / 16, i.e. head dim 16)")
    parser.add_argument("--fast-input", choices=("char", "subword"),
                        help="fast branch input granularity (table 4d: char 28.56, subword 27.50)")
    parser.add_argument("--sf-subword-style", choices=STYLES,
                        help="how source dictionary entries mark word boundaries: subword-nmt '@@', "
                             "sentencepiece '\u2581', word (none); auto detects from the dictionary")
    parser.add_argument("--sf-fusion", choices=FUSIONS,
                        help="cross-branch fusion (table 4b: cga 28.56, linear-attention 28.47, "
                             "ds-concat 27.82, ds-sum 27.96)")
    parser.add_argument("--sf-encoder-output", choices=ENCODER_OUTPUTS,
                        help="what the decoder attends (table 4c: slow 28.56, fast 23.11, both 28.25)")
    parser.add_argument("--sf-interaction-layers", type=str, metavar="SPEC",
                        help="blocks with cross-branch fusion: all|last|bottom3|top3|every2|none or "
                             "1-based list like 1,3,5 (table 6: all 28.56, last 27.99, bottom3 28.10, "
                             "top3 28.40, every2 28.20; none with --sf-encoder-output fast = table 1's "
                             "Fast Only)")
    parser.add_argument("--sf-slow-gcn", choices=SLOW_GCN,
                        help="subword GCN over A_s: once on the input (default), in every block, or none")
    parser.add_argument("--unidirectional-cga", action="store_true",
                        help="fuse fast -> slow only; the fast branch does not read the slow one "
                             "(table 5 #2: 28.41)")
    parser.add_argument("--no-char-boundary", action="store_true",
                        help="drop the character GCN over A_f (table 5 #3: 27.61)")
    parser.add_argument("--random-char-boundary", action="store_true",
                        help="replace the word boundaries of A_f and of the boundary-wise PE by "
                             "pseudo-random ones (table 5 #4: 26.79)")
    parser.add_argument("--no-boundary-pe", action="store_true",
                        help="drop the boundary-wise relative positional encoding (table 5 #5: 28.13)")
    parser.add_argument("--boundary-pe-distance", type=int, metavar="K",
                        help="window k of the boundary-wise relative PE (paper: 3)")
    parser.add_argument("--sf-recompute-fast", action="store_true",
                        help="recompute the character branch's attention and fusion sub-layers in backward "
                             "instead of keeping their activations (less memory, more kernel launches: "
                             "docs/transformer_sf.md#speed-and-memory)")
    parser.add_argument("--sf-keep-fast-activations", action="store_true",
                        help="keep the character branch's activations for backward: the default (the flag "
                             "stays for older command lines; --sf-recompute-fast recomputes them)")


def slowfast_config_from_args(args):
    """The encoder stack's :class:`SlowFastConfig` from the model's (defaulted) args."""
    return SlowFastConfig(
        slow_dim=args.encoder_embed_dim,
        slow_ffn_dim=args.encoder_ffn_embed_dim,
        slow_heads=args.encoder_attention_heads,
        fast_dim=args.fast_embed_dim,
        fast_ffn_dim=args.fast_ffn_embed_dim,
        fast_heads=args.fast_attention_heads,
        layers=args.encoder_layers,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout,
        fusion=args.sf_fusion,
        interaction_layers=parse_interaction_layers(args.sf_interaction_layers, args.encoder_layers),
        unidirectional=args.unidirectional_cga,
        encoder_output=args.sf_encoder_output,
        slow_gcn=args.sf_slow_gcn,
        char_gcn=not args.no_char_boundary,
        boundary_pe_distance=0 if args.no_boundary_pe else args.boundary_pe_distance,
        recompute_fast=_recompute_fast(args),
    )


def _recompute_fast(args):
    recompute = bool(getattr(args, "sf_recompute_fast", False))
    if recompute and getattr(args, "sf_keep_fast_activations", False):
        raise ValueError("--sf-recompute-fast and --sf-keep-fast-activations contradict each other")
    return recompute


def slowfast_defaults(args):
    """The defaults every TranSFormer arch shares (getattr defaults: user flags win)."""
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    args.dropout = getattr(args, "dropout", 0.1)
    args.attention_dropout = getattr(args, "attention_dropout", 0.1)
    args.activation_dropout = getattr(args, "activation_dropout", 0.1)
    args.fast_embed_dim = getattr(args, "fast_embed_dim", 32)
    args.fast_ffn_embed_dim = getattr(args, "fast_ffn_embed_dim", 4 * args.fast_embed_dim)
    args.fast_attention_heads = getattr(args, "fast_attention_heads", max(1, args.fast_embed_dim // 16))
    args.fast_input = getattr(args, "fast_input", "char")
    args.sf_subword_style = getattr(args, "sf_subword_style", "auto")
    args.sf_fusion = getattr(args, "sf_fusion", "cga")
    args.sf_encoder_output = getattr(args, "sf_encoder_output", "slow")
    args.sf_interaction_layers = getattr(args, "sf_interaction_layers", "all")
    args.sf_slow_gcn = getattr(args, "sf_slow_gcn", "input")
    args.unidirectional_cga = getattr(args, "unidirectional_cga", False)
    args.no_char_boundary = getattr(args, "no_char_boundary", False)
    args.random_char_boundary = getattr(args, "random_char_boundary", False)
    args.no_boundary_pe = getattr(args, "no_boundary_pe", False)
    args.boundary_pe_distance = getattr(args, "boundary_pe_distance", 3)
    base_architecture(args)


def fast_only_defaults(args):
    """Table 1 "Fast Only": the character branch alone encodes (no slow branch, no fusion) and a
    linear map widens it to the subword decoder (--encoder-embed-dim = the decoder's width)."""
    args.sf_encoder_output = getattr(args, "sf_encoder_output", "fast")
    args.sf_interaction_layers = getattr(args, "sf_interaction_layers", "none")
