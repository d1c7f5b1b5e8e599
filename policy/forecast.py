"""What each partition looks like to an operator: how late, how much could go, and what happens next. Pure.

Read off the controller's own evaluation (policy/rules.py), so metrics never need a Redis scan.
Values that age with time (compaction delay) are kept as timestamps and turned into seconds at scrape time.
"""

from __future__ import annotations

import msgspec
import numpy as np

from compactd.model import PartitionNumbers, PartitionView
from compactd.policy.arrays import NONE
from compactd.policy.rules import RULES, Due, Evaluation, Limits, Quiet, erasure
from compactd.policy.thresholds import Thresholds


class PartitionStats(msgspec.Struct, frozen=True, gc=False):
    """A struct (built in C): the controller makes one per evaluated partition, 259k in a busy batch at 1M, and keeps
    the last of each. Untracked by the garbage collector (it holds numbers and a tuple of pairs, never a cycle): as
    a NamedTuple every one of them stayed tracked, and each full collection in a batch walked them all."""

    earliest_ts: int | None  # KIP-354 earliest uncompacted timestamp (None: nothing dirty)
    lag_ms: int | None  # max.compaction.lag.ms in force (None: no compaction bound)
    min_committed: int | None
    log_start: int
    consumed_offsets: int  # offsets deletable now under consumed retention
    consumed_bytes: int
    forced_offsets: int  # ... under forced retention
    forced_bytes: int
    next_at: tuple[tuple[str, int], ...]  # (rule, epoch ms) of each rule's next threshold crossing
    # by when the tombstones the partition holds now are gone, if records keep arriving (`rules.erasure`; None: no
    # bound: max.compaction.lag.ms unset, or never cleaned and nothing dirty); on a replicated cluster whose agents
    # report every replica, the earliest bound a replica's cleaner must meet (`first_by`): past it, a replica is late
    erasure_at: int | None = None

    def compaction_delay_ms(self, now: int) -> int:
        """max(now - earliest - lag, 0), as Kafka's max-compaction-delay-secs (in ms here)."""
        if self.earliest_ts is None or self.lag_ms is None:
            return 0
        return max(now - self.earliest_ts - self.lag_ms, 0)

    def time_to_erasure_ms(self, now: int) -> int | None:
        """How long until `erasure_at`; negative once it has passed (the tombstones outlived their bound: no write
        since made Kafka clean again, or its cleaner is behind)."""
        return None if self.erasure_at is None else self.erasure_at - now


def stats_rows(
    rows: list[int], nums: PartitionNumbers, limits: Limits, q: Quiet, d: Due | None = None
) -> list[PartitionStats]:
    """The stats of `rows`, built from lists (one object each: what the metrics keep). Without `d` the rows must be
    quiet: a quiet row frees nothing (`rules.quiet`), so its deletable figures are 0 without deciding it."""
    ix = np.asarray(rows, dtype=np.int64)
    zero = [0] * len(rows)
    co, cb, fo, fb = (zero,) * 4 if d is None else (
        a[ix].tolist() for a in (d.consumed_offsets, d.consumed_bytes, d.forced_offsets, d.forced_bytes)
    )  # fmt: skip
    earliest = q.earliest[ix].tolist()
    lag_on, lag = limits.lag_on[ix].tolist(), limits.lag[ix].tolist()
    low, ls = q.min_committed[ix].tolist(), nums.log_start[ix].tolist()
    crossings = [a[ix].tolist() for a in (q.next_lag, q.next_consumed, q.next_forced)]
    erased = erasure(nums, limits, q).first_by[ix].tolist()
    out = []
    for i in range(len(rows)):
        nxt = tuple((rule, at[i]) for rule, at in zip(RULES, crossings, strict=True) if at[i] != NONE)
        out.append(
            PartitionStats(
                None if earliest[i] == NONE else earliest[i],
                lag[i] if lag_on[i] else None,
                None if low[i] == NONE else low[i],
                ls[i],
                co[i],
                cb[i],
                fo[i],
                fb[i],
                nxt,
                None if erased[i] == NONE else erased[i],
            )
        )
    return out


def partition_stats(view: PartitionView, th: Thresholds, now: int) -> PartitionStats:
    """One partition's stats (a chunk of one)."""
    ev = Evaluation.one(view, th, now)
    return stats_rows([0], ev.nums, ev.limits, ev.q, ev.d)[0]
