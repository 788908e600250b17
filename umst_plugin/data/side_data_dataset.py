"""Side data (word ids, dependency heads) that follows fairseq's batches.

``SideDataLanguagePairDataset`` wraps a ``LanguagePairDataset`` and adds to
every batch's ``net_input``:

* ``src_word_ids`` (B x T, laid out exactly like ``src_tokens``, left or right
  padded): 0 at padding, else the 1-based word index; ``</s>`` is a word of
  its own (index n_words + 1);
* ``src_word_heads`` (B x W, W = longest n_words + 1): position w holds the
  head of word w + 1 (0 = root, the ``</s>`` word has head 0), right-padded
  with -1;
* the host-side batch hints the task's models asked for (``side_inputs.BatchHints``).

Every batch is checked against the contract (``side_inputs.check_side_inputs``) here, on the host.

Truncated sources (``--truncate-source``) truncate the side data the same way:
words past the cut disappear and heads pointing past it become 0.

Bucketed sources (fairseq's ``--num-batch-buckets``: every source padded to its bucket's length in the item itself,
on the side batches pad) keep that padding: the word ids are those of the sentence, padded with 0 where its
tokens are (``src_word_ids`` stays laid out like ``src_tokens``).
"""
import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

from umst_plugin.data.collate import collate_tokens
from umst_plugin.data.side_files import ItemArrays, segment_positions
from umst_plugin.data.side_inputs import check_side_inputs
from umst_plugin.data.word_boundaries import word_ids_from_tokens


def _rows_with_eos(values, counts, has_eos, eos_values):
    """Rows (``values`` cut into ``counts``), each followed by its ``eos_values`` entry where ``has_eos``: one
    int64 tensor per row, views of one array."""
    sizes = counts + has_eos
    out = np.empty(int(sizes.sum()), dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    out[segment_positions(offsets, counts)] = values
    ends = (offsets + counts)[has_eos > 0]
    out[ends] = np.broadcast_to(eos_values, counts.shape)[has_eos > 0]
    return torch.from_numpy(out).split(sizes.tolist())


def _last_of_rows(values, counts):
    """Each row's last value (``values`` cut into ``counts``), 0 for an empty row."""
    last = np.zeros(len(counts), dtype=np.int64)
    filled = counts > 0
    last[filled] = values[np.cumsum(counts)[filled] - 1]
    return last


class SideDataLanguagePairDataset(BaseWrapperDataset):
    """Args:
        dataset: the LanguagePairDataset to wrap.
        word_ids: indexable, item i = LongTensor of word ids of sentence i's
            subwords (without ``</s>``); or None to derive them from the
            tokens with ``boundaries`` = (scheme, continues, begins).
        heads: indexable, item i = LongTensor of n_words heads; or None for
            the fallback graph (every head 0).
    """

    def __init__(self, dataset, word_ids=None, heads=None, boundaries=None, batch_hints=None):
        super().__init__(dataset)
        self.batch_hints = batch_hints  # side_inputs.BatchHints of the task (or None)
        if word_ids is None and boundaries is None:
            raise ValueError("need stored word ids or a boundary table to derive them")
        self.word_ids = word_ids
        self.heads = heads
        # numpy views of the side files' items, read per sentence by __getitem__ (side_files.ItemArrays)
        self._word_id_rows = None if word_ids is None else ItemArrays(word_ids)
        self._head_rows = None if heads is None else ItemArrays(heads)
        self.boundaries = boundaries
        self.pad = dataset.src_dict.pad()
        self.eos = dataset.eos

    def __getattr__(self, name):
        # Delegate LanguagePairDataset attributes (src, tgt, left_pad_source, ...):
        # fairseq's CLIs read some of them off task.dataset(split).
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def _word_ids(self, index, source, n_tok):
        if self.word_ids is not None:
            return self._word_id_rows[index][:n_tok]
        scheme, continues, begins = self.boundaries
        return word_ids_from_tokens(source[None, :n_tok], self.pad, self.eos, continues, begins, scheme)[0].numpy()

    def _bucket_padding(self, source):
        """How many pad tokens fairseq's bucketing (``--num-batch-buckets``) put into this source item, on the side
        the batches pad (0 without bucketing: an item holds no padding then)."""
        if not self.dataset.buckets:
            return 0
        is_pad = source.eq(self.pad)
        if not self.dataset.left_pad_source:
            is_pad = is_pad.flip(0)  # the padded end first
        return int(is_pad.cumprod(0).sum())  # the pad tokens at the padded end, up to the first real one

    def __getitem__(self, index):
        # numpy, not torch, per item: a data loader worker builds ~800 of these per batch at the recipe's 38,400
        # tokens, and torch's per-call overhead (the same steps as tensor ops) made the plugin's loader half as
        # fast as stock fairseq's, near a compiled step's time on an H200 (docs/performance.md, the data loader's
        # ceiling)
        item = self.dataset[index]
        source = item["source"]
        padding = self._bucket_padding(source)
        if padding:
            source = source[padding:] if self.dataset.left_pad_source else source[:len(source) - padding]
        tokens = source.numpy()
        has_eos = bool(len(tokens)) and int(tokens[-1]) == self.eos
        n_tok = len(tokens) - int(has_eos)
        word_ids = self._word_ids(index, source, n_tok)
        n_words = int(word_ids[-1]) if n_tok else 0
        if self.heads is None:
            heads = np.zeros(n_words, dtype=np.int64)
        else:
            heads = self._head_rows[index][:n_words]
            heads = np.where(heads > n_words, 0, heads)  # head cut off by truncation (int64 below)
        # fresh int64 arrays (word ids read from the data-bin are a view of its read-only memory map)
        out_ids = np.zeros(padding + len(word_ids) + int(has_eos), dtype=np.int64)
        start = padding if self.dataset.left_pad_source else 0  # laid out like the (bucket-padded) source
        out_ids[start:start + len(word_ids)] = word_ids
        out_heads = np.zeros(len(heads) + int(has_eos), dtype=np.int64)  # the </s> word's head: 0
        out_heads[:len(heads)] = heads
        if has_eos:
            out_ids[start + len(word_ids)] = n_words + 1
        item["src_word_ids"] = torch.from_numpy(out_ids)
        item["src_word_heads"] = torch.from_numpy(out_heads)
        return item

    def __getitems__(self, indices):
        """``[self[i] for i in indices]``: a batch's items, as torch's DataLoader asks for them (its fetcher calls
        ``__getitems__`` where a dataset has one). With stored side files and no bucketing the side data of the
        whole batch is computed at once, in numpy, and each item's two tensors are views of two arrays shared by
        the batch: per item, only fairseq's own item is built. Built one by one, the side data cost about 20 µs a
        sentence more than stock fairseq's item, 16 ms of a batch of ~800 (docs/performance.md, the data loader's
        ceiling)."""
        if self.word_ids is None or self.dataset.buckets:  # derived word ids (raw text), bucket padding: per item
            return [self[i] for i in indices]
        items = [self.dataset[int(i)] for i in indices]
        if not items:
            return items
        sources = [item["source"] for item in items]
        lengths = np.fromiter(map(len, sources), dtype=np.int64, count=len(sources))
        last_tokens = _last_of_rows(torch.cat(sources).numpy(), lengths)
        has_eos = ((lengths > 0) & (last_tokens == self.eos)).astype(np.int64)
        n_tok = lengths - has_eos
        word_ids, id_counts = self._word_id_rows.prefixes(indices, n_tok)
        n_words = _last_of_rows(word_ids, id_counts)  # word ids count from 1: the last one is the number of words
        if self.heads is None:
            heads, head_counts = np.zeros(int(n_words.sum()), dtype=np.int64), n_words
        else:
            heads, head_counts = self._head_rows.prefixes(indices, n_words)
            heads = np.where(heads > np.repeat(n_words, head_counts), 0, heads)  # cut off by truncation
        id_rows = _rows_with_eos(word_ids, id_counts, has_eos, n_words + 1)  # the </s> word: n_words + 1
        head_rows = _rows_with_eos(heads, head_counts, has_eos, 0)  # its head: 0
        for item, id_row, head_row in zip(items, id_rows, head_rows):
            item["src_word_ids"], item["src_word_heads"] = id_row, head_row
        return items

    def collater(self, samples, pad_to_length=None):
        batch = self.dataset.collater(samples, pad_to_length=pad_to_length)
        if not batch:
            return batch
        # LanguagePairDataset re-sorts by source length; follow its order via the ids.
        by_id = {s["id"]: s for s in samples}
        ordered = [by_id[i] for i in batch["id"].tolist()]
        src_tokens = batch["net_input"]["src_tokens"]
        batch["net_input"]["src_word_ids"] = collate_tokens(
            [s["src_word_ids"] for s in ordered], 0, left_pad=self.dataset.left_pad_source,
            pad_to_length=src_tokens.size(1))
        batch["net_input"]["src_word_heads"] = collate_tokens([s["src_word_heads"] for s in ordered], -1)
        # the contract, checked while the batch is on the host (free); the model does not re-check
        check_side_inputs(src_tokens, batch["net_input"]["src_word_ids"], batch["net_input"]["src_word_heads"],
                          self.pad, ids=batch["id"])
        if self.batch_hints is not None:
            batch["net_input"].update(self.batch_hints(src_tokens))
        return batch
