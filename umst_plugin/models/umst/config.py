"""UMST's options (``add_args``: every ablation of tables 5, 6, 8 is a flag; docs/umst.md) and the defaults
every UMST arch shares."""
from umst_plugin.modules.umst.graphs import PHRASE_NOISE, UPSAMPLE_MODES, WORD_BOUNDARY_NOISE
from umst_plugin.modules.umst.layer import GCN_ACTIVATIONS, INTRA_GROUP_OPS, PHRASE_GCN_FORMS
from umst_plugin.modules.umst.rectified_attention import ATTENTION_DROPOUT_MODES, UPSAMPLE_NORMS


SHARE_GCN_PROJ = ("none", "across-layers", "within-layer")


def add_args(parser):
    """UMST's options, in the model's argument group (fairseq's transformer options come first)."""
    g = parser  # the caller's model-specific group (argument_default=SUPPRESS keeps arch defaults working)
    g.add_argument("--no-class-embedding", action="store_true",
                   help="drop the binary word/sub-word class embedding (table 5 'w/o class-embedding')")
    g.add_argument("--no-intra-group", action="store_true",
                   help="drop the intra-group (word GCN) interaction (table 5 'w/o intra-group')")
    g.add_argument("--no-inter-group", action="store_true",
                   help="drop the inter-group (phrase/dependency GCN) interaction (table 5 'w/o inter-group')")
    g.add_argument("--intra-group-op", choices=INTRA_GROUP_OPS,
                   help="intra-group operator: gcn (default, Eq. 2), pool (average pooling), gat (table 5)")
    g.add_argument("--share-gcn-proj", choices=SHARE_GCN_PROJ,
                   help="share W_w and W_p: none (default), across-layers (table 6 #2), within-layer (#3)")
    g.add_argument("--share-rsan-qk", action="store_true",
                   help="word branch of the rectified attention reuses the subword Q/K projections (table 6 #4)")
    g.add_argument("--rsan-upsample", choices=UPSAMPLE_MODES,
                   help="ATTN2 -> ATTN2' up-sampling: gather (default, Eq. 4), nearest or linear "
                        "interpolation (table 6 #5, #6)")
    g.add_argument("--rsan-upsample-norm", choices=UPSAMPLE_NORMS,
                   help="row (default): G ATTN2 diag(1/n) G^T, row-stochastic; literal: G ATTN2 G^T as Eq. 4 "
                        "(rows sum to the mean piece count)")
    g.add_argument("--rsan-attention-dropout", choices=ATTENTION_DROPOUT_MODES,
                   help="per-map (default): attention dropout on ATTN1 and, at word level, on ATTN2, so ATTN2' is "
                        "never built; fused: build (ATTN1 + ATTN2')/2 in training and drop its entries, like a "
                        "transformer's single map (same expectation, different noise; O(B.H.L^2) more memory)")
    g.add_argument("--word-downsample", choices=("mean", "scaled-sum"),
                   help="subword -> word pooling: mean (default, section 3.3) or sum/sqrt(n) (authors' code)")
    g.add_argument("--phrase-gcn-form", choices=PHRASE_GCN_FORMS,
                   help="phrase GCN: eq3 (default, the paper's Eq. 3: xw + ReLU(A_p (LN(xw) W_p + b))) or "
                        "authors (libeineu/UMST's code: xw + A_p ReLU(W_p (A_p LN(xw)) + b), A_p applied twice, "
                        "the activation dropout between the products)")
    g.add_argument("--word-boundary-noise", choices=WORD_BOUNDARY_NOISE,
                   help="replace A_w of the word GCN by a random (Bernoulli 0.5) or shuffled one (table 8; "
                        "combine with --no-inter-group as the paper does)")
    g.add_argument("--phrase-adjacency-noise", choices=PHRASE_NOISE,
                   help="replace A_p by a random symmetric Bernoulli(0.5) matrix (table 8 'UMST + Random P')")
    g.add_argument("--gcn-activations", choices=GCN_ACTIVATIONS,
                   help="what training keeps for the GCN blocks' backward (same math and dropout masks in all): "
                        "lean (default: inputs and 1-byte masks, hand-written backward), store (plain autograd, "
                        "the reference), recompute (checkpointing, also of RSAN's word branch: least memory, "
                        "slowest)")
    g.add_argument("--no-gcn-recompute", action="store_true",
                   help="deprecated alias of --gcn-activations store")
    g.add_argument("--max-relative-positions", type=int, metavar="K",
                   help="Shaw et al. relative positions in the rectified attention, clipping distance K "
                        "(0 = off; the *_rpr archs use 16)")


def umst_defaults(args):
    """The defaults every UMST arch shares (getattr defaults: user flags win)."""
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    args.no_class_embedding = getattr(args, "no_class_embedding", False)
    args.no_intra_group = getattr(args, "no_intra_group", False)
    args.no_inter_group = getattr(args, "no_inter_group", False)
    args.intra_group_op = getattr(args, "intra_group_op", None) or "gcn"
    args.share_gcn_proj = getattr(args, "share_gcn_proj", None) or "none"
    args.share_rsan_qk = getattr(args, "share_rsan_qk", False)
    args.rsan_upsample = getattr(args, "rsan_upsample", None) or "gather"
    args.rsan_upsample_norm = getattr(args, "rsan_upsample_norm", None) or "row"
    args.word_downsample = getattr(args, "word_downsample", None) or "mean"
    args.phrase_gcn_form = getattr(args, "phrase_gcn_form", None) or "eq3"
    args.rsan_attention_dropout = getattr(args, "rsan_attention_dropout", None) or "per-map"
    args.no_gcn_recompute = getattr(args, "no_gcn_recompute", False)
    args.gcn_activations = getattr(args, "gcn_activations", None) or ("store" if args.no_gcn_recompute else "lean")
    args.word_boundary_noise = getattr(args, "word_boundary_noise", None) or "none"
    args.phrase_adjacency_noise = getattr(args, "phrase_adjacency_noise", None) or "none"
    mrp = getattr(args, "max_relative_positions", None)
    args.max_relative_positions = 0 if mrp is None else mrp
