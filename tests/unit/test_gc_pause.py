"""compactd/gc_pause.py: the collector is off inside, and on again once the last block ends, however blocks nest."""

from __future__ import annotations

import gc
import threading

import pytest

from compactd.gc_pause import gc_paused


def test_off_inside_on_after_also_when_the_block_raises() -> None:
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


def test_a_collector_someone_else_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_blocks_in_two_threads_leave_it_on() -> None:
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
