"""A sink that carries out nothing and remembers every record it was asked to carry out.

For controller tests that need Redis only (no broker), and for trying thresholds against real state: what
would have been sent is in `executed`, in order. `answer` picks the status it replies with.
"""

from __future__ import annotations

from collections.abc import Callable

from compactd.model import ActionRecord


class RecordingSink:
    name = "recording"

    def __init__(self, answer: Callable[[ActionRecord], ActionRecord] | None = None) -> None:
        self.executed: list[ActionRecord] = []
        self._answer = answer or (lambda rec: rec.with_status("sent"))

    def start(self) -> None:
        pass

    def execute(self, rec: ActionRecord) -> ActionRecord:
        self.executed.append(rec)
        return self._answer(rec)

    def close(self) -> None:
        pass
