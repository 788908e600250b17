"""How umst_plugin/patches/prefetch_thread_exit.py stops fairseq's prefetch threads, piece by piece, on fairseq's own
``BackgroundConsumer`` (the end-to-end symptom, a fairseq-train stopping mid-epoch that aborted at exit, is
tests/test_end_to_end.py's): the wrapped source stops when asked, a thread blocked on a full queue is drained and
joined, and one that does not stop is waited for only as long as asked."""
import itertools
import queue
import threading
import time

from fairseq.data import iterators

import umst_plugin  # noqa: F401  (installs the patches)
from umst_plugin.patches import prefetch_thread_exit


def test_the_source_stops_when_asked_and_ends_with_its_source():
    stop = threading.Event()
    items = prefetch_thread_exit._stoppable(itertools.count(), stop)
    assert [next(items), next(items)] == [0, 1]  # nothing changes while it is read
    stop.set()
    assert list(items) == []
    assert list(prefetch_thread_exit._stoppable([1, 2, 3], threading.Event())) == [1, 2, 3]


def test_a_consumer_blocked_on_a_full_queue_is_drained_and_joined():
    full = queue.Queue(maxsize=1)
    consumer = iterators.BackgroundConsumer(full, itertools.count(), None, None)
    assert consumer in prefetch_thread_exit._consumers and not consumer._umst_stop.is_set()
    consumer.daemon = True
    consumer.start()
    deadline = time.monotonic() + 10
    while not full.full() and time.monotonic() < deadline:  # the thread is then blocked in put()
        time.sleep(0.01)
    assert full.full() and consumer.is_alive()
    start = time.monotonic()
    prefetch_thread_exit.stop_prefetch_threads(timeout=10)
    assert not consumer.is_alive() and consumer._umst_stop.is_set()
    assert time.monotonic() - start < 5  # joined as soon as it ended, not at the timeout


def test_a_consumer_that_does_not_stop_is_waited_for_up_to_the_timeout():
    release = threading.Event()

    def stuck():  # inside one item (a long collation) until released
        release.wait(30)
        yield 0

    consumer = iterators.BackgroundConsumer(queue.Queue(), stuck(), None, None)
    consumer.daemon = True
    consumer.start()
    try:
        start = time.monotonic()
        prefetch_thread_exit.stop_prefetch_threads(timeout=0.5)
        waited = time.monotonic() - start
        assert consumer.is_alive() and 0.5 <= waited < 5, waited
    finally:
        release.set()
        consumer.join(10)
    assert not consumer.is_alive()
