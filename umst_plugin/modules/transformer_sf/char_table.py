"""Character view of a subword sentence, derived on device from the source dictionary.

TranSFormer's fast branch reads the *characters* of the source sentence with a
word separator between words (paper fig. 2a). Nothing outside the subword
tokens is needed: ``CharTable`` is built once from the source dictionary's
symbols and stores, per dictionary entry, its characters (as character-vocabulary
ids) and whether it glues to its neighbour:

* subword-nmt (``new@@ est``): an entry ending in ``@@`` joins the *next* token (a bare ``@@`` too);
* sentencepiece (``▁new est``): an entry *without* a leading ``▁`` joins the
  *previous* token; a bare ``▁`` starts a word and has no characters;
* plain words: every token is its own word.

Special entries (``<s> <pad> </s> <unk>`` and fairseq's ``madeupwordNNNN``
fillers) become one opaque "character" each, so ``</s>`` is a word of its own,
as in the task's ``src_word_ids``. Characters are Unicode code points (no
normalisation), so non-ASCII symbols are handled like any other.

All tables are registered *persistent buffers*: a checkpoint carries the
character vocabulary (``char_codepoints``) and the per-entry table, and
``fairseq-generate`` / ``fairseq-interactive`` need no side file. At run time
``CharTable.forward(src_tokens)`` gathers from these buffers with vectorised
tensor ops on the tokens' device (any padding side) and returns a ``CharBatch``.

Character-vocabulary ids: 0 = padding, 1 = word separator, 2 .. 1+S = the S
special entries (dictionary order), then the real characters sorted by code point.
"""
from dataclasses import dataclass
import copy
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from umst_plugin.data.word_boundaries import SENTENCEPIECE, SUBWORD_NMT, detect_scheme, \
    word_ids_from_tokens
from umst_plugin.data.word_boundaries import SP_MARK as SPM_MARK

CHAR_PAD = 0
CHAR_SEP = 1
STYLES = ("auto", "subword-nmt", "sentencepiece", "word")
BPE_MARK = "@@"


@dataclass
class CharBatch:
    """Characters of a batch of subword sentences (right-padded, B x Lf).

    chars:             char-vocabulary ids, CHAR_PAD at padding.
    char_groups:       A_f group id per character (0 = padding): the characters of
                       word w have id 2w, the separator before word w has 2w - 1
                       (a group of its own).
    char_token_index:  1-based column in src_tokens of the token each character
                       came from (a separator belongs to the token after it); 0 = pad.
    token_word_ids:    B x T, laid out like src_tokens: 1-based word index of each
                       subword (A_s group id), 0 at padding; </s> is its own word.
    """

    chars: torch.Tensor
    char_groups: torch.Tensor
    char_token_index: torch.Tensor
    token_word_ids: torch.Tensor

    @property
    def char_padding_mask(self):
        return self.chars.eq(CHAR_PAD)


def _is_special(index, symbol, num_special):
    return index < num_special or (symbol.startswith("madeupword") and symbol[10:].isdigit())


def split_symbol(symbol: str, style: str):
    """(text, joins_prev, joins_next) of one non-special dictionary symbol.

    A bare ``@@`` joins the next token with no characters of its own, as the task's word boundaries
    (``umst_plugin.data.word_boundaries``) and subword-nmt's own decoding (``sed 's/@@ //g'``) read it, so the
    table's word ids equal the task's ``src_word_ids`` on every sentence."""
    if style == "subword-nmt":
        if symbol.endswith(BPE_MARK):
            return symbol[:-2], False, True
        return symbol, False, False
    if style == "sentencepiece":
        if symbol.startswith(SPM_MARK):
            return symbol[1:], False, False
        return symbol, True, False
    if style == "word":
        return symbol, False, False
    raise ValueError(f"unknown subword style {style!r}; expected one of {STYLES[1:]}")


class CharTable(nn.Module):
    """Per-dictionary-entry character table; ``forward(src_tokens) -> CharBatch``."""

    def __init__(self, symbols: Sequence[str], pad_index: int, eos_index: int, num_special: int,
                 style: str = "auto"):
        super().__init__()
        if style not in STYLES:
            raise ValueError(f"unknown subword style {style!r}; expected one of {STYLES}")
        symbols = list(symbols)
        if style == "auto":  # the task's rule, so that the table's word ids are the task's src_word_ids
            style = detect_scheme(symbols[num_special:])
        self.style = style
        self.pad_index, self.eos_index = pad_index, eos_index

        specials = [i for i, s in enumerate(symbols) if _is_special(i, s, num_special)]
        pieces = {}
        for i, s in enumerate(symbols):
            if i not in specials:
                pieces[i] = split_symbol(s, style)
        charset = sorted({c for text, _, _ in pieces.values() for c in text})
        special_char_id = {idx: 2 + k for k, idx in enumerate(specials)}
        first_real = 2 + len(specials)
        char_id = {c: first_real + k for k, c in enumerate(charset)}

        max_chars = max([1] + [len(t) for t, _, _ in pieces.values()])
        table = torch.zeros(len(symbols), max_chars, dtype=torch.int32)
        num_chars = torch.zeros(len(symbols), dtype=torch.int32)
        joins_prev = torch.zeros(len(symbols), dtype=torch.bool)
        joins_next = torch.zeros(len(symbols), dtype=torch.bool)
        for idx in specials:
            if idx != pad_index:
                table[idx, 0] = special_char_id[idx]
                num_chars[idx] = 1
        for idx, (text, jp, jn) in pieces.items():
            if text:
                table[idx, : len(text)] = torch.tensor([char_id[c] for c in text], dtype=torch.int32)
            num_chars[idx] = len(text)
            joins_prev[idx], joins_next[idx] = jp, jn
        codepoints = torch.full((first_real + len(charset),), -1, dtype=torch.int32)
        if charset:
            codepoints[first_real:] = torch.tensor([ord(c) for c in charset], dtype=torch.int32)

        # Persistent: the checkpoint is self-contained.
        self.register_buffer("token_chars", table)
        self.register_buffer("token_num_chars", num_chars)
        self.register_buffer("token_joins_prev", joins_prev)
        self.register_buffer("token_joins_next", joins_next)
        self.register_buffer("char_codepoints", codepoints)
        self._special_names = {special_char_id[i]: symbols[i] for i in specials}

    def host_hint(self):
        """A picklable ``src_tokens -> {"src_char_len": int}`` for the task's collater (a CPU copy of the table)."""
        return CharLengthHint(self)

    @classmethod
    def from_dictionary(cls, dictionary, style="auto"):
        return cls(dictionary.symbols, dictionary.pad(), dictionary.eos(), dictionary.nspecial, style=style)

    @property
    def num_chars(self):
        """Size of the character vocabulary (including pad and separator)."""
        return self.char_codepoints.numel()

    # ------------------------------------------------------------------ device-side derivation
    def word_ids(self, src_tokens):
        """B x T 1-based word index per subword (0 = pad); any padding side.

        Delegates to the task's own rule (``umst_plugin.data.word_boundaries``) so
        these ids equal the ``src_word_ids`` that multiscale_translation provides."""
        scheme = SENTENCEPIECE if self.style == "sentencepiece" else SUBWORD_NMT
        return word_ids_from_tokens(src_tokens, self.pad_index, self.eos_index, self.token_joins_next,
                                    ~self.token_joins_prev, scheme)

    def _layout(self, src_tokens):
        """(word ids, separator-before flags (bool and long), characters per token, end slot of each token) of a
        batch."""
        word_ids = self.word_ids(src_tokens)
        previous = F.pad(word_ids, (1, 0))[:, :-1]  # the id before each token (0 before the first)
        sep_flag = (word_ids > 1) & (word_ids != previous)  # a separator before every word but the first
        sep_before = sep_flag.long()
        n_chars = torch.where(word_ids > 0, self.token_num_chars[src_tokens], 0)
        ends = torch.cumsum(n_chars + sep_before, dim=1)
        return word_ids, sep_flag, sep_before, n_chars, ends

    def max_char_length(self, src_tokens) -> int:
        """The longest character sequence of the batch (what ``forward`` sizes its output by)."""
        if src_tokens.size(1) == 0:
            return 0
        return int(self._layout(src_tokens)[-1][:, -1].max())

    def forward(self, src_tokens, char_len: Optional[int] = None) -> CharBatch:
        """``char_len``: the batch's ``max_char_length``, when the host already knows it (the task's collater
        computes it on the host: ``src_char_len``); without it, it is read off the device (one host sync)."""
        batch, seq_len = src_tokens.shape
        device = src_tokens.device
        word_ids, sep_flag, sep_before, n_chars, ends = self._layout(src_tokens)
        starts = ends - (n_chars + sep_before)  # exclusive cumsum: first output slot of each token
        if char_len is None:
            char_len = int(ends[:, -1].max().item()) if seq_len > 0 else 0
        width = char_len + 1  # last column is a dump slot for masked writes
        max_chars = self.token_chars.size(1)

        k = torch.arange(max_chars, device=device)
        dest = torch.where(k < n_chars.unsqueeze(-1), (starts + sep_before).unsqueeze(-1) + k, char_len)  # B x T x M
        row = torch.arange(batch, device=device).view(-1, 1) * width
        flat_dest = (row.unsqueeze(-1) + dest).view(-1)
        flat_sep = (row + torch.where(sep_flag, starts, char_len)).view(-1)

        # the three outputs in one buffer: characters, A_f groups (2w for word w's characters, 2w - 1 for the
        # separator before it), 1-based token column
        twice_word = 2 * word_ids
        token_col = torch.arange(1, seq_len + 1, device=device).view(1, -1).expand(batch, -1)
        per_char = torch.stack([self.token_chars[src_tokens].long(),
                                twice_word.unsqueeze(-1).expand(-1, -1, max_chars),
                                token_col.unsqueeze(-1).expand(-1, -1, max_chars)])
        per_sep = torch.stack([word_ids.new_full((), CHAR_SEP).expand(batch, seq_len), twice_word - 1, token_col])
        out = torch.zeros(3, batch * width, dtype=torch.long, device=device)
        # The dump column collects masked writes (order undefined) and is cut off.
        out[:, flat_dest] = per_char.view(3, -1)
        out[:, flat_sep] = per_sep.view(3, -1)
        chars, groups, token_index = out.view(3, batch, width)[:, :, :char_len].unbind(0)
        return CharBatch(chars=chars, char_groups=groups, char_token_index=token_index, token_word_ids=word_ids)

    # ------------------------------------------------------------------ host-side inspection
    def char_string(self, char_id: int) -> str:
        if char_id == CHAR_SEP:
            return " "
        if char_id == CHAR_PAD:
            return ""
        cp = int(self.char_codepoints[char_id])
        return chr(cp) if cp >= 0 else self._special_names.get(char_id, f"<special{char_id}>")

    def decode_chars(self, chars: Sequence[int]) -> str:
        """Character ids -> text with single spaces between words (padding dropped)."""
        return "".join(self.char_string(int(c)) for c in chars if int(c) != CHAR_PAD)

    def decode_words(self, chars: Sequence[int]) -> List[str]:
        return self.decode_chars(chars).split(" ")

    def resegment(self, batch: CharBatch, row: int) -> List[str]:
        """Rebuild sentence ``row``'s subword symbols (with ``@@`` / ``▁`` markers)
        from its characters, their token index and the separators alone: the
        chars -> words -> subwords direction of the round trip. (A sentencepiece
        bare ``▁`` token has no characters and cannot be recovered.)"""
        texts, word_start, order = {}, {}, []
        for c, t in zip(batch.chars[row].tolist(), batch.char_token_index[row].tolist()):
            if c == CHAR_PAD:
                continue
            if t not in texts:
                texts[t], word_start[t] = [], not order  # first token of the sentence starts a word
                order.append(t)
            if c == CHAR_SEP:
                word_start[t] = True
            else:
                texts[t].append(self.char_string(c))
        symbols = []
        for k, t in enumerate(order):
            text = "".join(texts[t])
            is_special = len(texts[t]) == 1 and text in self._special_names.values()
            if self.style == "subword-nmt" and not is_special:
                if k + 1 < len(order) and not word_start[order[k + 1]]:
                    text += BPE_MARK
            elif self.style == "sentencepiece" and not is_special and word_start[t]:
                text = SPM_MARK + text
            symbols.append(text)
        return symbols


class CharLengthHint:
    """Computes, on the host, the ``char_len`` that ``CharTable.forward`` would read off the device."""

    def __init__(self, table: CharTable):
        self.table = copy.deepcopy(table).cpu()

    def __call__(self, src_tokens):
        return {"src_char_len": self.table.max_char_length(src_tokens.cpu())}
