"""Progress of long commands (`compact`, `read --compacted`, `explain TOPIC`) for the operator watching a terminal.

Drawn with rich on stderr, and only when stderr is a terminal: stdout carries the commands' JSON, which scripts and
tests read byte for byte, so nothing here ever writes to it; piped or captured, every call is a no-op.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # rich is imported only when something is drawn: piped runs do not pay for it
    from rich.console import Console
    from rich.progress import Progress, TaskID

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # often enough to look alive, rare enough to cost the driver nothing


class StatusTracker(Protocol):
    """The two calls of pyspark's `StatusTracker` the poller uses (pyspark's names; a fake in tests)."""

    def getActiveStageIds(self) -> list[int]: ...

    def getStageInfo(self, stage_id: int) -> Any: ...


class Reporter:
    """What a command tells the operator; this base draws nothing (stderr not a terminal, or disabled)."""

    enabled = False

    def phase(self, text: str) -> None:
        """A new step: replaces the text and forgets the previous step's counts."""

    def advance(self, done: int, total: int | None, text: str = "") -> None:
        """Counts within the step; `total` None when unknown (the bar pulses). `text` defaults to done/total."""


class _RichReporter(Reporter):
    """One rich task: spinner, `label: phase`, bar, counts, elapsed time."""

    enabled = True

    def __init__(self, bar: Progress, task: TaskID, label: str) -> None:
        self._bar = bar
        self._task = task
        self._label = label

    def phase(self, text: str) -> None:
        self._bar.update(self._task, description=f"{self._label}: {text}", completed=0, total=None, counts="")

    def advance(self, done: int, total: int | None, text: str = "") -> None:
        counts = text or (f"{done}/{total}" if total is not None else str(done))
        self._bar.update(self._task, completed=done, total=total, counts=counts)


@contextmanager
def progress(label: str, enabled: bool | None = None, console: Console | None = None) -> Iterator[Reporter]:
    """A live progress line for the block, erased when it ends (the command's own output is what stays).

    `enabled` None: on when the console (default: stderr) is a terminal. Python writes to stderr meanwhile are
    printed above the line; stdout is left alone.
    """
    if enabled is None:
        enabled = console.is_terminal if console is not None else sys.stderr.isatty()
    if not enabled:
        yield Reporter()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=console if console is not None else Console(stderr=True),
        transient=True,
        redirect_stdout=False,  # stdout is the command's output: never routed through the progress console
        redirect_stderr=True,
    )
    with bar:
        yield _RichReporter(bar, bar.add_task(label, total=None, counts=""), label)


def stage_tasks(tracker: StatusTracker) -> tuple[int, int]:
    """(completed, total) tasks over the active stages; a stage that vanished meanwhile counts for nothing."""
    done = total = 0
    for stage in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage)
        if info is not None:
            done += int(info.numCompletedTasks)
            total += int(info.numTasks)
    return done, total


def active_tracker() -> StatusTracker | None:
    """The status tracker of the process's running SparkContext, None before Spark starts. Not
    `SparkSession.getActiveSession()`: that one is per thread, and the poller runs in its own."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context  # set before its JVM side exists while Spark starts: wait for `_jsc`
    return None if sc is None or getattr(sc, "_jsc", None) is None else sc.statusTracker()


class SparkTasks:
    """Shows "tasks done/total" of the active Spark stages on `reporter` while started, polled from a daemon thread.

    Progress is decoration: any poll error (Spark stopping under it, py4j gone) ends the polling quietly and never
    reaches the command. Nothing starts when the reporter draws nothing.
    """

    def __init__(
        self,
        reporter: Reporter,
        tracker: Callable[[], StatusTracker | None] = active_tracker,
        interval: float = POLL_SECONDS,
    ) -> None:
        self.reporter = reporter
        self.tracker = tracker
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> SparkTasks:
        if self.reporter.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="compactd-spark-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Idempotent; waits a little for the thread (a poll stuck in py4j is left to die with the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 2 * self.interval))

    def _poll(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                tracker = self.tracker()
                if tracker is None:  # Spark not started yet
                    continue
                done, total = stage_tasks(tracker)
                if total and not self._stop.is_set():
                    self.reporter.advance(done, total, f"tasks {done}/{total}")
        except Exception as exc:  # decoration only: stop polling, never fail the command
            log.debug("Spark progress polling stopped: %s", exc)

    def __enter__(self) -> SparkTasks:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
