"""Size presets shared by the architecture registrations (getattr defaults: user flags win)."""

BASE = dict(embed_dim=512, ffn_embed_dim=2048, attention_heads=8)  # Vaswani et al.'s base
BIG = dict(embed_dim=1024, ffn_embed_dim=4096, attention_heads=16)  # and big
IWSLT = dict(embed_dim=256, ffn_embed_dim=512, attention_heads=4)  # fairseq's transformer_iwslt_de_en


def transformer_sizes(args, sizes, sides=("encoder", "decoder")):
    """``{side}_embed_dim``, ``{side}_ffn_embed_dim`` and ``{side}_attention_heads`` of ``sizes`` on ``sides``,
    where the user set none."""
    for side in sides:
        for name, value in sizes.items():
            setattr(args, f"{side}_{name}", getattr(args, f"{side}_{name}", value))


def transformer_big_sizes(args, dropout=0.3):
    """Transformer-big sizes on both sides (1024 / 4096 / 16 heads) and residual dropout 0.3,
    the "big" setting every paper here inherits from Vaswani et al."""
    transformer_sizes(args, BIG)
    args.dropout = getattr(args, "dropout", dropout)
