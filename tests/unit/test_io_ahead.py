"""`IoAhead` runs an evaluation's Redis calls on one worker thread: in the order asked, reads a fixed number ahead of
the results taken, and every call finished before `settled()` lets go, failures raised once all are done."""

from __future__ import annotations

import threading
import time

import pytest

from compactd.control.io_ahead import IoAhead


def test_calls_run_in_the_order_asked_on_one_thread_and_reads_run_ahead() -> None:
    io, done, threads = IoAhead(depth=2), [], set()

    def call(name: str) -> str:
        threads.add(threading.get_ident())
        done.append(name)
        return name

    with io.settled():
        reads = io.ahead(call, [("r0",), ("r1",), ("r2",), ("r3",)])
        deadline = time.monotonic() + 5
        while len(done) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done == ["r0", "r1"]  # asked for before any result is taken, and no more
        for i, got in enumerate(reads):
            assert got == f"r{i}"
            io.submit(call, f"w{i}")  # a write after each planned read
    assert done == ["r0", "r1", "r2", "w0", "r3", "w1", "w2", "w3"]
    assert len(threads) == 1 and threading.get_ident() not in threads
    io.close()


def test_a_failed_write_is_raised_after_every_later_call_finished() -> None:
    io, done = IoAhead(), []

    def fail() -> None:
        raise ConnectionError("redis down")

    def slow() -> None:
        time.sleep(0.1)
        done.append("slow")

    with pytest.raises(ConnectionError, match="redis down"), io.settled():
        io.submit(fail)
        io.submit(slow)
    assert done == ["slow"]  # nothing still writing when the failure reaches the caller
    io.close()


def test_a_failed_read_reaches_the_planner_and_the_block_waits_for_the_rest() -> None:
    io, done = IoAhead(depth=2), []

    def read(n: int) -> int:
        if n == 0:
            raise TimeoutError("read timed out")
        time.sleep(0.05)
        done.append(n)
        return n

    with pytest.raises(TimeoutError), io.settled():
        for _ in io.ahead(read, [(0,), (1,), (2,)]):
            pass
    assert done == [1, 2]  # asked ahead before the failure was seen, and finished before the block let go
    io.close()
