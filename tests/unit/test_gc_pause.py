"""compactd/gc_pause.py: the collector is off inside, and on again once the last block ends, however blocks nest; a
process that makes Kafka clients collects on a thread of its own, never on librdkafka's."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from compactd import gc_pause
from compactd.gc_pause import gc_paused


@pytest.fixture
def automatic() -> Iterator[None]:
    """Automatic collection on for the test, as in a process that made no Kafka client (the suite's processes did)."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


def test_off_inside_on_after_also_when_the_block_raises(automatic: None) -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block found it off: it leaves it off
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("batch failed")
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off(automatic: None) -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_blocks_in_two_threads_leave_it_on(automatic: None) -> None:
    """A enters, B enters, A leaves, B leaves: it is on at the end (and on while B is still inside, which costs a
    collection or two, never a leak)."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def b() -> None:
        a_in.wait()
        with gc_paused():
            b_in.set()
            a_out.wait()

    t = threading.Thread(target=b)
    t.start()
    with gc_paused():
        a_in.set()
        b_in.wait()
    a_out.set()
    t.join()
    assert gc.isenabled()


def test_a_process_that_makes_a_kafka_client_collects_cyclic_garbage_on_its_own_thread_only() -> None:
    """A client's callbacks run Python on librdkafka's threads; a collection there that frees a client aborts the
    process. After the first client is made, automatic collection is off and every collection runs on the
    `compactd-gc` thread, and cyclic garbage is still freed."""
    code = """
import gc, threading, time, weakref
from compactd.kafka.config import KafkaConnection, new_admin
assert gc.isenabled()
client = new_admin(KafkaConnection("127.0.0.1:1").client("admin", {"log_level": 0}))
assert not gc.isenabled()
threads = []
gc.callbacks.append(lambda phase, info: phase == "start" and threads.append(threading.current_thread().name))
class Cycle:
    pass
a = Cycle(); a.me = a; gone = weakref.ref(a); del a
for _ in range(20000):  # allocations past the thresholds, on this thread
    b = Cycle(); b.me = b
deadline = time.monotonic() + 10
while gone() is not None and time.monotonic() < deadline:
    time.sleep(0.05)
assert gone() is None, "cyclic garbage was never collected"
assert threads and set(threads) == {"compactd-gc"}, set(threads)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_forked_child_collects_automatically_until_it_makes_a_client() -> None:
    """Spark's Python workers are forked from its daemon: the child has no collecting thread, so automatic collection
    is on again there."""
    gc_pause.collect_on_own_thread()  # the suite's processes collect on their own thread already; idempotent
    assert not gc.isenabled()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's cleanup
        os.write(write, b"1" if gc.isenabled() else b"0")
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert got == b"1"
    assert not gc.isenabled()
