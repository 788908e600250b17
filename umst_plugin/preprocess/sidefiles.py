"""Write word-id / head / label side files, text and binarized, aligned and checked.

Per split (``train``, ``valid``, ``valid1``, ``test`` ...) and source language:

* text, one line per sentence, in ``--text-dir`` (default: the destdir):
  ``{split}.{src}.wordids`` (1-based word index per BPE token),
  ``{split}.{src}.heads`` (1-based head per word, 0 = root) and
  ``{split}.{src}.labels`` (dependency relation per word);
* binarized as fairseq mmap indexed datasets of int32 in the destdir:
  ``{split}.{src}-{tgt}.{src}.wordids.{bin,idx}`` and ``...heads.{bin,idx}``.
  No number dictionary is involved, so a sentence may have any number of words.

Everything of a run is written to temporary names and moved into place only
after every split has been built and checked, so a failed run leaves a
previously written data-bin exactly as it was.
"""
import os

import numpy as np

from umst_plugin.data.word_boundaries import word_ids_from_pieces
from umst_plugin.preprocess.errors import SideDataError
from umst_plugin.preprocess.text import moses_unescape, parser_words, read_bpe_lines

WORD_IDS, HEADS, LABELS = "wordids", "heads", "labels"


class SplitSideData:
    """Flat int32 arrays plus per-sentence sizes (fast to binarize)."""

    def __init__(self):
        self.word_ids, self.word_id_sizes = [], []
        self.heads, self.head_sizes = [], []
        self.labels = []

    def add(self, word_ids, heads, labels):
        self.word_ids.extend(word_ids)
        self.word_id_sizes.append(len(word_ids))
        self.heads.extend(heads)
        self.head_sizes.append(len(heads))
        self.labels.append(labels)

    def __len__(self):
        return len(self.word_id_sizes)


def collect_split(bpe_path, parses, scheme, parse_source, check_forms=True):
    """Align BPE lines with parses. ``parses`` yields a SurfaceParse per line,
    or is a callable ``f(list of word lists) -> parses`` for parser backends."""
    data = SplitSideData()
    parse_iter = iter(parses)
    for line_no, pieces in read_bpe_lines(bpe_path):
        word_ids = word_ids_from_pieces(pieces, scheme)
        n_words = word_ids[-1]
        parse = next(parse_iter, None)
        if parse is None:
            raise SideDataError(bpe_path, line_no, f"{parse_source} ended before this line; expected one "
                                "parse per BPE line")
        if len(parse.heads) != n_words:
            raise SideDataError(bpe_path, line_no, f"{n_words} words in the BPE text but {len(parse.heads)} "
                                f"tokens in {parse_source} (sentence {line_no}); expected equal counts")
        if check_forms:
            words = parser_words(pieces, scheme)
            for k, (w, f) in enumerate(zip(words, parse.forms)):
                if w != moses_unescape(f):
                    raise SideDataError(bpe_path, line_no, f"word {k + 1} is {w!r} in the BPE text but {f!r} in "
                                        f"{parse_source} (sentence {line_no}); expected the same words")
        data.add(word_ids, parse.heads, parse.labels)
    extra = next(parse_iter, None)
    if extra is not None:
        raise SideDataError(bpe_path, len(data) + 1, f"{parse_source} has more sentences than the "
                            f"{len(data)} lines of the BPE text")
    return data


def binarized_sizes(prefix):
    """Token counts per sentence of an existing fairseq mmap dataset, or None."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    if not (os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin")):
        return None
    index = MMapIndexedDataset.Index(prefix + ".idx")
    return np.array(index.sizes)  # copy: the view dies with the index's mmap


def check_against_binarized(data, src_prefix, bpe_path):
    """Subwords per line must equal the binarized source's tokens minus </s>."""
    sizes = binarized_sizes(src_prefix)
    if sizes is None:
        return False
    if len(sizes) != len(data):
        raise SideDataError(bpe_path, None, f"{len(data)} lines, but the binarized source {src_prefix}.bin "
                            f"has {len(sizes)} sentences; expected the same number (was it built from this file?)")
    expected = np.asarray(data.word_id_sizes) + 1
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


def write_binarized(writer, prefix, flat, sizes):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    with open(writer.path(prefix + ".bin"), "wb") as f:
        f.write(np.asarray(flat, dtype=np.int32).tobytes(order="C"))
    with MMapIndexedDataset.Index.writer(writer.path(prefix + ".idx"), np.int32) as index:
        index.write(list(sizes))


def _write_lines(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(" ".join(map(str, row)) + "\n")


def write_split(writer, data, text_prefix, bin_prefix):
    """Stage the text and binarized files of one split in ``writer``."""
    ids = np.split(np.asarray(data.word_ids, dtype=np.int64), np.cumsum(data.word_id_sizes)[:-1])
    heads = np.split(np.asarray(data.heads, dtype=np.int64), np.cumsum(data.head_sizes)[:-1])
    _write_lines(writer.path(f"{text_prefix}.{WORD_IDS}"), (r.tolist() for r in ids))
    _write_lines(writer.path(f"{text_prefix}.{HEADS}"), (r.tolist() for r in heads))
    _write_lines(writer.path(f"{text_prefix}.{LABELS}"), data.labels)
    if bin_prefix is not None:
        write_binarized(writer, f"{bin_prefix}.{WORD_IDS}", data.word_ids, data.word_id_sizes)
        write_binarized(writer, f"{bin_prefix}.{HEADS}", data.heads, data.head_sizes)


def side_prefix(destdir, split, src, tgt):
    """Prefix of the binarized side files, next to fairseq's ``{split}.{src}-{tgt}.{src}``."""
    return os.path.join(destdir, f"{split}.{src}-{tgt}.{src}")
