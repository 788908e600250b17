"""TranSFormer's encoder: subword (slow) and character (fast) embeddings, the two-branch stack
(:mod:`umst_plugin.modules.transformer_sf.layer`), fairseq's encoder-out dict; and :class:`SlowFastInput`, what
the encoder runs before its first block as one compile region."""
import math
from typing import Optional

import torch
import torch.nn as nn
from fairseq.models import FairseqEncoder
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from fairseq.modules import PositionalEmbedding

from umst_plugin.compilation import is_compiled
from umst_plugin.models.transformer_sf.config import slowfast_config_from_args
from umst_plugin.modules.transformer_sf.char_table import CHAR_PAD, CharTable
from umst_plugin.modules.transformer_sf.layer import SlowFastEncoderStack, slow_branch_is_read


RANDOM_BOUNDARY_TABLE = 4099  # prime; size of the fixed hash table behind --random-char-boundary
RANDOM_BOUNDARY_RATE = 0.2  # ~5 characters per pseudo-word, like English words (paper fig. 2c)


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
