"""Patch: a run resumed in epoch 2 or later trains on the batches of the run it continues.

fairseq's training loop builds the training set's ``EpochBatchIterator`` once, in the epoch the process starts
in, and reuses it for every later epoch (``FairseqTask.get_batch_iterator`` caches it where the dataset
``can_reuse_epoch_itr_across_epochs``, as fairseq's translation datasets do): the examples are put in order and cut
into batches once, and each epoch only shuffles those batches (``numpy_seed(seed + epoch)``). fairseq-fixed
0.12.3.1 puts the examples in order under ``numpy_seed(seed + epoch)`` as well (``make_batches`` in
fairseq/tasks/fairseq_task.py, lines 289-291; fairseq 0.12.2 used ``numpy_seed(seed)``), with the epoch the
iterator is built in: 1 in an uninterrupted run, the checkpoint's epoch in a resumed one. So a run resumed in
epoch 2 or later -- every preemption after the first epoch -- cuts other batches than the run it continues (of the
same sizes, with other sentences), and a mid-epoch resume then skips the first batches of *those*: the rest of the
epoch is not what the stopped run had left, some sentences come twice in that epoch and others not at all, and
the losses part from the uninterrupted run's at the first update (stock fairseq's transformer alike; on
scripts/rehearse-wmt.sh's stand-in corpus, 9.309 against 9.324 after a resume at update 33, epoch 2).

Where such an iterator will be reused across epochs and is not cached yet, the patch builds it as the
uninterrupted run did, in epoch 1 (fairseq's own function called with ``epoch=1``: its example order and batches),
then sets it, and the dataset, to the epoch asked for; ``load_state_dict`` and ``next_epoch_itr`` go on from there
as fairseq's do. Iterators that are built anew every epoch in both runs are left alone: where the iterator cache is
off (``disable_iterator_cache``: fairseq-train's epochs over sharded data), ``--update-epoch-batch-itr``, the task's
``rebuild_batches``, sharded data (``data`` with several paths), datasets that cannot be reused; and epoch 1.
"""
import inspect

from umst_plugin.patches import wrap

TARGET = "fairseq.tasks.fairseq_task.FairseqTask.get_batch_iterator"
SYMPTOM = ("a run resumed in epoch 2 or later trains on other batches than the run it continues (the examples "
           "ordered with the resume epoch's seed): after a mid-epoch resume some sentences of that epoch come twice "
           "and others not at all, and the losses part from the uninterrupted run's")
REMOVE_WHEN = ("fairseq orders a reused iterator's examples independently of the epoch it is built in "
               "(numpy_seed(seed), as 0.12.2 did) or records that epoch in the checkpoint's iterator state")

SIGNATURE = ("(self, dataset, max_tokens=None, max_sentences=None, max_positions=None, ignore_invalid_inputs=False, "
             "required_batch_size_multiple=1, seed=1, num_shards=1, shard_id=0, num_workers=0, epoch=1, "
             "data_buffer_size=0, disable_iterator_cache=False, skip_remainder_batch=False, grouped_shuffling=False, "
             "update_epoch_batch_itr=False)")


def reused_across_epochs(task, dataset, disable_iterator_cache, update_epoch_batch_itr):
    """Whether fairseq builds the iterator over ``dataset`` once and reuses it for every later epoch (the cases in
    which ``FairseqTask.get_batch_iterator`` caches it and the training loop does not ask for a new one)."""
    return (not disable_iterator_cache and not update_epoch_batch_itr and task.can_reuse_epoch_itr(dataset)
            and not getattr(task.cfg, "rebuild_batches", False) and not task.has_sharded_data("train"))


def install():
    from fairseq.tasks.fairseq_task import FairseqTask

    def make(original):
        signature = inspect.signature(original)

        def get_batch_iterator(self, dataset, *args, **kwargs):
            bound = signature.bind(self, dataset, *args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            epoch = arguments["epoch"]
            if (epoch <= 1 or dataset in getattr(self, "dataset_to_epoch_iter", {})
                    or not reused_across_epochs(self, dataset, arguments["disable_iterator_cache"],
                                                arguments["update_epoch_batch_itr"])):
                return original(self, dataset, *args, **kwargs)
            # the uninterrupted run built this iterator in epoch 1 and reused it since: build it as then, then move
            # it (and the dataset) to the epoch asked for, as a constructor given that epoch would have set them
            arguments["epoch"] = 1
            iterator = original(**arguments)
            iterator.epoch = epoch
            dataset.set_epoch(epoch)
            return iterator
        return get_batch_iterator

    wrap(FairseqTask, "get_batch_iterator", make, __name__, SIGNATURE)
