"""MSC's options (``add_args``; docs/msc.md) and the defaults every MSC arch shares."""
from fairseq.models.transformer import transformer_legacy

from umst_plugin.modules.msc.layer import CONTEXT_CELLS, FUSIONS


DEFAULT_MAX_POSITIONS = 1024
GRAD_NORMS_FILENAME = "encoder_grad_norms.jsonl"


def add_args(parser):
    """MSC's options (fairseq's transformer options come first, from the model's ``add_args``)."""
    parser.add_argument("--encoder-blocks", type=int, metavar="N",
                        help="number of encoder blocks N (= decoder layers); paper: 6")
    parser.add_argument("--encoder-layers-per-block", type=int, metavar="M",
                        help="encoder layers per block M; encoder depth = N*M "
                             "(paper: 6x6=36, 6x8=48, 6x9=54, 6x12=72)")
    parser.add_argument("--msc-fusion", choices=FUSIONS,
                        help="fuse hidden and context attention with the sigmoid gate of "
                             "Eqs. 12-13 (gate) or by addition (add; table 5 ablation)")
    parser.add_argument("--context-cell", choices=CONTEXT_CELLS,
                        help="contextual collaboration cell Q of Eq. 9: gru, or ffn "
                             "(table 5 ablation)")
    parser.add_argument("--no-context-attention", action="store_true",
                        help="remove the encoder's attention over C^{n-1} (CXT-ENC "
                             "attention, table 5); the decoder still attends C^n")
    parser.add_argument("--no-contextual-collaboration", action="store_true",
                        help="remove the context cell and all context attention (table 5)")
    parser.add_argument("--no-block-collaboration", action="store_true",
                        help="every decoder layer attends the top encoder block; with "
                             "--no-contextual-collaboration this is the plain deep pre-norm "
                             "Transformer of figure 2")
    parser.add_argument("--encoder-l2", type=float, metavar="LAMBDA",
                        help="L2 penalty LAMBDA*sum ||W||^2 over encoder weight matrices "
                             "(not embeddings, biases or LayerNorm), added to the per-token "
                             "training loss; paper: 1e-5 for 72-layer IWSLT (table 2)")
    parser.add_argument("--log-encoder-grad-norms", action="store_true",
                        help="during training, write per-encoder-layer gradient norms "
                             "(figure 5) as JSONL to --encoder-grad-norms-file")
    parser.add_argument("--encoder-grad-norms-file", type=str, metavar="PATH",
                        help=f"default: <save-dir>/{GRAD_NORMS_FILENAME}")
    parser.add_argument("--encoder-grad-norms-interval", type=int, metavar="K",
                        help="log every K updates (default 1)")


def msc_defaults(args):
    """The defaults every MSC arch shares (getattr defaults: user flags win; MSC is pre-norm by construction)."""
    args.encoder_blocks = getattr(args, "encoder_blocks", 6)
    args.encoder_layers_per_block = getattr(args, "encoder_layers_per_block", 1)
    args.encoder_layers = getattr(args, "encoder_layers",
                                  args.encoder_blocks * args.encoder_layers_per_block)
    args.decoder_layers = getattr(args, "decoder_layers", args.encoder_blocks)
    # MSC layers are pre-norm by construction (section 2).
    args.encoder_normalize_before = True
    args.decoder_normalize_before = True
    args.attention_dropout = getattr(args, "attention_dropout", 0.1)  # dp_a (table 2)
    args.msc_fusion = getattr(args, "msc_fusion", "gate")
    args.context_cell = getattr(args, "context_cell", "gru")
    args.no_context_attention = getattr(args, "no_context_attention", False)
    args.no_contextual_collaboration = getattr(args, "no_contextual_collaboration", False)
    args.no_block_collaboration = getattr(args, "no_block_collaboration", False)
    args.encoder_l2 = getattr(args, "encoder_l2", 0.0)
    args.log_encoder_grad_norms = getattr(args, "log_encoder_grad_norms", False)
    args.encoder_grad_norms_file = getattr(args, "encoder_grad_norms_file", None)
    args.encoder_grad_norms_interval = getattr(args, "encoder_grad_norms_interval", 1)
    transformer_legacy.base_architecture(args)
