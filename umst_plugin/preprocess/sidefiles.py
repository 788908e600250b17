"""Write word-id / head / label side files, text and binarized, aligned and checked.

Per split (``train``, ``valid``, ``valid1``, ``test`` ...) and source language:

* text, one line per sentence, in ``--text-dir`` (default: the destdir):
  ``{split}.{src}.wordids`` (1-based word index per BPE token),
  ``{split}.{src}.heads`` (1-based head per word, 0 = root) and
  ``{split}.{src}.labels`` (dependency relation per word, ``_`` when unknown);
* binarized as fairseq mmap indexed datasets of int32 in the destdir:
  ``{split}.{src}-{tgt}.{src}.wordids.{bin,idx}`` and ``...heads.{bin,idx}``.
  No number dictionary is involved, so a sentence may have any number of words.

Everything of a run is written to temporary names and moved into place only
after every split has been built and checked, so a failed run leaves a
previously written data-bin exactly as it was.

The writer is vectorised: word ids come from ``text.scan_bpe`` (numpy over the
whole file), parses are flat int32 arrays, the mmap files are written in bulk.
"""
import collections
import os
import struct

import numpy as np

from umst_plugin.preprocess.errors import SideDataError
from umst_plugin.preprocess.text import moses_unescape, parser_words, read_bpe_lines

from umst_plugin.data.side_files import HEADS, LABELS, WORD_IDS, side_prefix  # noqa: F401  (the contract)


class ParseArrays:
    """Parses of consecutive lines as flat arrays.

    ``heads``: int32, the heads of all sentences concatenated; ``sizes``: int64 words
    per sentence; ``labels``: one space-joined label string per sentence;
    ``fallbacks``: Counter of fallback reasons; ``source``: what made them (for errors).
    """

    def __init__(self, heads, sizes, labels, fallbacks=None, source=""):
        self.heads = np.asarray(heads, dtype=np.int32)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.labels = labels
        self.fallbacks = fallbacks if fallbacks is not None else collections.Counter()
        self.source = source

    def __len__(self):
        return len(self.sizes)

    @classmethod
    def from_parses(cls, parses, source=""):
        heads, sizes, labels, fallbacks = [], [], [], collections.Counter()
        for p in parses:
            heads.extend(p.heads)
            sizes.append(len(p.heads))
            labels.append(" ".join(p.labels))
            if p.fallback:
                fallbacks[fallback_kind(p.fallback)] += 1
        return cls(heads, sizes, labels, fallbacks, source)

    @classmethod
    def fallback(cls, n_words, source="fallback graph"):
        """Every sentence without edges (``--parser none``), vectorised."""
        n_words = np.asarray(n_words, dtype=np.int64)
        labels = [" ".join(["_"] * int(n)) for n in n_words]
        return cls(np.zeros(int(n_words.sum()), np.int32), n_words, labels, None, source)

    @classmethod
    def concatenate(cls, parts, source=""):
        fallbacks = collections.Counter()
        for p in parts:
            fallbacks.update(p.fallbacks)
        if not parts:
            return cls(np.zeros(0, np.int32), np.zeros(0, np.int64), [], fallbacks, source)
        return cls(np.concatenate([p.heads for p in parts]), np.concatenate([p.sizes for p in parts]),
                   [label for p in parts for label in p.labels], fallbacks, source)


def fallback_kind(reason):
    """'misaligned (3 heads and 3 labels for 4 words)' -> 'misaligned': what the end-of-run summary counts."""
    return reason.split(" (")[0]


def check_parses(scan, parses, parse_path=None):
    """Heads per line must equal the words of the BPE line, each head in [0, n_words]."""
    where = parse_path or parses.source
    if len(parses) != len(scan):
        line = scan.first_line + min(len(parses), len(scan))
        raise SideDataError(scan.path, line, f"{len(scan)} lines in the BPE text but {len(parses)} parses in "
                            f"{where}; expected one parse per BPE line")
    bad = np.flatnonzero(parses.sizes != scan.n_words)
    if len(bad):
        i = int(bad[0])
        raise SideDataError(scan.path, scan.first_line + i, f"{scan.n_words[i]} words in the BPE text but "
                            f"{parses.sizes[i]} tokens in {where} (sentence {i + 1}); expected equal counts")
    limit = np.repeat(scan.n_words.astype(np.int32), scan.n_words)
    bad = np.flatnonzero((parses.heads < 0) | (parses.heads > limit))
    if len(bad):
        line = int(np.searchsorted(np.cumsum(scan.n_words), bad[0], side="right"))
        raise SideDataError(where, line + 1, f"head {parses.heads[bad[0]]} out of range; expected 0 (root) to "
                            f"{scan.n_words[line]} (the words of BPE line {scan.first_line + line} of {scan.path})")


def parses_from_conllu(bpe_path, conllu_parses, parse_source, scheme, check_forms=True, start=0, stop=None):
    """ParseArrays of lines ``[start, stop)`` from CoNLL-U sentences, checked word by word."""
    parses, parse_iter = [], iter(conllu_parses)
    count = 0
    for line_no, pieces in read_bpe_lines(bpe_path):
        parse = next(parse_iter, None)
        if parse is None:
            raise SideDataError(bpe_path, line_no, f"{parse_source} ended before this line; expected one "
                                "parse per BPE line")
        count += 1
        if line_no <= start or (stop is not None and line_no > stop):
            continue
        words = parser_words(pieces, scheme)
        if len(parse.heads) != len(words):
            raise SideDataError(bpe_path, line_no, f"{len(words)} words in the BPE text but {len(parse.heads)} "
                                f"tokens in {parse_source} (sentence {line_no}); expected equal counts")
        if check_forms:
            for k, (w, f) in enumerate(zip(words, parse.forms)):
                if w != moses_unescape(f):
                    raise SideDataError(bpe_path, line_no, f"word {k + 1} is {w!r} in the BPE text but {f!r} in "
                                        f"{parse_source} (sentence {line_no}); expected the same words")
        parses.append(parse)
    if next(parse_iter, None) is not None:
        raise SideDataError(bpe_path, count + 1, f"{parse_source} has more sentences than the "
                            f"{count} lines of the BPE text")
    return ParseArrays.from_parses(parses, parse_source)


def binarized_sizes(prefix):
    """Token counts per sentence of an existing fairseq mmap dataset, or None."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    if not (os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin")):
        return None
    index = MMapIndexedDataset.Index(prefix + ".idx")
    return np.array(index.sizes)  # copy: the view dies with the index's mmap


def check_against_binarized(scan, src_prefix, bpe_path):
    """Subwords per line must equal the binarized source's tokens minus </s>."""
    sizes = binarized_sizes(src_prefix)
    if sizes is None:
        return False
    if len(sizes) != len(scan):
        raise SideDataError(bpe_path, None, f"{len(scan)} lines, but the binarized source {src_prefix}.bin "
                            f"has {len(sizes)} sentences; expected the same number (was it built from this file?)")
    expected = scan.n_tokens + 1
    bad = np.nonzero(sizes != expected)[0]
    if len(bad):
        i = int(bad[0])
        raise SideDataError(bpe_path, i + 1, f"{expected[i] - 1} tokens in the BPE text but {sizes[i] - 1} "
                            f"in the binarized source {src_prefix}.bin (without </s>); expected equal counts")
    return True


class AtomicWriter:
    """Collect temp files and move them into place together (or remove them)."""

    def __init__(self):
        self.pending = []

    def path(self, final):
        tmp = f"{final}.tmp-{os.getpid()}"
        self.pending.append((tmp, final))
        return tmp

    def commit(self):
        for tmp, final in self.pending:
            os.replace(tmp, final)
        self.pending = []

    def abort(self):
        for tmp, _ in self.pending:
            if os.path.exists(tmp):
                os.remove(tmp)
        self.pending = []


_MMAP_MAGIC = b"MMIDIDX\x00\x00"


def write_mmap_index(path, sizes, dtype=np.int32):
    """fairseq's MMapIndexedDataset index (byte-identical to ``Index.writer``), vectorised."""
    from fairseq.data.indexed_dataset import _dtype_header_code

    sizes = np.asarray(sizes, dtype=np.int64)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1] * np.dtype(dtype).itemsize, out=pointers[1:])
    with open(path, "wb") as f:
        f.write(_MMAP_MAGIC + struct.pack("<Q", 1) + struct.pack("<B", _dtype_header_code(dtype)))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(sizes.astype(np.int32).tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))


def write_binarized(writer, prefix, flat, sizes):
    with open(writer.path(prefix + ".bin"), "wb") as f:
        f.write(np.ascontiguousarray(flat, dtype=np.int32).tobytes(order="C"))
    write_mmap_index(writer.path(prefix + ".idx"), sizes)


def _int_lines_bytes(flat, sizes):
    """ASCII bytes of rows of non-negative ints ('1 1 2\\n3 4\\n'), every row non-empty."""
    value = flat.astype(np.int32 if flat.max() < 2 ** 31 else np.int64)
    n_digits = np.ones(len(value), dtype=np.int64)
    power = 10
    while power <= value.max():
        n_digits += value >= power
        power *= 10
    ends = np.cumsum(n_digits + 1)  # each number is followed by one separator byte
    out = np.full(int(ends[-1]), ord(" "), dtype=np.uint8)
    out[ends[np.cumsum(sizes) - 1] - 1] = ord("\n")
    pos = ends - 2  # where each number's last digit goes
    while len(value):
        out[pos] = value % 10 + ord("0")
        value //= 10
        more = np.flatnonzero(value)  # numbers with digits left (a shrinking set)
        value, pos = value[more], pos[more] - 1
    return out.tobytes()


def iter_int_lines(flat, sizes, rows_per_block=1 << 16):
    """Rows of non-negative ints as ASCII text, in blocks of rows (bounded memory on WMT-size splits).

    Digits are written straight into a byte buffer (a few vectorised passes, one per digit
    position) instead of formatting each number in Python: the text side files would
    otherwise dominate the writer's time.
    """
    flat = np.asarray(flat)
    sizes = np.asarray(sizes, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for a in range(0, len(sizes), rows_per_block):
        b = min(a + rows_per_block, len(sizes))
        block, block_sizes = flat[bounds[a]:bounds[b]].astype(np.int64), sizes[a:b]
        if len(block) == 0 or (block_sizes == 0).any() or block.min() < 0:  # never in side files
            yield "".join(" ".join(map(str, flat[e - n:e].tolist())) + "\n"
                          for n, e in zip(block_sizes, bounds[a + 1:b + 1])).encode("ascii")
        else:
            yield _int_lines_bytes(block, block_sizes)


def int_lines(flat, sizes):
    """All of ``iter_int_lines`` as one str."""
    return b"".join(iter_int_lines(flat, sizes)).decode("ascii")


def write_int_lines(path, flat, sizes):
    with open(path, "wb") as f:
        for chunk in iter_int_lines(flat, sizes):
            f.write(chunk)


def write_labels(path, labels, rows_per_block=1 << 16):
    with open(path, "w", encoding="utf-8") as f:
        for a in range(0, len(labels), rows_per_block):
            f.write("".join(label + "\n" for label in labels[a:a + rows_per_block]))


def write_split(writer, scan, parses, text_prefix, bin_prefix):
    """Stage the text and binarized files of one split in ``writer``."""
    write_int_lines(writer.path(f"{text_prefix}.{WORD_IDS}"), scan.word_ids, scan.n_tokens)
    write_parse_text(writer, text_prefix, parses)
    if bin_prefix is not None:
        write_binarized(writer, f"{bin_prefix}.{WORD_IDS}", scan.word_ids, scan.n_tokens)
        write_binarized(writer, f"{bin_prefix}.{HEADS}", parses.heads, parses.sizes)


def write_parse_text(writer, text_prefix, parses):
    write_int_lines(writer.path(f"{text_prefix}.{HEADS}"), parses.heads, parses.sizes)
    write_labels(writer.path(f"{text_prefix}.{LABELS}"), parses.labels)


def read_parse_text(heads_path, labels_path):
    """ParseArrays from ``.heads`` / ``.labels`` text files (shards); errors name file and line."""
    heads, sizes = [], []
    with open(heads_path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.split()
            try:
                heads.extend(int(x) for x in fields)
            except ValueError:
                raise SideDataError(heads_path, line_no, "expected space-separated integer heads") from None
            sizes.append(len(fields))
    with open(labels_path, encoding="utf-8") as f:
        labels = [line.rstrip("\n") for line in f]
    if len(labels) != len(sizes):
        raise SideDataError(labels_path, min(len(labels), len(sizes)) + 1, f"{len(labels)} lines but "
                            f"{len(sizes)} in {heads_path}; expected one label line per head line")
    for k, (label, n) in enumerate(zip(labels, sizes)):
        if len(label.split()) != n:
            raise SideDataError(labels_path, k + 1, f"{len(label.split())} labels but {n} heads in "
                                f"{heads_path}:{k + 1}; expected one label per head")
    return ParseArrays(heads, sizes, labels, source=heads_path)
