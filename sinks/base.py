"""The one interface every action sink implements (Burrow's notifier / Quix's sink shape)."""

from __future__ import annotations

from typing import Protocol

from compactd.model import ActionRecord


class ActionSink(Protocol):
    """Carries out an action and answers with the record's final status (`sent`, `failed`, `skipped`...).

    A sink never raises for a refused or failed action: it answers `failed` with `detail.error`.
    `start()` connects (the constructor only configures); `close()` releases what `start()` took.
    """

    name: str

    def start(self) -> None: ...

    def execute(self, rec: ActionRecord) -> ActionRecord: ...

    def close(self) -> None: ...
