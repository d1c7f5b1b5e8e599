"""Readiness gate: no delete_records before the sources have been read up to where they stood when it was armed.

Armed at start on `__consumer_offsets` (its high watermarks then), and after a loss of the Redis state on every
source topic (where they stood when the rebuild began). Until the stream has read that far, the minimum committed
offset may be built from a partial history (a group's newest commit, or its tombstone, not read yet), so deletes
are recorded as `skipped` with `detail.why = "offsets not caught up"`.
"""

from __future__ import annotations

from collections.abc import Mapping

from compactd.policy.plan import NOT_CAUGHT_UP

Offsets = Mapping[str, Mapping[str, int]]


class Readiness:
    def __init__(self, targets: Offsets | None, why: str = NOT_CAUGHT_UP) -> None:
        """`targets`: topic -> partition (str) -> offset to reach; None (or nothing to read) opens the gate."""
        self.targets = {t: dict(parts) for t, parts in (targets or {}).items()}
        self.why = why
        self._ready = all(v <= 0 for parts in self.targets.values() for v in parts.values())

    def ready(self) -> bool:
        return self._ready

    def observe(self, source_offsets: Offsets) -> bool:
        """Feed the end offsets of a batch; True when this call opened the gate."""
        if self._ready:
            return False
        for topic, parts in self.targets.items():
            reached = source_offsets.get(topic, {})
            if any(int(reached.get(p, 0)) < target for p, target in parts.items()):
                return False
        self._ready = True
        return True
