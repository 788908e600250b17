"""Patch: stop fairseq's batch-prefetch threads before the interpreter exits.

fairseq's ``EpochBatchIterator`` (``--data-buffer-size``, default 10) collates
batches in a ``BufferedIterator`` daemon thread (``BackgroundConsumer``). When
training stops in the middle of an epoch (``--max-update``), nobody reads that
iterator again and the thread keeps collating ahead. If the interpreter
finalizes while the thread is inside a torch operation that released the GIL,
CPython (3.11) ends the thread with ``pthread_exit`` when it tries to take the
GIL back; the unwinding crosses torch's ``noexcept`` C++ frames and the process
aborts with ``terminate called without an active exception`` (exit status 134,
SIGABRT) -- after a successful training run.

``install()`` (called on plugin import) wraps every new ``BackgroundConsumer``'s
source in an iterator that stops when asked, and registers an ``atexit`` hook
that asks every live consumer to stop, drains its queue (so a blocked ``put``
returns) and joins it. ``atexit`` runs before finalization, so the thread leaves
its torch call and ends normally. Nothing changes while the iterator is in use.
"""
import atexit
import queue
import threading
import time
import weakref

from umst_plugin.patches import wrap

TARGET = "fairseq.data.iterators.BackgroundConsumer.__init__"
SYMPTOM = "a run stopping mid-epoch aborts at exit: 'terminate called without an active exception' (SIGABRT)"
REMOVE_WHEN = "fairseq stops its prefetch threads itself before interpreter finalization"

_JOIN_SECONDS = 30.0  # one batch's collation, at most; then give up and let the interpreter exit

_consumers = weakref.WeakSet()


def _stoppable(source, stop):
    """``source``'s items until ``stop`` is set (checked before fetching the next item)."""
    it = iter(source)
    while not stop.is_set():
        try:
            item = next(it)
        except StopIteration:
            return
        yield item


def stop_prefetch_threads(timeout=_JOIN_SECONDS):
    """Ask every live fairseq prefetch thread to stop, and wait (up to ``timeout`` s each) until it has."""
    for consumer in list(_consumers):
        consumer._umst_stop.set()
    for consumer in list(_consumers):
        deadline = time.monotonic() + timeout
        while consumer.is_alive() and time.monotonic() < deadline:
            try:  # make room: a put() blocked on a full queue returns, then the loop sees the stop
                while True:
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.05)


def install():
    from fairseq.data import iterators

    def make(original_init):
        def __init__(self, queue, source, max_len, cuda_device):
            self._umst_stop = threading.Event()
            original_init(self, queue, _stoppable(source, self._umst_stop), max_len, cuda_device)
            _consumers.add(self)
        return __init__

    if wrap(iterators.BackgroundConsumer, "__init__", make, __name__, "(self, queue, source, max_len, cuda_device)"):
        atexit.register(stop_prefetch_threads)
