"""The null sink: decides and records, touches nothing. The default."""

from __future__ import annotations

from compactd.model import ActionRecord


class DryRunSink:
    name = "dry_run"

    def start(self) -> None:
        pass

    def execute(self, rec: ActionRecord) -> ActionRecord:
        return rec.with_status("dry_run")

    def close(self) -> None:
        pass
