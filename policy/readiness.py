"""Readiness gate: no delete_records before the sources have been read up to where they stood when it was armed.

Armed at start on the offsets topic (`__consumer_offsets`, or the commits topic the admin agent writes: their high
watermarks then; with the admin agent, only once its first complete poll is marked: `waiting` until then), and
after a loss of the Redis state on every source topic (where they stood when the rebuild began). Until the stream
has read that far, the minimum committed offset may be built from a partial history (a group's newest commit, or its
tombstone, not read yet), so deletes are recorded as `skipped` with `detail.why = "offsets not caught up"`.
"""

from __future__ import annotations

from compactd.model import SourceOffsets
from compactd.policy.plan import NOT_CAUGHT_UP


class Readiness:
    def __init__(self, targets: SourceOffsets | None, why: str = NOT_CAUGHT_UP) -> None:
        """`targets`: topic -> partition (str) -> offset to reach; None (or nothing to read) opens the gate."""
        self.targets = {t: dict(parts) for t, parts in (targets or {}).items()}
        self.why = why
        self._ready = all(v <= 0 for parts in self.targets.values() for v in parts.values())
        self._waiting = False

    @classmethod
    def waiting(cls, why: str) -> Readiness:
        """Closed until replaced by an armed gate: a condition no offset read can meet (the admin agent's first
        complete poll)."""
        gate = cls(None, why)
        gate._ready, gate._waiting = False, True
        return gate

    def ready(self) -> bool:
        return self._ready

    def observe(self, source_offsets: SourceOffsets) -> bool:
        """Feed the end offsets of a batch; True when this call opened the gate."""
        if self._ready or self._waiting:
            return False
        for topic, parts in self.targets.items():
            reached = source_offsets.get(topic, {})
            if any(int(reached.get(p, 0)) < target for p, target in parts.items()):
                return False
        self._ready = True
        return True
