"""The one interface every action sink implements (Burrow's notifier / Quix's sink shape)."""

from __future__ import annotations

from typing import Protocol

from policy.model import ActionRecord


class ActionSink(Protocol):
    """Carries out an action and answers with the record's final status (`sent`, `failed`, `skipped`...)."""

    name: str

    def execute(self, rec: ActionRecord) -> ActionRecord: ...

    def close(self) -> None: ...
