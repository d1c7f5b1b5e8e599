"""A chunk of partitions evaluated at once, over numpy arrays: the common case, where nothing is due. Pure.

At 100k partitions touched per micro-batch, planning each one in Python (`plan.plan_partition`, `forecast.
partition_stats`) cost about 50 µs a partition, against a budget of 30 µs for the whole batch (issue 17). Most
partitions of a batch only moved a group's offset: no rule is crossed, so their plan is a new deadline, a
compaction-due time and new metrics. `quiet` says which rows are such, and computes those three for every row from
the partition's numbers (`PartitionNumbers`).

The other rows are decided over the same arrays (`due`: what `rules.decide` returns, and the deletable figures of the
metrics); `plans` then judges each one's action records with `plan.plan_decided`, the code `plan_partition` ends in.
Building a view and deciding one partition at a time was most of a batch with a decision on 86k partitions.

`quiet`, `due` and `plans` restate, over arrays, what `plan_partition` and `partition_stats` give a partition:
tests/unit/test_bulk_plan.py checks them against each other on generated partitions, so a change to the rules shows
up there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from compactd.model import ActionRecord, Decision, PartitionNumbers
from compactd.policy.forecast import PartitionStats
from compactd.policy.plan import Facts, PartitionPlan, plan_decided
from compactd.policy.thresholds import Thresholds

I64 = np.int64
NONE = -1  # "no such time" in the arrays below (every time compactd computes is a positive epoch ms)
_MAX = np.iinfo(I64).max


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

    @classmethod
    def of(cls, rows: int, topic: tuple[Thresholds, bool], scoped: Mapping[int, tuple[Thresholds, bool]]) -> Limits:
        """`topic`: (thresholds, excluded) for every row; `scoped`: row -> its own (thresholds, excluded)."""
        cols: dict[str, np.ndarray] = {}
        for name, attr in (("lag", "max_compaction_lag_ms"), ("consumed", "consumed_retention_ms"),
                           ("forced", "forced_retention_ms")):  # fmt: skip
            value = getattr(topic[0], attr)
            cols[name] = np.full(rows, value or 0, dtype=I64)
            cols[f"{name}_on"] = np.full(rows, value is not None)
            for row, (th, _) in scoped.items():
                own = getattr(th, attr)
                cols[name][row], cols[f"{name}_on"][row] = own or 0, own is not None
        cols["dry_run"] = np.full(rows, bool(topic[0].dry_run))
        cols["excluded"] = np.full(rows, topic[1])
        for row, (th, excluded) in scoped.items():
            cols["dry_run"][row], cols["excluded"][row] = bool(th.dry_run), excluded
        return cls(**cols)


def per_row(ufunc: np.ufunc, values: np.ndarray, starts: np.ndarray, counts: np.ndarray, empty: int) -> np.ndarray:
    """`ufunc` over each partition's segments (rows without segments get `empty`)."""
    out = np.full(len(counts), empty, dtype=values.dtype)
    has = counts > 0
    if values.size:
        out[has] = ufunc.reduceat(values, starts[has])
    return out


def prefix_end(
    seg_row: np.ndarray, starts: np.ndarray, nseg: np.ndarray, live: np.ndarray, end: np.ndarray, ok: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`rules._deletable_end` per row: the end of the longest run of the row's oldest live segments where `ok` holds
    (the first live segment where it fails stops the run), and whether there is one. Rows without: end 0."""
    idx = np.arange(len(end))
    first_stop = per_row(np.minimum, np.where(live & ~ok, idx, len(idx)), starts, nseg, len(idx))
    last = per_row(np.maximum, np.where(live & (idx < first_stop[seg_row]), idx, -1), starts, nseg, -1)
    found = last >= 0
    return np.where(found, end[np.maximum(last, 0)] if len(end) else 0, 0), found


def segment_rows(nums: PartitionNumbers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row of each segment, where each row's segments start, the segments in `live_segments` order)."""
    seg_row = np.repeat(np.arange(len(nums.partitions)), nums.nseg)
    seg = nums.segments
    if seg.size and np.any((seg_row[1:] == seg_row[:-1]) & (seg[1:, 0] <= seg[:-1, 0])):
        seg = seg[np.lexsort((*seg.T[::-1], seg_row))]  # should segments come unsorted
    return seg_row, row_starts(nums.nseg), seg


def gapless(seg_row: np.ndarray, seg: np.ndarray, log_start: np.ndarray) -> np.ndarray:
    """Per segment: it starts at or below what the row's log start and earlier segments reach (`rules._deletable_end`
    stops at a gap). The running maximum of ends within each row is one accumulate over keys `row * n + rank(end)`,
    which a later row's keys always exceed."""
    n = len(seg)
    if n == 0:
        return np.ones(0, dtype=bool)
    base, end = seg[:, 0], seg[:, 1]
    order = np.argsort(end, kind="stable")
    rank = np.empty(n, dtype=I64)
    rank[order] = np.arange(n, dtype=I64)
    offset = seg_row.astype(I64) * n
    reach = end[order[np.maximum.accumulate(offset + rank) - offset]]  # the row's max end up to and including i
    before = np.empty(n, dtype=I64)
    before[0], before[1:] = NONE, reach[:-1]
    before[np.r_[True, seg_row[1:] != seg_row[:-1]]] = NONE  # a row's first segment: nothing before it
    return base <= np.maximum(before, log_start[seg_row])


def row_starts(nseg: np.ndarray) -> np.ndarray:
    """Where each row's segments start in `PartitionNumbers.segments`."""
    starts = np.zeros(len(nseg), dtype=I64)
    if len(nseg):
        np.cumsum(nseg[:-1], out=starts[1:])
    return starts


@dataclass(frozen=True)
class Quiet:
    """Per row: whether nothing is due (`quiet`), and what a plan then consists of. Times are epoch ms, NONE where
    there is none. `deadline` and `next_*` are meaningful on quiet rows only (elsewhere the full plan decides)."""

    quiet: np.ndarray  # bool: no rule crossed (`decide` returns nothing)
    deadline: np.ndarray  # `next_deadline` with no live records
    compaction_due: np.ndarray  # `PartitionPlan.compaction_due`, every row
    earliest: np.ndarray  # KIP-354 earliest uncompacted timestamp, every row
    next_lag: np.ndarray  # `next_crossings`, by rule
    next_consumed: np.ndarray
    next_forced: np.ndarray
    min_committed: np.ndarray  # NONE where unknown

    def stats_rows(
        self, rows: list[int], nums: PartitionNumbers, limits: Limits, due: Due | None = None
    ) -> list[PartitionStats]:
        """`partition_stats` of `rows`, built from lists (one object each: what the metrics keep). Without `due`
        the rows must be quiet (nothing deletable); with it, any row."""
        ix = np.asarray(rows, dtype=I64)
        zero = [0] * len(rows)
        co, cb, fo, fb = (zero,) * 4 if due is None else (
            a[ix].tolist() for a in (due.consumed_offsets, due.consumed_bytes, due.forced_offsets, due.forced_bytes)
        )  # fmt: skip
        earliest = self.earliest[ix].tolist()
        lag_on, lag = limits.lag_on[ix].tolist(), limits.lag[ix].tolist()
        low, ls = self.min_committed[ix].tolist(), nums.log_start[ix].tolist()
        nl, nc, nf = self.next_lag[ix].tolist(), self.next_consumed[ix].tolist(), self.next_forced[ix].tolist()
        out = []
        for i in range(len(rows)):
            nxt: list[tuple[str, int]] = []
            if nl[i] != NONE:
                nxt.append(("max_compaction_lag", nl[i]))
            if nc[i] != NONE:
                nxt.append(("consumed_retention", nc[i]))
            if nf[i] != NONE:
                nxt.append(("forced_retention", nf[i]))
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
                    tuple(nxt),
                )
            )
        return out


def quiet(nums: PartitionNumbers, limits: Limits, now: int) -> Quiet:
    """Which rows have nothing due at `now`, and their deadline, compaction-due time and crossings.

    The rules, over arrays (policy/rules.py is the reference): a segment is live when it ends above the log start;
    KIP-354's earliest is the smallest first-batch timestamp of live segments above the cleaned offset; compaction is
    due when now - lag - earliest > 0; a delete is due when the first live segment qualifies under a retention and
    starts at or below the log start (`_deletable_end` stops at the first one that does not or at a gap, so the
    prefix is empty exactly when the first fails).
    """
    rows, nseg = len(nums.partitions), nums.nseg
    seg_row, starts, seg = segment_rows(nums)
    end, first_ts, closed = seg[:, 1], seg[:, 2], seg[:, 4]
    live = end > nums.log_start[seg_row]
    dirty = live & (end > nums.cleaned[seg_row])
    earliest = per_row(np.minimum, np.where(dirty, first_ts, _MAX), starts, nseg, _MAX)
    has_earliest = earliest != _MAX
    earliest = np.where(has_earliest, earliest, NONE)
    compaction_due = np.where(limits.lag_on & has_earliest, earliest + limits.lag, NONE)
    compaction_busy = limits.lag_on & has_earliest & (now - limits.lag - earliest > 0)

    known = (nums.counted > 0) & (nums.zcard == nums.counted) & (nums.lowest >= 0)
    min_committed = np.where(known, nums.lowest, NONE)
    # the first live segment of each row (rows without one get index len(seg), past the end)
    idx = np.arange(len(seg))
    first_live = per_row(np.minimum, np.where(live, idx, len(idx)), starts, nseg, len(idx))
    has_live = first_live < len(idx)
    at = np.minimum(first_live, max(len(idx) - 1, 0))
    f_end = end[at] if len(idx) else np.zeros(rows, dtype=I64)
    f_closed = closed[at] if len(idx) else np.zeros(rows, dtype=I64)
    f_joined = gapless(seg_row, seg, nums.log_start)[at] if len(idx) else np.zeros(rows, dtype=bool)
    consumed_busy = (
        limits.consumed_on & known & has_live & f_joined & (f_end <= nums.lowest) & (now - f_closed > limits.consumed)
    )
    forced_busy = limits.forced_on & has_live & f_joined & (now - f_closed > limits.forced)

    def next_future(times: np.ndarray, where: np.ndarray) -> np.ndarray:
        """The smallest of each row's `times` (per segment) above `now` where `where` holds; NONE if none."""
        soonest = per_row(np.minimum, np.where(where & (times > now), times, _MAX), starts, nseg, _MAX)
        return np.where(soonest == _MAX, NONE, soonest)

    lag_at = earliest + limits.lag + 1
    next_lag = np.where(limits.lag_on & has_earliest & (lag_at > now), lag_at, NONE)
    counted_ok = live & known[seg_row] & (end <= nums.lowest[seg_row])
    next_consumed = np.where(limits.consumed_on, next_future(closed + limits.consumed[seg_row] + 1, counted_ok), NONE)
    next_forced = np.where(limits.forced_on, next_future(closed + limits.forced[seg_row] + 1, live), NONE)
    soonest = np.minimum.reduce([np.where(t == NONE, _MAX, t) for t in (next_lag, next_consumed, next_forced)])
    return Quiet(
        quiet=~(compaction_busy | consumed_busy | forced_busy),
        deadline=np.where(soonest == _MAX, NONE, soonest),
        compaction_due=compaction_due,
        earliest=earliest,
        next_lag=next_lag,
        next_consumed=next_consumed,
        next_forced=next_forced,
        min_committed=min_committed,
    )


@dataclass(frozen=True)
class Due:
    """Per row, what `rules.decide` decides at `now` (any row; an excluded topic's rows are decided too, the caller
    drops them), and what `partition_stats` reports deletable. Offsets are NONE where there is no such decision."""

    compact: np.ndarray  # bool: `decide_compaction` decides (delay_ms = now - lag - earliest > 0)
    delay: np.ndarray  # its delay_ms, where `compact`
    before: np.ndarray  # `decide_deletion`'s before_offset, NONE where it decides nothing
    forced: np.ndarray  # bool: that delete's reason is forced retention (else consumed retention)
    consumed_offsets: np.ndarray  # `partition_stats`' deletable figures under each retention
    consumed_bytes: np.ndarray
    forced_offsets: np.ndarray
    forced_bytes: np.ndarray


def due(nums: PartitionNumbers, limits: Limits, q: Quiet, now: int) -> Due:
    """The decisions of every row, over arrays (policy/rules.py is the reference): compaction when the oldest dirty
    record is strictly past the lag; a delete up to the longest prefix of live segments old enough (and, for consumed
    retention, read by every counted group), forced retention winning only when it reaches further."""
    seg_row, starts, seg = segment_rows(nums)
    nseg, ls = nums.nseg, nums.log_start
    end, size, closed = seg[:, 1], seg[:, 3], seg[:, 4]
    live = end > ls[seg_row]
    has_earliest = q.earliest != NONE
    delay = now - limits.lag - q.earliest
    compact = limits.lag_on & has_earliest & (delay > 0)

    known = q.min_committed != NONE
    joined = gapless(seg_row, seg, ls)
    c_ok = joined & (now - closed > limits.consumed[seg_row]) & (end <= nums.lowest[seg_row])
    c_end, c_found = prefix_end(seg_row, starts, nseg, live, end, c_ok)
    c_valid = limits.consumed_on & known & c_found
    f_end, f_found = prefix_end(seg_row, starts, nseg, live, end, joined & (now - closed > limits.forced[seg_row]))
    f_valid = limits.forced_on & f_found
    forced = f_valid & (~c_valid | (f_end > c_end))
    before = np.where(forced, f_end, c_end)
    before = np.where((forced | c_valid) & (before > ls), before, NONE)

    def deletable(valid: np.ndarray, upto: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`forecast._deletable`: offsets and bytes of live segments below `upto`, where it is above the log start."""
        frees = valid & (upto > ls)
        inside = live & (end <= upto[seg_row])
        size_sum = per_row(np.add, np.where(inside, size, 0), starts, nseg, 0)
        return np.where(frees, upto - ls, 0), np.where(frees, size_sum, 0)

    co, cb = deletable(c_valid, c_end)
    fo, fb = deletable(f_valid, f_end)
    return Due(compact, np.where(compact, delay, 0), before, forced & (before != NONE), co, cb, fo, fb)


def plans(
    topic: str,
    nums: PartitionNumbers,
    q: Quiet,
    d: Due,
    rows: list[int],
    th_of: Callable[[int], Thresholds],
    records: Mapping[int, list[ActionRecord]],
    now: int,
    deletes_allowed: bool,
    caps: Mapping[int, int] | None = None,
) -> list[PartitionPlan]:
    """`plan.plan_partition` of `rows` (none of an excluded topic), without a view each: the decisions come from
    `due`, the numbers the records are judged by from the arrays, and `plan.plan_decided` does the rest as it does
    for `plan_partition`. `th_of(row)`: the row's thresholds; `records`: partition -> its action records; `caps`:
    row -> the compacted view's horizon, where there is one."""
    parts = nums.partitions[rows].tolist() if rows else []
    earliest, delay, compact = q.earliest[rows].tolist(), d.delay[rows].tolist(), d.compact[rows].tolist()
    before, forced = d.before[rows].tolist(), d.forced[rows].tolist()
    crossing, low, ls = q.deadline[rows].tolist(), q.min_committed[rows].tolist(), nums.log_start[rows].tolist()
    caps = caps or {}
    out = []
    for i, row in enumerate(rows):
        n = parts[i]
        decisions = []
        if compact[i]:
            decisions.append(
                Decision("compact", topic, n, "max_compaction_lag", delay_ms=delay[i], earliest_ts=earliest[i])
            )
        if before[i] != NONE:
            reason = "forced_retention" if forced[i] else "consumed_retention"
            decisions.append(Decision("delete_records", topic, n, reason, before_offset=before[i]))
        facts = Facts(
            topic, n, None if earliest[i] == NONE else earliest[i], ls[i], None if low[i] == NONE else low[i],
            None if crossing[i] == NONE else crossing[i],
        )  # fmt: skip
        out.append(
            plan_decided(
                facts,
                decisions,
                records.get(n, []),
                th_of(row),
                now,
                deletes_allowed=deletes_allowed,
                view_cap=caps.get(row),
            )
        )
    return out
