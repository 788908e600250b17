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
import torch
from fairseq.data import BaseWrapperDataset, data_utils

from umst_plugin.data.side_inputs import check_side_inputs
from umst_plugin.data.word_boundaries import word_ids_from_tokens


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
            return self.word_ids[index][:n_tok].long()
        scheme, continues, begins = self.boundaries
        return word_ids_from_tokens(source[None, :n_tok], self.pad, self.eos, continues, begins, scheme)[0]

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
        item = self.dataset[index]
        source = item["source"]
        padding = self._bucket_padding(source)
        if padding:
            source = source[padding:] if self.dataset.left_pad_source else source[:len(source) - padding]
        has_eos = bool(len(source)) and int(source[-1]) == self.eos
        n_tok = len(source) - int(has_eos)
        word_ids = self._word_ids(index, source, n_tok)
        n_words = int(word_ids[-1]) if n_tok else 0
        if self.heads is None:
            heads = torch.zeros(n_words, dtype=torch.long)
        else:
            heads = self.heads[index][:n_words].long()
            heads = heads.masked_fill(heads > n_words, 0)  # head cut off by truncation
        if has_eos:
            word_ids = torch.cat([word_ids, word_ids.new_tensor([n_words + 1])])
            heads = torch.cat([heads, heads.new_zeros(1)])
        if padding:  # laid out like the padded source
            pad = word_ids.new_zeros(padding)
            word_ids = torch.cat([pad, word_ids] if self.dataset.left_pad_source else [word_ids, pad])
        item["src_word_ids"] = word_ids
        item["src_word_heads"] = heads
        return item

    def collater(self, samples, pad_to_length=None):
        batch = self.dataset.collater(samples, pad_to_length=pad_to_length)
        if not batch:
            return batch
        # LanguagePairDataset re-sorts by source length; follow its order via the ids.
        by_id = {s["id"]: s for s in samples}
        ordered = [by_id[int(i)] for i in batch["id"]]
        src_tokens = batch["net_input"]["src_tokens"]
        batch["net_input"]["src_word_ids"] = data_utils.collate_tokens(
            [s["src_word_ids"] for s in ordered], pad_idx=0, left_pad=self.dataset.left_pad_source,
            pad_to_length=src_tokens.size(1))
        batch["net_input"]["src_word_heads"] = data_utils.collate_tokens(
            [s["src_word_heads"] for s in ordered], pad_idx=-1, left_pad=False)
        # the contract, checked while the batch is on the host (free); the model does not re-check
        check_side_inputs(src_tokens, batch["net_input"]["src_word_ids"], batch["net_input"]["src_word_heads"],
                          self.pad, ids=batch["id"])
        if self.batch_hints is not None:
            batch["net_input"].update(self.batch_hints(src_tokens))
        return batch
