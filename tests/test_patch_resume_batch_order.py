"""A run resumed in epoch 2 or later trains on the batches of the run it continues
(umst_plugin/patches/resume_batch_order.py).

fairseq builds the training iterator once, in the epoch its process starts in, and reuses it; fairseq-fixed orders
the examples with that epoch's seed, so a process that resumes in epoch 2 cut other batches than the uninterrupted
one. Here fairseq's own translation task over the toy corpus's data-bin: the batches an uninterrupted iterator
yields in epochs 2 and 3 against those of an iterator built for a resume 3 batches into epoch 2 (what
``checkpoint_utils.load_checkpoint`` does: ``get_batch_iterator(epoch=2)``, then ``load_state_dict``). The
command-line run of the same: tests/test_resume_matrix.py's epoch-2 resume; scripts/rehearse-wmt.sh through Slurm.
"""
import pytest

import e2e
import umst_plugin  # noqa: F401  (installs the patch)
from fairseq.tasks.fairseq_task import FairseqTask

RESUMED_AT = 3  # batches into epoch 2


def _task(databin):
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    # (the fields fairseq fills in from the training config's dataset group)
    task = TranslationTask.setup_task(TranslationConfig(data=databin, source_lang=e2e.SRC, target_lang=e2e.TGT,
                                                        train_subset="train", dataset_impl="mmap",
                                                        required_seq_len_multiple=1))
    task.load_dataset("train")
    return task


def _iterator(task, epoch, get_batch_iterator=None, **kwargs):
    get_batch_iterator = get_batch_iterator or FairseqTask.get_batch_iterator
    return get_batch_iterator(task, task.dataset("train"), max_tokens=300, seed=1, epoch=epoch, **kwargs)


def _epoch(iterator):
    """The sentence ids of each batch of the iterator's next epoch."""
    return [batch["id"].tolist() for batch in iterator.next_epoch_itr(shuffle=True)]


def _resumed(databin, get_batch_iterator=None):
    iterator = _iterator(_task(databin), 2, get_batch_iterator)
    iterator.load_state_dict({"epoch": 2, "iterations_in_epoch": RESUMED_AT, "shuffle": True, "version": 2})
    return iterator


@pytest.fixture(scope="module")
def uninterrupted(toy_databin):
    iterator = _iterator(_task(toy_databin), 1)
    epochs = [_epoch(iterator) for _ in range(3)]
    assert len(epochs[1]) > RESUMED_AT + 2, len(epochs[1])
    return epochs


def test_a_resume_in_epoch_2_continues_with_the_batches_of_the_uninterrupted_run(toy_databin, uninterrupted):
    iterator = _resumed(toy_databin)
    assert iterator.epoch == 2
    assert _epoch(iterator) == uninterrupted[1][RESUMED_AT:]
    assert _epoch(iterator) == uninterrupted[2]  # and the next epoch too


def test_fairseq_alone_cuts_other_batches_and_the_resumed_epoch_repeats_and_drops_sentences(toy_databin,
                                                                                            uninterrupted):
    """What the patch fixes is real in this fairseq: the same resume through fairseq's own function."""
    iterator = _resumed(toy_databin, FairseqTask.get_batch_iterator.__wrapped__)
    rest = _epoch(iterator)
    assert rest != uninterrupted[1][RESUMED_AT:]
    trained = [i for batch in uninterrupted[1][:RESUMED_AT] + rest for i in batch]
    every = sorted(i for batch in uninterrupted[1] for i in batch)
    assert sorted(trained) != every  # epoch 2 of the resumed run: some sentences twice, others not at all


def test_iterators_built_anew_every_epoch_and_epoch_1_are_fairseqs(toy_databin):
    task = _task(toy_databin)
    original = FairseqTask.get_batch_iterator.__wrapped__
    for epoch, kwargs in ((2, dict(disable_iterator_cache=True)), (2, dict(update_epoch_batch_itr=True)),
                          (1, {})):
        patched = _iterator(task, epoch, **kwargs).frozen_batches
        fairseqs = _iterator(task, epoch, original, **{**kwargs, "disable_iterator_cache": True}).frozen_batches
        assert [b.tolist() for b in patched] == [b.tolist() for b in fairseqs], (epoch, kwargs)


def test_the_uninterrupted_run_s_later_epochs_reuse_its_iterator(toy_databin, uninterrupted):
    """fairseq's training loop asks for the training iterator again after every epoch
    (``trainer.get_train_iterator(epoch_itr.next_epoch_idx)``); where fairseq caches it (built in epoch 1 and
    reused), the patch hands back that same iterator untouched, as fairseq does, and the next epochs' batches are
    the uninterrupted run's: not the iterator moved to the epoch asked for, which, its epoch already over, would
    start the one after it."""
    task = _task(toy_databin)
    iterator = _iterator(task, 1)
    epochs = [_epoch(iterator)]
    for _ in range(2):
        again = _iterator(task, iterator.next_epoch_idx)
        assert again is iterator
        epochs.append(_epoch(again))
    assert epochs == uninterrupted
