"""Patch: ``LanguagePairDataset`` takes tensor sizes without numpy's ``copy=False`` DeprecationWarning, and
buckets its lengths (``--num-batch-buckets``) under numpy 2.

``LanguagePairDataset.__init__`` (fairseq/data/language_pair_dataset.py, lines 240-241 of fairseq-fixed
0.12.3.1) keeps ``np.array(src_sizes)`` and ``np.array(tgt_sizes)``. fairseq's own hub interface
(``GeneratorHubInterface._build_batches``: ``translate``, ``generate``, ``sample``) passes the lengths as a
``torch.LongTensor``, and so do the plugin's test and benchmark datasets; numpy 2 then asks the tensor's
``__array__`` for ``copy=False``, which torch's does not take, and warns twice per dataset (340 of the 1,570
warnings of the GPU check's CUDA test run, all from ``tests/test_model_checks.py``). The patch hands fairseq a numpy array of the same values (``tensor.numpy()``; a CPU copy
for a tensor on another device): ``np.array`` copies it as before, so the dataset's sizes are unchanged.

``--num-batch-buckets N`` (fairseq's translation task: pad every sentence to one of N lengths, the source's and the
target's percentiles, and batch each bucket in one fixed shape, ``get_batch_shapes``) stopped every run that set it
under numpy 2: fairseq's ``data_utils.get_buckets`` passes ``np.percentile`` the ``interpolation=`` keyword that
numpy 2 removed (its ``method=``), and ``__init__`` (lines 265-298) asks for ``np.compat.long``, which numpy 2
removed too. The patch builds the dataset without buckets, then buckets it as those lines do, with ``method=`` and
``np.int64`` (:func:`bucket_lengths`; the same buckets numpy 1 gave). Bounded shapes are what a GPU program
recorded once per shape needs (CUDA graphs, docs/compile.md).
"""
import inspect
import logging

import numpy as np
import torch

from umst_plugin.patches import wrap

logger = logging.getLogger("fairseq.data.language_pair_dataset")  # where fairseq logs its buckets

TARGET = "fairseq.data.language_pair_dataset.LanguagePairDataset.__init__"
SYMPTOM = ("a DeprecationWarning (numpy: '__array__ implementation doesn't accept a copy keyword, so passing "
           "copy=False failed') for every dataset built with tensor sizes: every from_pretrained(...).translate; "
           "with --num-batch-buckets, a TypeError (np.percentile's 'interpolation') at the first dataset under "
           "numpy 2")
REMOVE_WHEN = ("fairseq builds its size arrays with np.asarray / tensor.numpy(), or torch's __array__ takes copy; "
               "and fairseq's bucketing uses np.percentile(method=) and np.int64")


def sizes_as_numpy(sizes):
    """``sizes`` as a numpy array where it is a tensor (same values and dtype), else unchanged."""
    if torch.is_tensor(sizes):
        return sizes.detach().cpu().numpy()
    return sizes


def percentile_buckets(sizes, num_buckets):
    """fairseq's ``data_utils.get_buckets`` under numpy 2: the lengths at the 100/N, 200/N, ... 100 percentiles,
    each a length that occurs ("lower"), without repeats."""
    return np.unique(np.percentile(sizes, np.linspace(0, 100, num_buckets + 1), method="lower")[1:])


def bucket_padded(dataset, sizes, num_buckets, pad, left_pad):
    """fairseq's ``BucketPadLengthDataset(dataset, sizes, num_buckets, pad, left_pad)``, its buckets from
    :func:`percentile_buckets`: every item padded to its bucket's length on the side its batches pad."""
    from fairseq.data import BaseWrapperDataset, BucketPadLengthDataset
    from fairseq.data.data_utils import get_bucketed_sizes

    padded = BucketPadLengthDataset.__new__(BucketPadLengthDataset)
    BaseWrapperDataset.__init__(padded, dataset)
    padded.pad_idx, padded.left_pad, padded._tensor_key = pad, left_pad, None
    padded.buckets = percentile_buckets(sizes, num_buckets)
    padded._bucketed_sizes = get_bucketed_sizes(sizes, padded.buckets)
    return padded


def bucket_lengths(dataset, num_buckets):
    """What ``LanguagePairDataset.__init__`` does with ``num_buckets > 0`` (fairseq-fixed 0.12.3.1, lines 265-298),
    on a dataset built without: its source and target wrapped in :func:`bucket_padded`, their sizes the bucketed
    ones, and one batch shape per distinct padded length (``get_batch_shapes``)."""
    dataset.src = bucket_padded(dataset.src, dataset.src_sizes, num_buckets, dataset.src_dict.pad(),
                                dataset.left_pad_source)
    dataset.src_sizes = dataset.src.sizes
    logger.info("bucketing source lengths: %s", dataset.src.buckets.tolist())
    if dataset.tgt is not None:
        dataset.tgt = bucket_padded(dataset.tgt, dataset.tgt_sizes, num_buckets, dataset.tgt_dict.pad(),
                                    dataset.left_pad_target)
        dataset.tgt_sizes = dataset.tgt.sizes
        logger.info("bucketing target lengths: %s", dataset.tgt.buckets.tolist())
    # num_tokens(i) of every sentence, as fairseq's np.vectorize of it computes them: the longer padded side
    tokens = dataset.src_sizes if dataset.tgt_sizes is None else np.maximum(dataset.src_sizes, dataset.tgt_sizes)
    dataset.bucketed_num_tokens = tokens.astype(np.int64)
    dataset.buckets = [(None, num_tokens) for num_tokens in np.unique(dataset.bucketed_num_tokens)]


def install():
    from fairseq.data.language_pair_dataset import LanguagePairDataset

    def make(original):
        def __init__(self, src, src_sizes, src_dict, tgt=None, tgt_sizes=None, *args, **kwargs):
            bound = inspect.signature(original).bind(self, src, src_sizes, src_dict, tgt, tgt_sizes, *args, **kwargs)
            num_buckets = bound.arguments.get("num_buckets", 0)
            bound.arguments.update(src_sizes=sizes_as_numpy(src_sizes), tgt_sizes=sizes_as_numpy(tgt_sizes),
                                   num_buckets=0)
            original(*bound.args, **bound.kwargs)
            if num_buckets > 0:
                bucket_lengths(self, num_buckets)
        return __init__

    wrap(LanguagePairDataset, "__init__", make, __name__,
         "(self, src, src_sizes, src_dict, tgt=None, tgt_sizes=None, tgt_dict=None, left_pad_source=True, "
         "left_pad_target=False, shuffle=True, input_feeding=True, remove_eos_from_source=False, "
         "append_eos_to_target=False, align_dataset=None, constraints=None, append_bos=False, eos=None, "
         "num_buckets=0, src_lang_id=None, tgt_lang_id=None, pad_to_multiple=1)")
