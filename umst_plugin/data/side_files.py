"""The side-file contract in one place: what umst-preprocess writes beside a data-bin and what the task reads.

For every split's source prefix ``{split}.{src}-{tgt}.{src}``: ``.wordids`` (per sentence, the 1-based word of
each subword, without ``</s>``) and ``.heads`` (per sentence, the 1-based head of each word, 0 = root) as fairseq
mmap datasets, and ``.labels`` (dependency labels, text). Here: their names, where they live, loading them, the
alignment check against the source sentences, and the error every producer and consumer raises
(``SideDataError``: the file, the line, what was expected).
"""
import os

import numpy as np
from fairseq.data import indexed_dataset

WORD_IDS, HEADS, LABELS = "wordids", "heads", "labels"


class SideDataError(ValueError):
    """Input that cannot be turned into aligned side data.

    The message always names the file, the 1-based line (or sentence) number
    and what was expected, e.g. ``train.bpe.en:17: 12 words in the BPE text but
    11 tokens in train.en.conllu (sentence 17, starting at line 203)``.
    """

    def __init__(self, path, line, message):
        self.path, self.line = path, line
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")


def side_prefix(destdir, split, src, tgt):
    """Where umst-preprocess writes a split's side files: next to fairseq's ``{split}.{src}-{tgt}.{src}``."""
    return os.path.join(destdir, f"{split}.{src}-{tgt}.{src}")


def side_prefix_of(data_path, split, src, tgt, dataset_impl):
    """Prefix of the split's source dataset (either language direction), as fairseq resolves it."""
    for a, b in ((src, tgt), (tgt, src)):
        prefix = os.path.join(data_path, f"{split}.{a}-{b}.{src}")
        if indexed_dataset.dataset_exists(prefix, impl=dataset_impl):
            return prefix
    return None


def load_side(prefix, kind):
    path = f"{prefix}.{kind}"
    if not indexed_dataset.dataset_exists(path, impl="mmap"):
        raise SideDataError(path + ".bin", None, "side data not found; run umst-preprocess on this data-bin "
                            "(or train with --task translation if the model needs no side data)")
    return indexed_dataset.MMapIndexedDataset(path)


def last_items(dataset):
    """Last integer of every item of an mmap dataset, vectorised."""
    flat = np.frombuffer(dataset._bin_buffer, dtype=dataset._index.dtype)
    ends = np.cumsum(dataset.sizes) - 1
    return flat[ends] if len(flat) else np.zeros(0, dtype=np.int64)


def segment_positions(starts, counts):
    """Where the values of consecutive segments go: segment k's ``counts[k]`` values to ``starts[k]``,
    ``starts[k] + 1``, ... (one int64 array, the segments in order): a batch's rows gathered from, or scattered
    into, one flat array by one indexing."""
    offsets = np.cumsum(counts) - counts  # each segment's place among the values
    return np.repeat(starts - offsets, counts) + np.arange(int(counts.sum()))


class ItemArrays:
    """The items of a side file as numpy arrays: ``ItemArrays(dataset)[i]`` is item ``i``. For fairseq's
    ``MMapIndexedDataset`` a read-only view of the file's one flat array, at a slice's cost instead of its
    ``__getitem__``'s (an lru_cache, a new array, an int64 copy and a tensor): a data loader worker reads two side
    files for each of the ~800 sentences of a batch at the recipe's 38,400 tokens (docs/performance.md, the data
    loader's ceiling). Any other indexable (a ConcatDataset of shards, the parses of raw text) through its own
    ``__getitem__``. Picklable: the views are built again, lazily, in the process that reads them."""

    def __init__(self, dataset):
        self.dataset = dataset
        self._flat = None
        self._mmap = isinstance(dataset, indexed_dataset.MMapIndexedDataset)

    def _views(self):
        index = self.dataset._index
        self._flat = np.frombuffer(self.dataset._bin_buffer, dtype=index.dtype)
        self._starts = np.asarray(index._pointers, dtype=np.int64) // self._flat.itemsize
        self._ends = self._starts + np.asarray(index._sizes, dtype=np.int64)

    def __getitem__(self, i):
        if not self._mmap:
            return np.asarray(self.dataset[i])
        if self._flat is None:
            self._views()
        return self._flat[self._starts[i]:self._ends[i]]

    def prefixes(self, indices, limits):
        """The first ``limits[k]`` values of item ``indices[k]`` (the whole item where it is shorter) for every k,
        concatenated as one int64 array, and how many values each item gave (an int64 array): a batch's rows read
        by one gather instead of a slice each."""
        indices = np.asarray(indices, dtype=np.int64)
        limits = np.asarray(limits, dtype=np.int64)
        if not self._mmap:
            rows = [np.asarray(self.dataset[int(i)])[:int(n)] for i, n in zip(indices, limits)]
            counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            flat = np.concatenate(rows) if rows else np.zeros(0)
            return flat.astype(np.int64), counts
        if self._flat is None:
            self._views()
        starts = self._starts[indices]
        counts = np.minimum(self._ends[indices] - starts, limits)
        return self._flat[segment_positions(starts, counts)].astype(np.int64), counts

    def __len__(self):
        return len(self.dataset)

    def __getstate__(self):
        return dict(self.__dict__, _flat=None, _starts=None, _ends=None)


def check_side_alignment(prefix, src_sizes, word_ids, heads):
    """Word ids per sentence = source tokens - 1 (</s>); heads per sentence = words."""
    wid_path, head_path = f"{prefix}.{WORD_IDS}.bin", f"{prefix}.{HEADS}.bin"
    if len(word_ids) != len(src_sizes) or len(heads) != len(src_sizes):
        raise SideDataError(wid_path, None, f"{len(word_ids)} word-id and {len(heads)} head lines but "
                            f"{len(src_sizes)} source sentences in {prefix}.bin; re-run umst-preprocess")
    bad = np.nonzero(word_ids.sizes != src_sizes - 1)[0]
    if len(bad):
        i = int(bad[0])
        raise SideDataError(wid_path, i + 1, f"{word_ids.sizes[i]} word ids but {src_sizes[i] - 1} source tokens "
                            f"(without </s>) in {prefix}.bin; expected equal counts: re-run umst-preprocess")
    n_words = last_items(word_ids)
    bad = np.nonzero(heads.sizes != n_words)[0]
    if len(bad):
        i = int(bad[0])
        raise SideDataError(head_path, i + 1, f"{heads.sizes[i]} heads but {n_words[i]} words in the word ids; "
                            "expected one head per word: re-run umst-preprocess")
