"""What each partition looks like to an operator: how late, how much could go, and what happens next. Pure.

Computed from the same view and thresholds the controller evaluates with, so metrics never need a Redis scan.
Values that age with time (compaction delay) are kept as timestamps and turned into seconds at scrape time.
"""

from __future__ import annotations

import msgspec

from compactd.model import PartitionView
from compactd.policy.rules import (
    consumed_retention_offset,
    earliest_uncompacted_ts,
    forced_retention_offset,
    live_segments,
)
from compactd.policy.thresholds import Thresholds

RULES = ("max_compaction_lag", "consumed_retention", "forced_retention")


class PartitionStats(msgspec.Struct, frozen=True, gc=False):
    """A struct (built in C): the controller makes one per evaluated partition, 259k in a busy batch at 1M, and keeps
    the last of each. Untracked by the garbage collector (it holds numbers and a tuple of pairs, never a cycle): as
    a NamedTuple every one of them stayed tracked, and each full collection in a batch walked them all (issue 17)."""

    earliest_ts: int | None  # KIP-354 earliest uncompacted timestamp (None: nothing dirty)
    lag_ms: int | None  # max.compaction.lag.ms in force (None: no compaction bound)
    min_committed: int | None
    log_start: int
    consumed_offsets: int  # offsets deletable now under consumed retention
    consumed_bytes: int
    forced_offsets: int  # ... under forced retention
    forced_bytes: int
    next_at: tuple[tuple[str, int], ...]  # (rule, epoch ms) of each rule's next threshold crossing

    def compaction_delay_ms(self, now: int) -> int:
        """max(now - earliest - lag, 0), as Kafka's max-compaction-delay-secs (in ms here)."""
        if self.earliest_ts is None or self.lag_ms is None:
            return 0
        return max(now - self.earliest_ts - self.lag_ms, 0)


def _deletable(view: PartitionView, before: int | None) -> tuple[int, int]:
    if before is None or before <= view.log_start:
        return 0, 0
    size = sum(s.size_bytes for s in live_segments(view) if s.end_offset <= before)
    return before - view.log_start, size


def next_crossings(view: PartitionView, th: Thresholds, now: int) -> tuple[tuple[str, int], ...]:
    """For each rule, the next future time a threshold is crossed (a segment ages past a retention, the oldest dirty
    record passes the lag). Rules already crossed show in the delay and deletable figures instead."""
    out: list[tuple[str, int]] = []
    earliest = earliest_uncompacted_ts(view)
    if th.max_compaction_lag_ms is not None and earliest is not None and earliest + th.max_compaction_lag_ms >= now:
        out.append(("max_compaction_lag", earliest + th.max_compaction_lag_ms + 1))
    segments = live_segments(view)
    if th.consumed_retention_ms is not None and view.min_committed is not None:
        ages = [s.closed_at + th.consumed_retention_ms + 1 for s in segments if s.end_offset <= view.min_committed]
        future = [t for t in ages if t > now]
        if future:
            out.append(("consumed_retention", min(future)))
    if th.forced_retention_ms is not None:
        future = [t for t in (s.closed_at + th.forced_retention_ms + 1 for s in segments) if t > now]
        if future:
            out.append(("forced_retention", min(future)))
    return tuple(out)


def partition_stats(view: PartitionView, th: Thresholds, now: int) -> PartitionStats:
    consumed = _deletable(view, consumed_retention_offset(view, th, now))
    forced = _deletable(view, forced_retention_offset(view, th, now))
    return PartitionStats(
        earliest_ts=earliest_uncompacted_ts(view),
        lag_ms=th.max_compaction_lag_ms,
        min_committed=view.min_committed,
        log_start=view.log_start,
        consumed_offsets=consumed[0],
        consumed_bytes=consumed[1],
        forced_offsets=forced[0],
        forced_bytes=forced[1],
        next_at=next_crossings(view, th, now),
    )
