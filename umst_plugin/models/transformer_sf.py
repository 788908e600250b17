"""TranSFormer: Slow-Fast Transformer for MT (Li et al., ACL 2023), fairseq model ``transformer_sf``.

Architectures ``transformer_sf_base`` (slow 512/2048/8 heads, fast 32/128) and
``transformer_sf_big`` (slow 1024/4096/16, fast 64/256), 6 encoder blocks in both
branches, pre-norm, and fairseq's standard ``TransformerDecoder`` attending the
slow branch (``--sf-encoder-output slow``, paper 3.4). ``transformer_sf_fast_only_base``
/ ``_big`` are table 1's "Fast Only" rows: the same model with
``--sf-encoder-output fast --sf-interaction-layers none``, so the fast (character)
branch alone is the encoder and is projected to the decoder width
(``--encoder-embed-dim``); no slow sub-layer is built.

The fast branch's characters are derived from ``src_tokens`` through a
``CharTable`` built from the source dictionary and saved in the checkpoint, so
the model runs under ``translation`` and ``multiscale_translation`` tasks and in
fairseq-generate / fairseq-interactive with no side input. Subword->word groups
(A_s) come from the same table, so ``src_word_ids`` from the task is accepted
and ignored (both follow the same definition: 1-based words, </s> its own word).
See ``umst_plugin/modules/transformer_sf/encoder.py`` for the block and docs/transformer_sf.md.
"""
import math
from typing import Optional

import torch
import torch.nn as nn

from fairseq.models import FairseqEncoder, register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from fairseq.modules import PositionalEmbedding

from umst_plugin.compilation import is_compiled
from umst_plugin import families
from umst_plugin.hub import RawTextFromPretrained  # from_pretrained applies the data-bin's text record
from umst_plugin.models._sizes import transformer_big_sizes
from umst_plugin.modules.transformer_sf.char_table import CHAR_PAD, STYLES, CharTable
from umst_plugin.modules.transformer_sf.encoder import (
    ENCODER_OUTPUTS,
    SLOW_GCN,
    SlowFastConfig,
    SlowFastEncoderStack,
    SlowFastLayer,
    parse_interaction_layers,
    slow_branch_is_read,
)
from umst_plugin.modules.transformer_sf.fusion import FUSIONS

RANDOM_BOUNDARY_TABLE = 4099  # prime; size of the fixed hash table behind --random-char-boundary
RANDOM_BOUNDARY_RATE = 0.2  # ~5 characters per pseudo-word, like English words (paper fig. 2c)


@register_model("transformer_sf")
class TransformerSlowFastModel(RawTextFromPretrained, TransformerModel):
    """Transformer whose encoder is the two-branch Slow-Fast encoder."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
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

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SlowFastEncoder(args, src_dict, embed_tokens)

    def host_batch_hint(self):
        """For multiscale_translation's collater: the batch's character length, computed on the host, so the
        encoder learns it without a host-device sync (``CharTable.forward``'s ``char_len``)."""
        return self.encoder.char_table.host_hint()

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer=None, alignment_heads=None, src_char_len=None):
        """fairseq's encoder-decoder forward, passing on the host-side character length the task's collater
        computes (``src_char_len``; without it the encoder reads it off the device)."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
                                   src_char_len=src_char_len)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                            alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                            src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)


def slowfast_config_from_args(args):
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


class SlowFastEncoder(FairseqEncoder):
    """Embeds subwords (slow) and characters (fast), runs the two-branch stack,
    and returns fairseq's encoder-out dict for the decoder."""

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        if not args.encoder_normalize_before:
            raise ValueError("transformer_sf is pre-norm only (paper fig. 3); drop --encoder-normalize-before false")
        self.cfg = slowfast_config_from_args(args)
        self.padding_idx = embed_tokens.padding_idx
        self.max_source_positions = args.max_source_positions
        self.dropout = args.dropout
        slow_dim, fast_dim = self.cfg.slow_dim, self.cfg.fast_dim

        # Fast only: nothing reads the slow branch, so the encoder keeps no subword embedding
        # (with --share-all-embeddings the decoder still owns the shared one).
        self.uses_slow = slow_branch_is_read(self.cfg)
        self.embed_tokens = embed_tokens if self.uses_slow else None
        self.embed_scale = 1.0 if args.no_scale_embedding else math.sqrt(slow_dim)
        self.embed_positions = (None if args.no_token_positional_embeddings or not self.uses_slow else
                                PositionalEmbedding(args.max_source_positions, slow_dim, self.padding_idx,
                                                    learned=args.encoder_learned_pos))

        self.fast_input = args.fast_input
        self.random_char_boundary = args.random_char_boundary
        self.char_table = CharTable.from_dictionary(dictionary, style=args.sf_subword_style)
        if self.fast_input == "char":
            self.fast_padding_idx = CHAR_PAD
            self.embed_fast = nn.Embedding(self.char_table.num_chars, fast_dim, padding_idx=CHAR_PAD)
        else:
            self.fast_padding_idx = self.padding_idx
            self.embed_fast = nn.Embedding(len(dictionary), fast_dim, padding_idx=self.padding_idx)
        nn.init.normal_(self.embed_fast.weight, mean=0, std=fast_dim ** -0.5)
        nn.init.constant_(self.embed_fast.weight[self.fast_padding_idx], 0)
        self.fast_embed_scale = 1.0 if args.no_scale_embedding else math.sqrt(fast_dim)
        # Characters are ~5x the subwords; sinusoidal tables grow on demand beyond this size.
        self.embed_fast_positions = (None if args.no_token_positional_embeddings else
                                     PositionalEmbedding(4 * args.max_source_positions, fast_dim,
                                                         self.fast_padding_idx, learned=False))
        if self.random_char_boundary:
            gen = torch.Generator().manual_seed(0)
            self.register_buffer("random_boundary_table",
                                 torch.rand(RANDOM_BOUNDARY_TABLE, generator=gen) < RANDOM_BOUNDARY_RATE)

        self.stack = SlowFastEncoderStack(self.cfg)
        self.inputs = SlowFastInput(self)
        self.fast_output_proj = (nn.Linear(fast_dim, slow_dim) if self.cfg.encoder_output in ("fast", "both")
                                 else None)

    # fairseq's own reordering works on the same dict layout.
    reorder_encoder_out = TransformerEncoderBase.reorder_encoder_out

    def max_positions(self):
        if self.embed_positions is None:
            return self.max_source_positions
        return min(self.max_source_positions, self.embed_positions.max_positions)

    def _random_groups(self, fast_tokens, padding_mask):
        """Pseudo-random word boundaries for --random-char-boundary: a function of each
        item's position within its sentence and its id only (so batch/padding invariant)."""
        valid = ~padding_mask
        pos = torch.cumsum(valid.long(), dim=1) - 1
        starts = self.random_boundary_table[(pos * 31 + fast_tokens) % RANDOM_BOUNDARY_TABLE]
        starts = (starts | pos.eq(0)) & valid
        return torch.cumsum(starts.long(), dim=1) * valid.long()

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens=False, token_embeddings=None,
                src_char_len=None):
        if src_char_len is None and self.fast_input == "char" and is_compiled(self.inputs):
            # compiled code cannot read a size off the device: the one host sync CharTable.forward makes, here
            src_char_len = self.char_table.max_char_length(src_tokens)
        x_slow, x_fast, side = self.inputs(src_tokens, src_char_len, token_embeddings)
        slow_padding_mask, fast_padding_mask, embed = side["slow_padding_mask"], side["fast_padding_mask"], side["embed"]
        slow_out, fast_out = self.stack.blocks(x_slow, x_fast, side)
        if self.cfg.encoder_output == "slow":
            out, mask, enc_embedding = slow_out, slow_padding_mask, [embed]
        elif self.cfg.encoder_output == "fast":
            out, mask, enc_embedding = self.fast_output_proj(fast_out), fast_padding_mask, []
        else:  # both: the decoder attends the concatenation of subword and character states
            out = torch.cat([slow_out, self.fast_output_proj(fast_out)], dim=0)
            mask, enc_embedding = torch.cat([slow_padding_mask, fast_padding_mask], dim=1), []
        return {
            "encoder_out": [out],  # T x B x C
            "encoder_padding_mask": [mask],  # B x T
            "encoder_embedding": enc_embedding,  # B x T x C
            "encoder_states": [],
            "src_tokens": [],
            "src_lengths": [src_lengths] if src_lengths is not None else [],
        }


class SlowFastInput(nn.Module):
    """What the encoder runs before its first block, as one module: the characters of the batch
    (``CharTable``), both branches' embeddings, and the stack's ``prepare`` (the lean path's plan and the subword
    GCN on the input). ``--compile`` compiles it as one program like the layers (``umst_plugin.compilation``), so the
    many small integer and elementwise ops of this part fuse instead of each launching a kernel eagerly.

    Holds no parameters: it reads its encoder's modules (a plain reference, not a submodule, so the checkpoint's
    keys stay the encoder's)."""

    compile_region = True  # --compile compiles it as one program (umst_plugin/compilation/regions.py)

    def __init__(self, encoder):
        super().__init__()
        object.__setattr__(self, "encoder", encoder)

    def forward(self, src_tokens, src_char_len: Optional[int] = None, token_embeddings=None):
        """(x_slow T x B x C or None, x_fast Lf x B x C or None, side) as ``SlowFastEncoderStack.blocks`` takes
        them; ``side["embed"]``: the scaled subword embedding (fairseq's ``encoder_embedding``)."""
        encoder = self.encoder
        slow_padding_mask = src_tokens.eq(encoder.padding_idx)
        chars = encoder.char_table(src_tokens, char_len=src_char_len)
        if encoder.fast_input == "char":
            fast_tokens, fast_groups, char_token_index = chars.chars, chars.char_groups, chars.char_token_index
        else:
            fast_tokens, fast_groups = src_tokens, chars.token_word_ids
            positions = torch.arange(1, src_tokens.size(1) + 1, device=src_tokens.device)
            char_token_index = positions.unsqueeze(0) * (~slow_padding_mask).long()
        fast_padding_mask = fast_tokens.eq(encoder.fast_padding_idx)
        if encoder.random_char_boundary:
            fast_groups = encoder._random_groups(fast_tokens, fast_padding_mask)

        drop = nn.functional.dropout
        embed = x_slow = None
        if encoder.uses_slow:
            embed = encoder.embed_scale * (encoder.embed_tokens(src_tokens) if token_embeddings is None
                                        else token_embeddings)
            x_slow = embed
            if encoder.embed_positions is not None:
                x_slow = x_slow + encoder.embed_positions(src_tokens)
            x_slow = drop(x_slow, p=encoder.dropout, training=encoder.training)
            # Zero padded rows so nothing from padding can leak (e.g. fp16 garbage).
            x_slow = x_slow.masked_fill(slow_padding_mask.unsqueeze(-1), 0.0).transpose(0, 1)
        x_fast = encoder.fast_embed_scale * encoder.embed_fast(fast_tokens)
        if encoder.embed_fast_positions is not None:
            x_fast = x_fast + encoder.embed_fast_positions(fast_tokens)
        x_fast = drop(x_fast, p=encoder.dropout, training=encoder.training)
        x_fast = x_fast.masked_fill(fast_padding_mask.unsqueeze(-1), 0.0).transpose(0, 1)

        side = {
            "slow_padding_mask": slow_padding_mask,
            "fast_padding_mask": fast_padding_mask,
            "slow_groups": chars.token_word_ids,
            "fast_gcn_groups": fast_groups,
            "fast_pe_groups": fast_groups,
            "fast_pe_boundary": True,
            "char_token_index": char_token_index,
            # Static upper bounds on the group ids (no device sync): words <= T, char groups <= 2 T.
            "slow_num_groups": src_tokens.size(1) + 1,
            "fast_num_groups": (fast_tokens.size(1) if encoder.random_char_boundary else
                                2 * src_tokens.size(1) if encoder.fast_input == "char" else src_tokens.size(1)) + 1,
        }
        side["embed"] = embed
        return encoder.stack.prepare(x_slow, x_fast, side)


def _slowfast_defaults(args):
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


@register_model_architecture("transformer_sf", "transformer_sf_base")
def transformer_sf_base(args):
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 512)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 2048)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 8)
    args.encoder_layers = getattr(args, "encoder_layers", 6)
    args.fast_embed_dim = getattr(args, "fast_embed_dim", 32)
    _slowfast_defaults(args)


@register_model_architecture("transformer_sf", "transformer_sf_big")
def transformer_sf_big(args):
    transformer_big_sizes(args)  # paper: residual dropout 0.3 for big
    args.fast_embed_dim = getattr(args, "fast_embed_dim", 64)
    transformer_sf_base(args)


def _fast_only(args):
    """Table 1 "Fast Only": the character branch alone encodes (no slow branch, no fusion) and a
    linear map widens it to the subword decoder (--encoder-embed-dim = the decoder's width)."""
    args.sf_encoder_output = getattr(args, "sf_encoder_output", "fast")
    args.sf_interaction_layers = getattr(args, "sf_interaction_layers", "none")


@register_model_architecture("transformer_sf", "transformer_sf_fast_only_base")
def transformer_sf_fast_only_base(args):
    """Fast Only (Hidden=32, L=6): characters at width 32, decoder 512 (table 1: 42M, 17.90 BLEU)."""
    _fast_only(args)
    transformer_sf_base(args)


@register_model_architecture("transformer_sf", "transformer_sf_fast_only_big")
def transformer_sf_fast_only_big(args):
    """The big counterpart: characters at width 64 (transformer_sf_big's), decoder 1024."""
    _fast_only(args)
    transformer_sf_big(args)


_SF_QUICK = dict(fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2)
families.register(families.Family(
    name="transformer_sf", title="TranSFormer", paper="Li et al., ACL 2023: TranSFormer, Slow-Fast Transformer",
    model=TransformerSlowFastModel, encoder=SlowFastEncoder, layers=(SlowFastLayer, SlowFastInput),
    bench_rows={"transformer_sf": families.BenchRow("transformer_sf_base", "transformer_sf_big", quick=_SF_QUICK,
                                                    baseline="transformer_dropout"),
                # the trade-off flag: the character branch's sub-layers recomputed in backward rather than kept
                "transformer_sf_recompute": families.BenchRow(
                    "transformer_sf_base", "transformer_sf_big", overrides={"sf_recompute_fast": True},
                    quick=_SF_QUICK, baseline="transformer_dropout", label=" --sf-recompute-fast", extra=True)}))
