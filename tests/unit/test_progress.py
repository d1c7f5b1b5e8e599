"""`compactd.app.progress`: drawn on its console (stderr) only, silent when disabled, and the Spark poller is
decoration: it stops with the block and a failing status tracker never reaches the command."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from compactd.app.progress import Reporter, SparkTasks, progress, stage_tasks


def terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=120), buf


class Tracker:
    """pyspark's StatusTracker, as far as the poller uses it."""

    def __init__(self, stages: dict[int, tuple[int, int]], fail: bool = False) -> None:
        self.stages = stages
        self.fail = fail
        self.polls = 0

    def getActiveStageIds(self) -> list[int]:
        self.polls += 1
        if self.fail:
            raise RuntimeError("py4j: the JVM went away")
        return [*self.stages, 99]  # 99: a stage gone before its info is asked

    def getStageInfo(self, stage_id: int) -> Any:
        if stage_id not in self.stages:
            return None
        total, done = self.stages[stage_id]
        return SimpleNamespace(numTasks=total, numCompletedTasks=done)


def wait_for(cond: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_disabled_writes_nothing_anywhere(capsys: pytest.CaptureFixture[str]) -> None:
    console, buf = terminal()
    with progress("compact t", enabled=False, console=console) as bar:
        assert not bar.enabled
        bar.phase("planning t")
        bar.advance(3, 10, "partition 1/2, 3 records")
        with SparkTasks(bar, lambda: Tracker({1: (4, 2)}), interval=0.01) as tasks:
            assert not tasks.running  # nothing to draw: no thread
    assert buf.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_not_a_terminal_is_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    with progress("read t") as bar:  # pytest captures stderr: not a terminal
        bar.phase("reading")
    assert not bar.enabled
    assert capsys.readouterr() == ("", "")
    with progress("read t", console=Console(file=io.StringIO())) as bar:  # the console decides when given
        assert not bar.enabled


def test_enabled_draws_on_its_console_only(capsys: pytest.CaptureFixture[str]) -> None:
    console, buf = terminal()
    with progress("read t", enabled=True, console=console) as bar:
        assert bar.enabled
        bar.phase("reading the view")
        bar.advance(2, 3, "partition 2/3, 1500 records")
    drawn = buf.getvalue()
    assert "read t: reading the view" in drawn
    assert "partition 2/3, 1500 records" in drawn
    assert capsys.readouterr().out == ""


def test_enabled_default_console_is_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with progress("compact t", enabled=True) as bar:
        bar.phase("publishing generation")
    out, _err = capsys.readouterr()
    assert out == ""


def test_stage_tasks_sums_active_stages() -> None:
    assert stage_tasks(Tracker({1: (8, 3), 2: (4, 4)})) == (7, 12)
    assert stage_tasks(Tracker({})) == (0, 0)


def test_poller_shows_tasks_then_stops() -> None:
    console, buf = terminal()
    tracker = Tracker({1: (8, 3)})
    with progress("compact t", enabled=True, console=console) as bar:
        bar.phase("reading")
        waits = iter([None, None])  # Spark not started for the first polls: waited for, not an error
        tasks = SparkTasks(bar, lambda: next(waits, tracker), interval=0.01).start()
        wait_for(lambda: tracker.polls >= 2)
        assert tasks.running
        tasks.stop()
        assert not tasks.running
        polls = tracker.polls
        time.sleep(0.05)
        assert tracker.polls == polls  # stopped means stopped
        tasks.stop()  # idempotent
    assert "tasks 3/8" in buf.getvalue()


def test_poller_error_stops_polling_and_never_raises(capsys: pytest.CaptureFixture[str]) -> None:
    console, _buf = terminal()
    tracker = Tracker({1: (8, 3)}, fail=True)
    with progress("compact t", enabled=True, console=console) as bar, SparkTasks(bar, lambda: tracker, 0.01) as tasks:
        wait_for(lambda: not tasks.running)  # the thread ended by itself on the first error
        assert tracker.polls == 1
    assert capsys.readouterr().out == ""


def test_poller_error_from_the_source_never_raises() -> None:
    def source() -> Any:
        raise RuntimeError("SparkContext stopped")

    console, _buf = terminal()
    with progress("compact t", enabled=True, console=console) as bar:
        tasks = SparkTasks(bar, source, interval=0.01).start()
        wait_for(lambda: not tasks.running)
        tasks.stop()


def test_null_reporter_is_a_reporter() -> None:
    bar = Reporter()
    bar.phase("x")
    bar.advance(1, None)
    assert not bar.enabled
