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

from umst_plugin.data.side_files import ItemArrays
from umst_plugin.data.side_inputs import check_side_inputs
from umst_plugin.data.word_boundaries import word_ids_from_tokens


def collate_rows(rows, pad, left_pad, min_length=0):
    """fairseq's ``data_utils.collate_tokens(rows, pad, left_pad=left_pad, pad_to_length=min_length)`` (B x T,
    T = the longest row or ``min_length``, each row at the right or left end), in one numpy scatter instead of a
    tensor copy per row: a fifth of its time at 800 rows (tests/test_side_data.py compares the two)."""
    rows = [np.asarray(r) for r in rows]
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = max(int(lengths.max(initial=0)), min_length)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    total = int(lengths.sum())
    if total:
        row_of = np.repeat(np.arange(len(rows)), lengths)
        first = np.cumsum(lengths) - lengths  # each row's offset in the concatenation
        column = np.arange(total) - np.repeat(first, lengths)
        if left_pad:
            column += np.repeat(width - lengths, lengths)
        out[row_of, column] = np.concatenate(rows)
    return torch.from_numpy(out)


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

    def collater(self, samples, pad_to_length=None):
        batch = self.dataset.collater(samples, pad_to_length=pad_to_length)
        if not batch:
            return batch
        # LanguagePairDataset re-sorts by source length; follow its order via the ids.
        by_id = {s["id"]: s for s in samples}
        ordered = [by_id[i] for i in batch["id"].tolist()]
        src_tokens = batch["net_input"]["src_tokens"]
        batch["net_input"]["src_word_ids"] = collate_rows(
            [s["src_word_ids"] for s in ordered], pad=0, left_pad=self.dataset.left_pad_source,
            min_length=src_tokens.size(1))
        batch["net_input"]["src_word_heads"] = collate_rows([s["src_word_heads"] for s in ordered], pad=-1,
                                                            left_pad=False)
        # the contract, checked while the batch is on the host (free); the model does not re-check
        check_side_inputs(src_tokens, batch["net_input"]["src_word_ids"], batch["net_input"]["src_word_heads"],
                          self.pad, ids=batch["id"])
        if self.batch_hints is not None:
            batch["net_input"].update(self.batch_hints(src_tokens))
        return batch
