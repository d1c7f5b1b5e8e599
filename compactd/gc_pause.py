"""When Python's cyclic garbage collector runs: on a thread of compactd's own, and not during a batch.

**On its own thread** (`collect_on_own_thread`). Automatic collection runs on whichever thread allocates past the
threshold, and librdkafka's threads run Python code: an Admin request's result is built on the client's background
thread, log and error callbacks run on its broker threads. A Kafka client found in cyclic garbage there is destroyed
on a thread of librdkafka's own, and librdkafka aborts the process ("Application bug: rd_kafka_destroy() called from
librdkafka owned thread"; confluent-kafka-python #2131). It happened: an xdist worker died with SIGABRT, no traceback,
in 2 of 5 full runs, while a 3-node cluster was stopped under clients whose callbacks fired on every lost connection.
Every process that makes a Kafka client (the job, the agent, the CLI, Spark's Python workers, the tests) turns
automatic collection off and collects on a daemon thread instead, with the interpreter's own thresholds; a client in
cyclic garbage is then destroyed there, where librdkafka allows it.

**Not during a batch** (`gc_paused`). A micro-batch at a million partitions allocates millions of objects (Spark's
rows as changes, views, records, plans) that die by reference counting when the batch ends. While it runs, every few
thousand surviving allocations start a collection, and the collector counts the batch's live objects as long-lived:
four full collections a batch walked all of them, 1.4 s of a 15 s batch. Held off, the objects are freed as
before and the next collection after the batch sees only what survived it. Cyclic garbage made during a batch waits
until it ends.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

LOG = logging.getLogger(__name__)

POLL_S = 0.05  # how often the collecting thread reads the allocation counts (a dict lookup's worth of work)
FULL_EVERY_S = 5.0  # at most one full collection this often: the interpreter skips most of them by its own rule too

_lock = threading.Lock()
_paused = 0  # blocks inside gc_paused, over every thread
_collecting_in: int | None = None  # the process whose collecting thread runs (a forked child has none)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No collection inside the block: automatic collection off, and the collecting thread waits. Nested blocks, and
    overlapping ones in other threads, let collection resume once the last of them ends."""
    global _paused
    with _lock:
        _paused += 1
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
        if was:
            gc.enable()


def collecting() -> bool:
    """Whether a collection may run now: on the collecting thread, unless a block holds it off; or automatically,
    in a process that made no Kafka client."""
    if _collecting_in == os.getpid():
        return _paused <= 0
    return gc.isenabled()


def collect_on_own_thread() -> None:
    """Turn automatic collection off for this process and collect on a daemon thread instead (the module's docstring
    says why). Idempotent; called before every Kafka client is made (`kafka/config.py`)."""
    global _collecting_in
    with _lock:
        if _collecting_in == os.getpid():
            return
        _collecting_in = os.getpid()
    gc.disable()
    threading.Thread(target=_collect, name="compactd-gc", daemon=True).start()


def _collect() -> None:
    """The interpreter's rule, on this thread: the oldest generation whose count passed its threshold is collected
    (a full collection at most every FULL_EVERY_S)."""
    last_full = time.monotonic()
    while True:
        time.sleep(POLL_S)
        if _paused > 0:
            continue
        try:
            counts, limits = gc.get_count(), gc.get_threshold()
            if counts[2] > limits[2] and time.monotonic() - last_full >= FULL_EVERY_S:
                gc.collect(2)
                last_full = time.monotonic()
            elif counts[1] > limits[1] or counts[2] > limits[2]:
                gc.collect(1)
            elif counts[0] > limits[0]:
                gc.collect(0)
        except Exception:  # a finaliser that raised: the next round collects again
            LOG.debug("a collection raised", exc_info=True)


def _after_fork_in_child() -> None:
    """A forked child (Spark's Python workers are forked from its daemon) has no collecting thread: automatic
    collection on again, until the child makes a Kafka client of its own."""
    global _collecting_in, _paused, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    if _collecting_in is not None:
        _collecting_in, _paused = None, 0  # a block the forking thread is inside may end below 0: read as not paused
        gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)
