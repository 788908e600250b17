"""fairseq's collate_tokens in a few tensor operations (umst_plugin/data/collate.py, put in fairseq's place by
umst_plugin/patches/collate_tokens.py): the same tensor as fairseq's row-by-row copies for every argument, fairseq's
own for the rows it does not take, and the same batches out of a stock translation task."""
import itertools

import pytest
import torch
from fairseq.data import data_utils

import e2e
import umst_plugin  # noqa: F401  (installs the patch)
from umst_dev import dev
from umst_plugin.data.collate import collate_tokens
from umst_plugin.patches import installed, original

FAIRSEQS = original(data_utils.collate_tokens)


def _same(got, want):
    return got.dtype == want.dtype and got.shape == want.shape and got.device == want.device and got.equal(want)


def _rows(generator, dtype, empty_rows):
    count = int(torch.randint(1, 12, (1,), generator=generator))
    lengths = torch.randint(0 if empty_rows else 1, 15, (count,), generator=generator)
    return [torch.randint(-3, 60, (int(n),), generator=generator).to(dtype) for n in lengths]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_every_argument_gives_fairseqs_tensor(dtype):
    """Random batches (empty rows where fairseq takes them) under every combination of left padding, the moved
    end-of-sentence (the last token, or eos_idx), a minimum width under and over the longest row, a multiple to
    round to and a minimum batch size under and over the rows'."""
    generator = torch.Generator().manual_seed(0)
    options = itertools.product([False, True], [(False, None), (True, None), (True, 2)], [None, 3, 20], [1, 8],
                                [None, 2, 16])
    checked = 0
    for left_pad, (move_eos, eos_idx), pad_to_length, pad_to_multiple, pad_to_bsz in options:
        for _ in range(3):
            rows = _rows(generator, dtype, empty_rows=not move_eos)
            arguments = (1, eos_idx, left_pad, move_eos, pad_to_length, pad_to_multiple, pad_to_bsz)
            want = FAIRSEQS(rows, *arguments)
            got = collate_tokens(rows, *arguments)
            assert _same(got, want), (rows, arguments, got, want)
            checked += 1
    assert checked == 2 * 3 * 3 * 2 * 3 * 3


def test_its_defaults_are_fairseqs():
    """Called with the rows and the pad alone (as the side data's heads are): right-padded, nothing moved, the
    longest row's width, the rows' count."""
    rows = [torch.tensor([5, 6, 2]), torch.tensor([7, 2])]
    assert _same(collate_tokens(rows, 1), FAIRSEQS(rows, 1))
    assert collate_tokens(rows, 1).tolist() == [[5, 6, 2], [7, 2, 1]]


def test_a_batch_of_empty_rows_is_all_padding():
    empty = [torch.zeros(0, dtype=torch.long)] * 3
    for left_pad in (False, True):
        assert _same(collate_tokens(empty, 0, left_pad=left_pad, pad_to_length=2),
                     FAIRSEQS(empty, 0, left_pad=left_pad, pad_to_length=2))


def test_rows_it_does_not_take_go_to_fairseqs_own():
    """Mixed dtypes (fairseq casts each row to the first's: a concatenation would promote them), 2-d rows and an
    empty row whose end-of-sentence should move: fairseq's result, or fairseq's error; without a fallback, a
    ValueError that says what it takes."""
    mixed = [torch.tensor([1.5, 2.5]), torch.tensor([3, 4, 5])]
    assert _same(data_utils.collate_tokens(mixed, 0), FAIRSEQS(mixed, 0))
    assert data_utils.collate_tokens(mixed, 0).tolist() == [[1.5, 2.5, 0.0], [3.0, 4.0, 5.0]]
    big = [torch.tensor([2 ** 40 + 1]), torch.tensor([1.0])]  # int64 first: promoted to float, it would round
    assert data_utils.collate_tokens(big, 0).tolist() == [[2 ** 40 + 1], [1]]
    with pytest.raises(AssertionError):  # fairseq's copy_tensor: a 2-d row's numel is not its slice's
        data_utils.collate_tokens([torch.ones(2, 3)], 0)
    with pytest.raises(IndexError):  # fairseq's dst[0] on an empty row (between two others: nothing else fails)
        data_utils.collate_tokens([torch.tensor([4, 2]), torch.zeros(0, dtype=torch.long), torch.tensor([5, 2])], 1,
                                  eos_idx=2, move_eos_to_beginning=True)
    with pytest.raises(ValueError, match="1-d tensors of one dtype"):
        collate_tokens(mixed, 0)


def test_the_patch_is_fairseqs_collate_tokens_now():
    from fairseq.data import language_pair_dataset

    assert installed(data_utils.collate_tokens, "collate_tokens")
    assert language_pair_dataset.data_utils.collate_tokens is data_utils.collate_tokens  # what collate calls


def test_a_stock_translation_tasks_batches_are_fairseqs(toy_databin, monkeypatch):
    """Every batch of an epoch of fairseq's own translation task, with the patch and with fairseq's collate_tokens
    put back: the same tensors (source left-padded, previous output tokens with the end-of-sentence moved, target)."""
    def epoch():
        task = dev.setup_task(toy_databin, {"source_lang": e2e.SRC, "target_lang": e2e.TGT}, task="translation")
        task.load_dataset("train")
        itr = task.get_batch_iterator(task.dataset("train"), max_tokens=200, seed=1)
        return list(itr.next_epoch_itr(shuffle=True))

    patched = epoch()
    monkeypatch.setattr(data_utils, "collate_tokens", FAIRSEQS)
    stock = epoch()
    assert len(patched) == len(stock) > 3
    for a, b in zip(patched, stock):
        for key in ("src_tokens", "src_lengths", "prev_output_tokens"):
            assert _same(a["net_input"][key], b["net_input"][key]), key
        assert _same(a["target"], b["target"]) and _same(a["id"], b["id"])
