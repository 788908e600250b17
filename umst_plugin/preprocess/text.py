"""Reading BPE text safely and turning it back into parser-readable words."""
import re

import numpy as np

from umst_plugin.data.word_boundaries import SP_MARK, SUBWORD_NMT, word_ids_from_pieces, words_from_pieces
from umst_plugin.data.word_boundaries import MOSES_ESCAPES, moses_unescape  # noqa: F401  (re-exported)
from umst_plugin.preprocess.errors import SideDataError


def read_bpe_lines(path):
    """Yield (line_number, pieces) for every line of a BPE file.

    Decoding happens line by line so that a bad byte is reported with its line;
    an empty line is an error because it has no word to attach a parse to.
    """
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SideDataError(path, number, f"not valid UTF-8 ({e.reason} at byte {e.start}); "
                                    "expected UTF-8 text, one sentence per line") from None
            pieces = line.split()
            if not pieces:
                raise SideDataError(path, number, "empty line; expected at least one token "
                                    "(remove empty sentence pairs before preprocessing)")
            yield number, pieces


def parser_words(pieces, scheme):
    """Words for a dependency parser: markers removed, Moses escapes undone."""
    return [moses_unescape(w) for w in words_from_pieces(pieces, scheme)]




# ---- vectorised scan of a whole BPE file (the fast path of the writer) ----------------------

# UTF-8 encodings of the non-ASCII characters str.split() treats as whitespace. If a file has
# any, the byte-level scan would split differently from fairseq's tokenizer, so scan_bpe
# falls back to the exact (slower) line-by-line path.
_UNICODE_SPACE = re.compile(rb"\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f|\xe3\x80\x80")
_ASCII_SPACE = np.zeros(256, dtype=bool)
_ASCII_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # exactly what str.split() splits ASCII on
_SP_MARK_BYTES = SP_MARK.encode("utf-8")
BLOCK_BYTES = 1 << 24  # scan 16 MiB at a time: bounded memory on multi-GB WMT files


class BpeScan:
    """Per-line token and word counts and the flat word ids of a BPE file (or a line range of it).

    ``word_ids``: int32, the 1-based word index of every subword, lines concatenated;
    ``n_tokens`` / ``n_words``: int64 per line; ``first_line``: 1-based number of line 0.
    """

    def __init__(self, path, word_ids, n_tokens, n_words, first_line=1):
        self.path, self.word_ids, self.n_tokens, self.n_words = path, word_ids, n_tokens, n_words
        self.first_line = first_line

    def __len__(self):
        return len(self.n_tokens)

    def slice(self, a, b):
        """The scan of lines [a, b) of this one (0-based, relative to ``first_line``)."""
        bounds = np.concatenate([[0], np.cumsum(self.n_tokens)])
        return BpeScan(self.path, self.word_ids[bounds[a]:bounds[b]], self.n_tokens[a:b], self.n_words[a:b],
                       self.first_line + a)


_UTF8_LEAD = np.zeros(256, dtype=bool)
_UTF8_LEAD[[0xC2, 0xE1, 0xE2, 0xE3]] = True


def _has_unicode_space(buf):
    """Vectorised ``_UNICODE_SPACE.search``: only the rare candidate lead bytes are looked at closely."""
    cand = np.flatnonzero(_UTF8_LEAD[buf])
    if len(cand) == 0:
        return False
    padded = np.concatenate([buf, np.zeros(2, np.uint8)])
    b0, b1, b2 = padded[cand], padded[cand + 1], padded[cand + 2]
    hit = (b0 == 0xC2) & ((b1 == 0x85) | (b1 == 0xA0))
    hit |= (b0 == 0xE1) & (b1 == 0x9A) & (b2 == 0x80)
    hit |= (b0 == 0xE2) & (b1 == 0x80) & (((b2 >= 0x80) & (b2 <= 0x8A)) | (b2 == 0xA8) | (b2 == 0xA9) | (b2 == 0xAF))
    hit |= (b0 == 0xE2) & (b1 == 0x81) & (b2 == 0x9F)
    hit |= (b0 == 0xE3) & (b1 == 0x80) & (b2 == 0x80)
    return bool(hit.any())


def _scan_block(data, scheme):
    """(word_ids, n_tokens, n_words) of whole lines in ``data`` (bytes ending with b'\\n')."""
    buf = np.frombuffer(data, dtype=np.uint8)
    is_space = _ASCII_SPACE[buf]
    starts = np.flatnonzero(is_space[:-1] & ~is_space[1:]) + 1
    if not is_space[0]:
        starts = np.concatenate([[0], starts])
    newlines = np.flatnonzero(buf == 10)
    n_lines = len(newlines)
    tok_line = np.searchsorted(newlines, starts)  # a line's bytes come before its newline
    n_tokens = np.bincount(tok_line, minlength=n_lines).astype(np.int64)
    if len(starts) == 0:
        return np.zeros(0, np.int32), n_tokens, np.zeros(n_lines, np.int64)
    first = np.ones(len(starts), dtype=bool)
    first[1:] = tok_line[1:] != tok_line[:-1]
    if scheme == SUBWORD_NMT:
        ends = np.flatnonzero(~is_space[:-1] & is_space[1:])  # data ends with a newline: every token ends
        continues = (buf[ends] == 64) & (buf[np.maximum(ends - 1, 0)] == 64) & (ends >= 1)
        new_word = first.copy()
        new_word[1:] |= ~continues[:-1]
    else:
        padded = np.concatenate([buf, np.zeros(2, np.uint8)])
        m0, m1, m2 = _SP_MARK_BYTES
        new_word = first | ((padded[starts] == m0) & (padded[starts + 1] == m1) & (padded[starts + 2] == m2))
    running = np.cumsum(new_word, dtype=np.int64)
    first_idx = np.flatnonzero(first)
    line_offset = np.zeros(n_lines, dtype=np.int64)
    nonempty = n_tokens > 0
    line_offset[nonempty] = running[first_idx] - 1
    word_ids = running - np.repeat(line_offset, n_tokens)
    n_words = np.zeros(n_lines, dtype=np.int64)
    last_idx = np.cumsum(n_tokens)[nonempty] - 1
    n_words[nonempty] = word_ids[last_idx]
    return word_ids.astype(np.int32), n_tokens, n_words


def _scan_exact(lines, scheme):
    """Line-by-line scan with ``str.split()`` (for files with non-ASCII whitespace)."""
    ids, n_tokens, n_words = [], [], []
    for raw in lines:
        pieces = raw.decode("utf-8").split()
        w = word_ids_from_pieces(pieces, scheme)
        ids.extend(w)
        n_tokens.append(len(pieces))
        n_words.append(w[-1] if w else 0)
    return np.asarray(ids, np.int32), np.asarray(n_tokens, np.int64), np.asarray(n_words, np.int64)


def count_lines(path):
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK_BYTES)
            if not block:
                break
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def scan_bpe(path, scheme, start=0, stop=None):
    """BpeScan of lines ``[start, stop)`` (0-based) of ``path``, vectorised with numpy.

    Errors (bad UTF-8, an empty line) name the file and the line, as
    ``read_bpe_lines`` does.
    """
    ids, n_tokens, n_words = [], [], []
    line_base = 0  # 0-based number of the first line in the current block
    with open(path, "rb") as f:
        carry = b""
        while True:
            block = f.read(BLOCK_BYTES)
            eof = not block
            data = carry + block
            if eof:
                if not data:
                    break
                if not data.endswith(b"\n"):
                    data += b"\n"
                cut = len(data)
            else:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    carry = data
                    continue
            whole, carry = data[:cut], data[cut:]
            n_block = whole.count(b"\n")
            lo, hi = max(start - line_base, 0), n_block if stop is None else min(stop - line_base, n_block)
            if lo < hi:
                if lo > 0 or hi < n_block:
                    lines = whole.split(b"\n")[lo:hi]
                    whole = b"\n".join(lines) + b"\n"
                try:
                    whole.decode("utf-8")
                except UnicodeDecodeError as e:
                    line = line_base + lo + whole.count(b"\n", 0, e.start) + 1
                    raise SideDataError(path, line, f"not valid UTF-8 ({e.reason}); expected UTF-8 text, one "
                                        "sentence per line") from None
                if _has_unicode_space(np.frombuffer(whole, dtype=np.uint8)):
                    part = _scan_exact(whole.split(b"\n")[:-1], scheme)
                else:
                    part = _scan_block(whole, scheme)
                empty = np.flatnonzero(part[1] == 0)
                if len(empty):
                    raise SideDataError(path, line_base + lo + int(empty[0]) + 1, "empty line; expected at least "
                                        "one token (remove empty sentence pairs before preprocessing)")
                for acc, arr in zip((ids, n_tokens, n_words), part):
                    acc.append(arr)
            line_base += n_block
            if eof or (stop is not None and line_base >= stop):
                break
    if not n_tokens:
        return BpeScan(path, np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64), start + 1)
    return BpeScan(path, np.concatenate(ids), np.concatenate(n_tokens), np.concatenate(n_words), start + 1)


def iter_parser_words(path, scheme, start=0, stop=None):
    """Yield (line_number, parser words) for lines ``[start, stop)`` of a BPE file."""
    for number, pieces in read_bpe_lines(path):
        if number <= start:
            continue
        if stop is not None and number > stop:
            break
        yield number, parser_words(pieces, scheme)


__all__ = ["moses_unescape", "read_bpe_lines", "parser_words", "word_ids_from_pieces", "words_from_pieces",
           "scan_bpe", "count_lines", "iter_parser_words", "BpeScan"]
