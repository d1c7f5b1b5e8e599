"""The decision rules, each written once, over arrays: one row per partition, so one partition is an array of one.

The rules of docs/contract.md ("Decisions"), the way Kafka's LogCleanerManager keeps `maxCompactionDelay` apart from
the cleaner threads:
- a segment is *live* while it ends above the log start; KIP-354's earliest uncompacted timestamp is the smallest
  first-batch max timestamp of the live segments above the cleaned offset, and compaction is due strictly past
  max.compaction.lag.ms (`quiet`, `due`);
- a retention lets a segment go when it closed strictly longer ago than the retention, no offsets below it are
  unknown (a gap: segment events lost), and, for consumed retention (KIP-68 level 1), every counted group has read
  it (`_letting_go`); a delete frees the longest prefix of live segments that retention lets go;
- the delete decided is the furthest of the two, forced retention (level 2) only where it reaches further, and
  nothing at or below the log start; an unknown minimum (a counted group without a position, or none) frees
  nothing under consumed retention;
- the tombstones' erasure deadline (`erasure`, KIP-534's two cleaner passes bounded by max.compaction.lag.ms) is a
  time only: the metrics and explain read it, nothing is decided by it.

Everything that decides or explains reads these arrays: the controller's chunks (control/), a partition's plan
(policy/plan.py), its metrics (policy/forecast.py), `compactd explain` and its ranking (app/). `Evaluation.one` is
the same code for one partition. What an action record's answer is (`answered_at`) and when a decision becomes a
record (`should_record`) are rules over one record. Nothing here does IO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from compactd.model import ActionRecord, Decision, PartitionNumbers, PartitionView
from compactd.policy.arrays import (
    I64,
    MAX,
    NONE,
    first_where,
    per_row,
    pick,
    prefix_end,
    reach_before,
    segment_rows,
)
from compactd.policy.thresholds import Thresholds

RULES = ("max_compaction_lag", "consumed_retention", "forced_retention")


def rule_value(th: Thresholds, attr: str) -> int | None:
    """A rule's threshold as the rules read it. `max.compaction.lag.ms` under `compaction.service`: the bound of the
    view's horizon (compaction/trigger.py), never a nudge of Kafka's cleaner, which would remove what compactd's run
    has yet to read (a KIP-280 winner, a tombstone: issue 64)."""
    if attr == "max_compaction_lag_ms" and th.compaction_service:
        return None
    return getattr(th, attr)


@dataclass(frozen=True)
class Limits:
    """Per partition, what the rules read of the thresholds: a value and whether the rule is on, dry.run, exclusion.
    Built from the topic's thresholds, with the partitions that have a partition scope overriding theirs."""

    lag: np.ndarray
    lag_on: np.ndarray
    consumed: np.ndarray
    consumed_on: np.ndarray
    forced: np.ndarray
    forced_on: np.ndarray
    dry_run: np.ndarray
    excluded: np.ndarray
    delete_retention: np.ndarray  # delete.retention.ms, taken as the topic's own (`erasure`)

    @classmethod
    def of(cls, rows: int, topic: tuple[Thresholds, bool], scoped: Mapping[int, tuple[Thresholds, bool]]) -> Limits:
        """`topic`: (thresholds, excluded) for every row; `scoped`: row -> its own (thresholds, excluded)."""
        cols: dict[str, np.ndarray] = {}
        for name, attr in (("lag", "max_compaction_lag_ms"), ("consumed", "consumed_retention_ms"),
                           ("forced", "forced_retention_ms")):  # fmt: skip
            value = rule_value(topic[0], attr)
            cols[name] = np.full(rows, value or 0, dtype=I64)
            cols[f"{name}_on"] = np.full(rows, value is not None)
            for row, (th, _) in scoped.items():
                own = rule_value(th, attr)
                cols[name][row], cols[f"{name}_on"][row] = own or 0, own is not None
        cols["dry_run"] = np.full(rows, bool(topic[0].dry_run))
        cols["excluded"] = np.full(rows, topic[1])
        cols["delete_retention"] = np.full(rows, topic[0].delete_retention_ms, dtype=I64)
        for row, (th, excluded) in scoped.items():
            cols["dry_run"][row], cols["excluded"][row] = bool(th.dry_run), excluded
            cols["delete_retention"][row] = th.delete_retention_ms
        return cls(**cols)

    def take(self, rows: np.ndarray) -> Limits:
        """The limits of `rows` (repeats allowed)."""
        return Limits(**{f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self)})


def _known(nums: PartitionNumbers) -> np.ndarray:
    """Per row: the minimum committed offset over counted groups is known (every counted group has a position)."""
    return (nums.counted > 0) & (nums.zcard == nums.counted) & (nums.lowest >= 0)


def _earliest(nums: PartitionNumbers, seg_row: np.ndarray, starts: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """KIP-354 earliest uncompacted timestamp per row (NONE: nothing dirty)."""
    end = seg[:, 1]
    dirty = (end > nums.log_start[seg_row]) & (end > nums.cleaned[seg_row])
    earliest = per_row(np.minimum, np.where(dirty, seg[:, 2], MAX), starts, nums.nseg, MAX)
    return np.where(earliest == MAX, NONE, earliest)


def _letting_go(
    nums: PartitionNumbers, limits: Limits, seg_row: np.ndarray, seg: np.ndarray, now: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment, whether (consumed retention by age alone, consumed retention, forced retention) lets it go: it
    closed strictly longer ago than the retention, it starts at or below what the log start and the segments before
    it reach (no unknown offsets before it), and for consumed retention every counted group has read past it."""
    end, closed = seg[:, 1], seg[:, 4]
    joined = seg[:, 0] <= reach_before(seg_row, seg, nums.log_start) if len(seg) else np.ones(0, dtype=bool)
    aged = joined & (now - closed > limits.consumed[seg_row])
    return aged, aged & (end <= nums.lowest[seg_row]), joined & (now - closed > limits.forced[seg_row])


@dataclass(frozen=True)
class Quiet:
    """Per row: whether nothing is due (`quiet`), and what a plan then consists of. Times are epoch ms, NONE where
    there is none."""

    quiet: np.ndarray  # bool: no rule crossed (`due` decides nothing)
    deadline: np.ndarray  # the next threshold crossing of any rule (a plan adds its records' retries)
    compaction_due: np.ndarray  # when the oldest dirty record crosses the lag
    earliest: np.ndarray  # KIP-354 earliest uncompacted timestamp
    next_lag: np.ndarray  # each rule's next future threshold crossing
    next_consumed: np.ndarray
    next_forced: np.ndarray
    min_committed: np.ndarray  # NONE where unknown


def quiet(nums: PartitionNumbers, limits: Limits, now: int) -> Quiet:
    """Which rows have nothing due at `now`, and their crossings. No delete is due while the first live segment is
    not let go (the prefix is empty), so this reads one segment a row where `due` reads them all: most rows of a
    batch only moved a group's offset, and this is all their evaluation costs. The converse does not hold where
    reports overlap (two replicas' logs): a segment after the first may hold the prefix back at its base, at or below
    the log start. Such a row is busy here and `due` decides nothing for it: a row more to evaluate, never a delete
    missed."""
    nseg = nums.nseg
    seg_row, starts, seg = segment_rows(nums)
    end, closed = seg[:, 1], seg[:, 4]
    live = end > nums.log_start[seg_row]
    earliest = _earliest(nums, seg_row, starts, seg)
    has_earliest = earliest != NONE
    compaction_busy = limits.lag_on & has_earliest & (now - limits.lag - earliest > 0)
    known = _known(nums)
    _, consumed_ok, forced_ok = _letting_go(nums, limits, seg_row, seg, now)
    first_live = first_where(live, starts, nseg)
    consumed_busy = limits.consumed_on & known & pick(consumed_ok, first_live, False)
    forced_busy = limits.forced_on & pick(forced_ok, first_live, False)

    def next_future(times: np.ndarray, where: np.ndarray) -> np.ndarray:
        """The smallest of each row's `times` (per segment) above `now` where `where` holds; NONE if none."""
        soonest = per_row(np.minimum, np.where(where & (times > now), times, MAX), starts, nseg, MAX)
        return np.where(soonest == MAX, NONE, soonest)

    lag_at = earliest + limits.lag + 1
    next_lag = np.where(limits.lag_on & has_earliest & (lag_at > now), lag_at, NONE)
    read = live & known[seg_row] & (end <= nums.lowest[seg_row])
    next_consumed = np.where(limits.consumed_on, next_future(closed + limits.consumed[seg_row] + 1, read), NONE)
    next_forced = np.where(limits.forced_on, next_future(closed + limits.forced[seg_row] + 1, live), NONE)
    soonest = np.minimum.reduce([np.where(t == NONE, MAX, t) for t in (next_lag, next_consumed, next_forced)])
    return Quiet(
        quiet=~(compaction_busy | consumed_busy | forced_busy),
        deadline=np.where(soonest == MAX, NONE, soonest),
        compaction_due=np.where(limits.lag_on & has_earliest, earliest + limits.lag, NONE),
        earliest=earliest,
        next_lag=next_lag,
        next_consumed=next_consumed,
        next_forced=next_forced,
        min_committed=np.where(known, nums.lowest, NONE),
    )


@dataclass(frozen=True)
class Due:
    """Per row, what is decided at `now` (an excluded topic's rows are decided too, the caller drops them) and what
    each retention frees. Offsets are NONE where there is no such decision."""

    compact: np.ndarray  # bool: compaction is due (delay_ms = now - lag - earliest > 0)
    delay: np.ndarray  # its delay_ms, where `compact`, else 0
    before: np.ndarray  # the delete's before_offset, NONE where no delete is decided
    forced: np.ndarray  # bool: that delete's reason is forced retention (else consumed retention)
    consumed_end: np.ndarray  # consumed retention's delete offset, NONE where it frees no prefix
    forced_end: np.ndarray  # forced retention's
    consumed_offsets: np.ndarray  # offsets and bytes each retention frees now (0 where nothing above the log start)
    consumed_bytes: np.ndarray
    forced_offsets: np.ndarray
    forced_bytes: np.ndarray


def due(nums: PartitionNumbers, limits: Limits, q: Quiet, now: int) -> Due:
    """The decisions of every row: compaction when the oldest dirty record is strictly past the lag; a delete up to
    the longest prefix of live segments a retention lets go, forced retention winning only where it reaches further."""
    seg_row, starts, seg = segment_rows(nums)
    nseg, ls = nums.nseg, nums.log_start
    end, size = seg[:, 1], seg[:, 3]
    live = end > ls[seg_row]
    delay = now - limits.lag - q.earliest
    compact = limits.lag_on & (q.earliest != NONE) & (delay > 0)
    _, consumed_ok, forced_ok = _letting_go(nums, limits, seg_row, seg, now)
    c_end, c_found = prefix_end(seg_row, starts, nseg, live, seg, consumed_ok)
    c_valid = limits.consumed_on & (q.min_committed != NONE) & c_found
    f_end, f_found = prefix_end(seg_row, starts, nseg, live, seg, forced_ok)
    f_valid = limits.forced_on & f_found
    forced = f_valid & (~c_valid | (f_end > c_end))
    before = np.where(forced, f_end, c_end)
    before = np.where((forced | c_valid) & (before > ls), before, NONE)

    def frees(valid: np.ndarray, upto: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Offsets and bytes of live segments below `upto`, where it is above the log start."""
        above = valid & (upto > ls)
        size_sum = per_row(np.add, np.where(live & (end <= upto[seg_row]), size, 0), starts, nseg, 0)
        return np.where(above, upto - ls, 0), np.where(above, size_sum, 0)

    co, cb = frees(c_valid, c_end)
    fo, fb = frees(f_valid, f_end)
    return Due(
        compact, np.where(compact, delay, 0), before, forced & (before != NONE),
        np.where(c_valid, c_end, NONE), np.where(f_valid, f_end, NONE), co, cb, fo, fb,
    )  # fmt: skip


@dataclass(frozen=True)
class Insight:
    """What `compactd explain` shows of each row besides the decisions, from the same predicates. Indices point into
    `seg` (the rows' segments in offset order); len(seg) where there is no such segment."""

    seg: np.ndarray
    live_count: np.ndarray
    live_bytes: np.ndarray
    first_live: np.ndarray
    dirty_count: np.ndarray  # live segments above the cleaned offset
    dirty_bytes: np.ndarray
    oldest_dirty: np.ndarray  # the lowest dirty segment holding the earliest uncompacted timestamp
    by_age: np.ndarray  # consumed retention's prefix by age alone, as if no group held it back (NONE: none, off)
    held_offsets: np.ndarray  # what the groups hold back: (what consumed retention frees, by_age]
    held_bytes: np.ndarray
    gap_at: np.ndarray  # the first offset above the log start no known segment covers (NONE: none)
    gap_next: np.ndarray  # the segment after that gap


def insight(nums: PartitionNumbers, limits: Limits, q: Quiet, d: Due, now: int) -> Insight:
    seg_row, starts, seg = segment_rows(nums)
    nseg, ls = nums.nseg, nums.log_start
    end, size = seg[:, 1], seg[:, 3]
    live = end > ls[seg_row]
    dirty = live & (end > nums.cleaned[seg_row])
    aged, _, _ = _letting_go(nums, limits, seg_row, seg, now)
    by_age, found = prefix_end(seg_row, starts, nseg, live, seg, aged)
    by_age = np.where(limits.consumed_on & found, by_age, NONE)
    held_from = ls + d.consumed_offsets  # past what consumed retention frees (the log start where it frees nothing)
    held = (by_age != NONE) & (by_age > held_from)
    inside = live & (end > held_from[seg_row]) & (end <= by_age[seg_row])
    held_bytes = per_row(np.add, np.where(inside, size, 0), starts, nseg, 0)
    gap = live & (seg[:, 0] > reach_before(seg_row, seg, ls)) if len(seg) else np.zeros(0, dtype=bool)
    gap_next = first_where(gap, starts, nseg)
    gap_at = pick(reach_before(seg_row, seg, ls), gap_next, NONE)
    return Insight(
        seg=seg,
        live_count=per_row(np.add, live.astype(I64), starts, nseg, 0),
        live_bytes=per_row(np.add, np.where(live, size, 0), starts, nseg, 0),
        first_live=first_where(live, starts, nseg),
        dirty_count=per_row(np.add, dirty.astype(I64), starts, nseg, 0),
        dirty_bytes=per_row(np.add, np.where(dirty, size, 0), starts, nseg, 0),
        oldest_dirty=first_where(dirty & (seg[:, 2] == q.earliest[seg_row]), starts, nseg),
        by_age=by_age,
        held_offsets=np.where(held, by_age - held_from, 0),
        held_bytes=np.where(held, held_bytes, 0),
        gap_at=gap_at,
        gap_next=gap_next,
    )


@dataclass(frozen=True)
class Erasure:
    """Per row, by when the tombstones a partition of a compacted topic holds now are gone from its log (KIP-534: a
    tombstone needs two cleaner passes), where max.compaction.lag.ms (L) is set; NONE where a part does not apply.
    R is compactd's `delete.retention.ms`, taken as the topic's own: operators set it to match the topic.

    - The clean part (below `cleaned_up_to`, where it is above the log start and the clean's time C is known): the
      clean at C set their delete horizon at C + R at the latest (`removable_after`; C is when the agent saw the
      checkpoint move, at or after the clean); the next clean after that removes them, and compactd's lag rule bounds
      it by C + R + L (`clean_by`).
    - The dirty part (earliest uncompacted timestamp E): its first pass is due by E + L (`first_pass`), which sets
      the horizon of the tombstones it sees; the second pass comes by E + L + R + L (`dirty_by`).
    - `by`: the later of the two, NONE where neither applies (never cleaned and nothing dirty) or L is unset.

    On a replicated cluster each replica's cleaner runs on its own, and a tombstone is gone from the cluster only once
    every replica removed it. Where the agents report the replicas' checkpoints (`PartitionNumbers.replicas`), each
    reported replica is a row of its own: the same bounds from its checkpoint and the partition's segments
    (`replica_by`, one per replica row; NONE for a replica no agent reported: unknown, left out). Then `by` is the
    latest of the partition's own (the leader's log) and its replicas' bounds: every copy gone by then; `first_by` the
    earliest: the next bound a replica's cleaner must meet, past which that replica holds tombstones overdue (the
    metric's deadline). `slowest` / `soonest`: the replica that sets `by` / `first_by` where it is not the leader's
    own log (NONE there). Without replicas, `first_by` is `by`.

    Kafka cleans a log again only when it has dirty data the cleaner may take (measured on Kafka 4.4: a tombstone past
    its horizon stayed until one new record was written, then the next clean removed it). Without new writes the second
    pass never comes; every bound above assumes the topic is written to, so that the lag rule makes that pass due."""

    removable_after: np.ndarray
    clean_by: np.ndarray
    first_pass: np.ndarray
    dirty_by: np.ndarray
    by: np.ndarray
    first_by: np.ndarray
    replica_by: np.ndarray
    slowest: np.ndarray
    soonest: np.ndarray


def _bounds(nums: PartitionNumbers, limits: Limits, earliest: np.ndarray) -> Erasure:
    """`Erasure`'s bounds of one log per row, from its cleaner checkpoint and its earliest uncompacted timestamp."""
    lag, keep, on = limits.lag, limits.delete_retention, limits.lag_on
    clean = on & (nums.cleaned_at != NONE) & (nums.cleaned > nums.log_start)
    removable_after = np.where(clean, nums.cleaned_at + keep, NONE)
    clean_by = np.where(clean, removable_after + lag, NONE)
    dirty = on & (earliest != NONE)
    first_pass = np.where(dirty, earliest + lag, NONE)
    dirty_by = np.where(dirty, first_pass + keep + lag, NONE)
    by = np.maximum(clean_by, dirty_by)
    empty = np.zeros(0, dtype=I64)
    return Erasure(removable_after, clean_by, first_pass, dirty_by, by, by, empty, empty, empty)


def erasure(nums: PartitionNumbers, limits: Limits, q: Quiet) -> Erasure:
    """The tombstones' deadline of every row (`Erasure`), over every reported replica's cleaner where there are any.
    Times only: it decides nothing."""
    own = _bounds(nums, limits, q.earliest)
    reps = nums.replicas
    n = len(nums.partitions)
    if not len(reps):
        none = np.full(n, NONE, dtype=I64)
        return Erasure(own.removable_after, own.clean_by, own.first_pass, own.dirty_by, own.by, own.by,
                       np.zeros(0, dtype=I64), none, none)  # fmt: skip
    reported = reps[reps[:, 4] == 1]
    rows = reported[:, 0]
    each = dataclasses.replace(nums.take(rows), cleaned=reported[:, 2].copy(), cleaned_at=reported[:, 3].copy())
    seg_row, starts, seg = segment_rows(each)
    bound = _bounds(each, limits.take(rows), _earliest(each, seg_row, starts, seg)).by
    replica_by = np.full(len(reps), NONE, dtype=I64)
    replica_by[reps[:, 4] == 1] = bound
    last, first = own.by.copy(), np.where(own.by == NONE, MAX, own.by)
    np.maximum.at(last, rows, bound)
    np.minimum.at(first, rows, np.where(bound == NONE, MAX, bound))
    first = np.where(first == MAX, NONE, first)
    mine, known = own.by[reps[:, 0]], replica_by != NONE

    def named(where: np.ndarray) -> np.ndarray:
        """Per row, the first replica (in report order) where `where` holds; NONE where none does."""
        out = np.full(n, NONE, dtype=I64)
        at, first_ix = np.unique(reps[where, 0], return_index=True)
        out[at] = reps[where, 1][first_ix]
        return out

    slowest = named(known & (replica_by > mine) & (replica_by == last[reps[:, 0]]))
    soonest = named(known & ((mine == NONE) | (replica_by < mine)) & (replica_by == first[reps[:, 0]]))
    return Erasure(own.removable_after, own.clean_by, own.first_pass, own.dirty_by, last, first, replica_by, slowest,
                   soonest)  # fmt: skip


@dataclass(frozen=True)
class Evaluation:
    """A chunk's rules at `now`: its numbers, limits, crossings (`q`) and decisions (`d`)."""

    nums: PartitionNumbers
    limits: Limits
    q: Quiet
    d: Due
    now: int

    @classmethod
    def of(cls, nums: PartitionNumbers, limits: Limits, now: int, q: Quiet | None = None) -> Evaluation:
        q = quiet(nums, limits, now) if q is None else q
        return cls(nums, limits, q, due(nums, limits, q, now), now)

    @classmethod
    def one(cls, view: PartitionView, th: Thresholds, now: int, excluded: bool = False) -> Evaluation:
        """One partition, as a chunk of one."""
        return cls.of(PartitionNumbers.of_views([view]), Limits.of(1, (th, excluded), {}), now)

    def decisions(self, topic: str, rows: list[int], caps: Mapping[int, int] | None = None) -> list[list[Decision]]:
        """What each of `rows` decides now; `caps`: row -> the compacted view's horizon, where there is one. Read
        from lists: a batch decides on tens of thousands of rows, and indexing numpy scalars was most of it."""
        ix = np.asarray(rows, dtype=I64)
        before = self.d.before[ix]
        if caps:
            cap = np.array([caps.get(r, NONE) for r in rows], dtype=I64)
            before = np.where(before == NONE, NONE, view_horizon(before, cap, self.nums.log_start[ix]))
        parts, compact, delay = (
            self.nums.partitions[ix].tolist(),
            self.d.compact[ix].tolist(),
            self.d.delay[ix].tolist(),
        )
        earliest, forced, before = self.q.earliest[ix].tolist(), self.d.forced[ix].tolist(), before.tolist()
        out = []
        for i, n in enumerate(parts):
            found = []
            if compact[i]:
                found.append(
                    Decision("compact", topic, n, "max_compaction_lag", delay_ms=delay[i], earliest_ts=earliest[i])
                )
            if before[i] != NONE:
                reason = "forced_retention" if forced[i] else "consumed_retention"
                found.append(Decision("delete_records", topic, n, reason, before_offset=before[i]))
            out.append(found)
        return out

    def insight(self) -> Insight:
        return insight(self.nums, self.limits, self.q, self.d, self.now)

    def erasure(self) -> Erasure:
        return erasure(self.nums, self.limits, self.q)


def view_horizon(before: Any, cap: Any, log_start: Any) -> Any:
    """The compacted view's cap on a delete (compaction service): a delete stops at the view's published horizon, so
    the view and the topic's tail keep every key; with the horizon at or below the log start nothing may go (NONE).
    `cap` NONE: the topic has no view. Arrays or single values."""
    return np.where(cap == NONE, before, np.where(cap <= log_start, NONE, np.minimum(before, cap)))


def value(a: np.ndarray, row: int) -> int | None:
    """An array's value at `row` as Python, None where NONE."""
    v = int(a[row])
    return None if v == NONE else v


def decide(view: PartitionView, th: Thresholds, now: int) -> list[Decision]:
    """What one partition decides now (compaction first, then a delete)."""
    return Evaluation.one(view, th, now).decisions(view.topic, [0])[0]


def decide_compaction(view: PartitionView, th: Thresholds, now: int) -> Decision | None:
    return next((d for d in decide(view, th, now) if d.action == "compact"), None)


def decide_deletion(view: PartitionView, th: Thresholds, now: int) -> Decision | None:
    """The furthest delete the retentions allow now, labelled with the level that allows it."""
    return next((d for d in decide(view, th, now) if d.action == "delete_records"), None)


def earliest_uncompacted_ts(view: PartitionView) -> int | None:
    """KIP-354 `earliest` of one partition (None: nothing dirty)."""
    return value(Evaluation.one(view, Thresholds(), 0).q.earliest, 0)


def answered_at(record: ActionRecord, earliest: int | None, log_start: int) -> bool:
    """Whether the cluster has done what the action asked: the log start passed a delete's offset, or the dirty
    segment a compaction was decided for is gone (KIP-354's earliest moved)."""
    if record.action == "delete_records":
        return record.before_offset is not None and log_start >= record.before_offset
    if record.action == "compact":
        return earliest is None or earliest != record.earliest_ts
    return False


def should_record(decision: Decision, existing: ActionRecord | None, now: int, retry_ms: int) -> bool:
    """No duplicate actions: an unanswered action is decided again only after the retry interval."""
    if existing is None:
        return True
    if decision.action == "delete_records" and (decision.before_offset or 0) > (existing.before_offset or 0):
        return True  # more became deletable: the new offset supersedes the old one at once
    if existing.status == "pending":
        return False  # still in the outbox
    return now - existing.decided_at >= retry_ms
