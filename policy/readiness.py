"""Readiness gate: no delete_records before the offsets topic has been read up to where it stood at start.

Until then the minimum committed offset may be built from a partial history (a group's newest commit, or its
tombstone, not read yet), so deletes are recorded as `skipped` with `detail.why = "offsets not caught up"`.
"""

from __future__ import annotations

from collections.abc import Mapping


class Readiness:
    def __init__(self, topic: str, targets: Mapping[str, int] | None) -> None:
        """`targets`: high watermark per partition (str) at start; None disables the gate."""
        self.topic = topic
        self.targets = dict(targets or {})
        self._ready = targets is None or all(v <= 0 for v in self.targets.values())

    def ready(self) -> bool:
        return self._ready

    def observe(self, source_offsets: Mapping[str, Mapping[str, int]]) -> bool:
        """Feed the end offsets of a batch; True when this call opened the gate."""
        if self._ready:
            return False
        reached = source_offsets.get(self.topic, {})
        if all(int(reached.get(p, 0)) >= hw for p, hw in self.targets.items()):
            self._ready = True
            return True
        return False
