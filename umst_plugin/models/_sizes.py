"""Size presets shared by the architecture registrations (getattr defaults: user flags win)."""


def transformer_big_sizes(args, dropout=0.3):
    """Transformer-big sizes on both sides (1024 / 4096 / 16 heads) and residual dropout 0.3,
    the "big" setting every paper here inherits from Vaswani et al."""
    for side in ("encoder", "decoder"):
        setattr(args, f"{side}_embed_dim", getattr(args, f"{side}_embed_dim", 1024))
        setattr(args, f"{side}_ffn_embed_dim", getattr(args, f"{side}_ffn_embed_dim", 4096))
        setattr(args, f"{side}_attention_heads", getattr(args, f"{side}_attention_heads", 16))
    args.dropout = getattr(args, "dropout", dropout)
