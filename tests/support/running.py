"""A job running as the service runs it, on a thread of the test, for tests that act on the cluster meanwhile."""

from __future__ import annotations

import threading
import traceback
from typing import Any


class Running:
    """`job.run(stop=...)` on a thread from `with` to its end (stopped, then joined); what it raised is kept in
    `failed`, so a test can check that a fault did not end the job."""

    def __init__(self, job: Any, join_s: float = 120.0) -> None:
        self.stop = threading.Event()
        self.failed: list[BaseException] = []
        self.join_s = join_s
        self.thread = threading.Thread(target=self._run, args=(job,), name="compactd-job-under-test")

    def _run(self, job: Any) -> None:
        try:
            job.run(stop=self.stop)
        except BaseException as exc:
            self.failed.append(exc)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(self.join_s)

    def assert_alive(self) -> None:
        """The job still runs and raised nothing (what it raised is shown with its traceback)."""
        assert self.thread.is_alive() and not self.failed, self.why()

    def why(self) -> str:
        """What the job raised, with where: the test's failure names the call that let it out."""
        return "".join(line for exc in self.failed for line in traceback.format_exception(exc)) or "nothing raised"
