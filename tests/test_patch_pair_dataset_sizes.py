"""fairseq's ``LanguagePairDataset`` keeps ``np.array(src_sizes)``; with the lengths as a tensor (fairseq's own hub
interface, ``GeneratorHubInterface._build_batches``; the plugin's test datasets) numpy 2 warned
``__array__ implementation doesn't accept a copy keyword, so passing copy=False failed`` for every dataset
(umst_plugin/patches/pair_dataset_sizes.py). Checked with DeprecationWarning turned into an error."""
import warnings

import numpy as np
import pytest
import torch

import umst_plugin  # noqa: F401  (installs the patch)
from fairseq.data import LanguagePairDataset
from umst_dev import dev
from umst_plugin.patches import pair_dataset_sizes


def build(init, lengths_as):
    d = dev.make_dictionary()
    src = [torch.tensor([7, 8, d.eos()]), torch.tensor([9, d.eos()])]
    tgt = [torch.tensor([8, d.eos()]), torch.tensor([7, 9, 7, d.eos()])]
    dataset = LanguagePairDataset.__new__(LanguagePairDataset)
    init(dataset, src, lengths_as([3, 2]), d, tgt, lengths_as([2, 4]), d)
    return dataset


def test_tensor_sizes_give_no_deprecation_warning_and_the_same_sizes():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        dataset = build(LanguagePairDataset.__init__, torch.tensor)
        batch = dataset.collater([dataset[0], dataset[1]])
    listed = build(LanguagePairDataset.__init__, list)
    for got, want in ((dataset.src_sizes, listed.src_sizes), (dataset.tgt_sizes, listed.tgt_sizes),
                      (dataset.sizes, listed.sizes)):
        assert isinstance(got, np.ndarray) and got.dtype == np.int64 and np.array_equal(got, want)
    assert batch["net_input"]["src_lengths"].tolist() == [3, 2]


def test_buckets_pad_each_side_and_shape_batches_by_the_longer_padded_side():
    """With ``num_buckets`` the dataset is bucketed as fairseq's ``__init__`` (lines 265-298) does: each side padded
    to its own buckets, and the batch shapes and the order by the longer padded side of each pair; without (the
    default, 0) nothing is bucketed."""
    from fairseq.data import BucketPadLengthDataset

    plain = build(LanguagePairDataset.__init__, list)
    assert plain.buckets is None and plain.get_batch_shapes() is None
    assert not isinstance(plain.src, BucketPadLengthDataset) and not isinstance(plain.tgt, BucketPadLengthDataset)

    bucketed = build(lambda self, *args: LanguagePairDataset.__init__(self, *args, num_buckets=1), torch.tensor)
    assert bucketed.src_sizes.tolist() == [3, 3] and bucketed.tgt_sizes.tolist() == [4, 4]  # one bucket a side
    assert bucketed.bucketed_num_tokens.tolist() == [4, 4]  # the target, longer after padding, for both
    assert bucketed.get_batch_shapes() == [(None, 4)]
    assert bucketed[1]["source"].tolist() == [plain.src_dict.pad(), 9, plain.src_dict.eos()]  # left-padded source


def test_fairseq_alone_warns_here():
    """The warning the patch removes is real in this environment (numpy 2 with torch's __array__)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            np.array(torch.tensor([1, 2]))
        except DeprecationWarning:
            pass
        else:
            pytest.skip("this numpy / torch pair does not warn")
        with pytest.raises(DeprecationWarning, match="copy=False"):
            build(LanguagePairDataset.__init__.__wrapped__, torch.tensor)


def test_fairseqs_inference_dataset_from_a_hub_batch_gives_no_warning():
    """What ``GeneratorHubInterface._build_batches`` does (``translate``): lengths as a LongTensor, through the
    translation task's ``build_dataset_for_inference``, then one batch."""
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    d = dev.make_dictionary()
    task = TranslationTask(TranslationConfig(), d, d)
    tokens = [torch.tensor([7, d.eos()]), torch.tensor([8, 9, d.eos()])]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        dataset = task.build_dataset_for_inference(tokens, torch.LongTensor([t.numel() for t in tokens]))
        batch = dataset.collater([dataset[0], dataset[1]])
    assert batch["net_input"]["src_tokens"].shape == (2, 3)


def test_install_is_idempotent():
    before = LanguagePairDataset.__init__
    pair_dataset_sizes.install()
    assert LanguagePairDataset.__init__ is before
