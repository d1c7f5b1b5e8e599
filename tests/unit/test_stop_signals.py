"""The second SIGTERM/SIGINT is kept where a Py4J call would hide it: raised inside a call to Spark's JVM, ForcedStop
reaches the job as Py4J's own error, and the job then waited for the running batch it was told not to wait for."""

from __future__ import annotations

import os
import signal
import time

import pytest

from compactd.app.cli import _stop_on_signals
from compactd.errors import ForcedStop, forced_by


def test_the_second_signal_is_raised_and_kept_on_the_stop_event() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop = _stop_on_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs in this thread at its next instruction
        assert stop.is_set() and forced_by(stop) is None
        with pytest.raises(ForcedStop, match="second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert isinstance(forced_by(stop), ForcedStop)
        assert forced_by(object()) is None  # any other event: no second signal to find
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


class Query:
    """A query whose batch never ends: `status` is a Py4J call in the real one, where a second signal can be lost
    (Py4J resends a command whose send a signal interrupted, and the ForcedStop raised there goes with it)."""

    isActive = True
    status = {"isTriggerActive": True}

    def stop(self) -> None:
        raise AssertionError("stopped inside the running batch")


def test_waiting_for_the_running_batch_asks_the_stop_event_for_a_second_signal() -> None:
    from compactd.streaming.job import StreamingJob

    job = object.__new__(StreamingJob)
    job.query = Query()  # type: ignore[assignment]
    second = ForcedStop("stopped by a second SIGINT")
    asked = []

    def forced() -> ForcedStop | None:
        asked.append(1)
        return second if len(asked) >= 3 else None

    with pytest.raises(ForcedStop):
        job.stop(timeout_s=30, forced=forced)
    assert len(asked) == 3  # raised at the first poll after the signal, not after the batch
    assert job.stop(timeout_s=0.2) is False  # without it: the budget, then False (the caller's StopTimeout)
