"""Patch: fairseq pads a batch's rows in a few tensor operations instead of two or three per row.

``data_utils.collate_tokens`` (fairseq/data/data_utils.py, lines 38-72 of fairseq-fixed 0.12.3.1) fills the padded
tensor with one ``copy_`` per row, or a slice assignment and an item write per row where the end-of-sentence moves
to the front. ``LanguagePairDataset.collate`` calls it three times a batch (source, previous output tokens, target),
in the data loader's worker. At the recipe's 38,400 tokens per card (about 800 sentences of WMT14's lengths) those
calls were 6-8 ms each, most of a worker's time per batch: one worker then gives fewer batches per second than a
compiled step on an H200 takes (docs/performance.md, "The data loader's ceiling"). The replacement,
:func:`umst_plugin.data.collate.collate_tokens`, builds the same tensor from one concatenation and one indexed
write (0.7 ms at 800 rows); rows it does not take (not 1-d, mixed dtypes or devices, an empty row whose
end-of-sentence should move) go to fairseq's own, which keeps its behaviour and its errors.
"""
from umst_plugin.data import collate
from umst_plugin.patches import wrap

TARGET = "fairseq.data.data_utils.collate_tokens"
SYMPTOM = ("a data loader worker spends most of a batch in collate_tokens' per-row copies (three calls of 6-8 ms "
           "a batch of ~800 sentences): fewer batches per second than a GPU's compiled steps")
REMOVE_WHEN = "fairseq's collate_tokens pads its rows without a copy per row"

SIGNATURE = ("(values, pad_idx, eos_idx=None, left_pad=False, move_eos_to_beginning=False, pad_to_length=None, "
             "pad_to_multiple=1, pad_to_bsz=None)")


def _make(original):
    def collate_tokens(values, pad_idx, eos_idx=None, left_pad=False, move_eos_to_beginning=False,
                       pad_to_length=None, pad_to_multiple=1, pad_to_bsz=None):
        return collate.collate_tokens(values, pad_idx, eos_idx, left_pad, move_eos_to_beginning, pad_to_length,
                                      pad_to_multiple, pad_to_bsz, fallback=original)

    return collate_tokens


def install():
    from fairseq.data import data_utils

    wrap(data_utils, "collate_tokens", _make, "collate_tokens", signature=SIGNATURE)
