"""Generated partitions as Redis holds them, for the tests that check array code against the per-partition rules
(`compactd explain TOPIC`'s ranking, the controller's bulk evaluation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from compactd.model import ActionRecord, PartitionNumbers, PartitionView, Segment
from compactd.policy.thresholds import Thresholds, resolve

H = 3_600_000
T0 = 1_800_000_000_000
EXCLUDED = "excluded by topics.exclude"


@dataclass(frozen=True)
class Case:
    """One partition as Redis holds it: its view, what `cz:<n>` says, its thresholds, exclusion and records."""

    view: PartitionView
    zcard: int  # counted groups with an offset here
    lowest: int | None  # the lowest of their offsets
    th: Thresholds
    excluded: str | None
    records: tuple[ActionRecord, ...]


Pick = Callable[[Sequence[Any]], Any]  # chooses one of the options given


def make_case(pick: Pick, n: int) -> Case:
    """Partition n, each choice made by `pick` among values that sit on, just before and just after the boundaries
    the rules compare (segment ends, the minimum, the log start, thresholds against segment ages)."""
    ms = [None, 0, H // 2, H, 2 * H, 4 * H]
    start, segments = pick([0, 0, 100, 300]), []
    for _ in range(pick([0, 1, 2, 3, 3, 4, 5])):  # closed segments in offset order: mostly contiguous, some gaps
        start = max(0, start + pick([0, 0, 0, 50, -30]))  # and overlaps (a cleaned segment beside the ones it merged)
        end = start + pick([50, 100, 100])
        closed = T0 - pick([0, H // 2, H, H + 1, 2 * H, 2 * H + 1, 3 * H, 5 * H])
        segments.append(Segment(start, end, closed - pick([0, 60_000, 2 * H]), pick([0, 1000, 2000, 1 << 20]), closed))
        start = end
    counted = pick([0, 1, 2, 2, 3])
    zcard = pick([z for z in range(counted + 1)] + [counted] * 3)
    lowest = pick([0, 50, 100, 150, 200, 250, 300, 400, 2000]) if zcard else None
    known = counted > 0 and zcard == counted
    view = PartitionView(
        "orders", n, tuple(segments), cleaned_up_to=pick([None, None, 0, 100, 150, 200, 1000]),
        log_start=pick([0, 0, 0, 50, 100, 200]), min_committed=lowest if known else None, counted_groups=counted,
    )  # fmt: skip
    consumed, forced = pick(ms), pick(ms)
    if consumed is not None and forced is not None and forced < consumed:
        consumed, forced = forced, consumed
    lag = pick([None, 1, H, 3 * H])
    layer = {"dry.run": pick([False, False, True])}
    for key, value in (
        ("max.compaction.lag.ms", lag),
        ("consumed.retention.ms", consumed),
        ("forced.retention.ms", forced),
    ):
        if value is not None:
            layer[key] = value
    if lag is not None and pick([False, False, True]):  # the view's horizon bound: no nudge decided (issue 64)
        layer["compaction.service"] = True
    records = []
    if pick([True, True, False]):
        retry_at = pick([None, None, T0 - 1, T0, T0 + 5000])
        reason = pick(["consumed_retention", "consumed_retention", "forced_retention", "compacted"])
        status = pick(["pending", "pending", "sent", "dry_run", "skipped", "failed"])
        records.append(
            ActionRecord(
                "d", "delete_records", "orders", n, reason, pick([False, True]), T0 - pick([1000, 10 * H]), status,
                before_offset=pick([0, 100, 200, 300]),
                detail={} if retry_at is None else {"retry_at": retry_at, "try": 1, "error": "refused"},
            )
        )  # fmt: skip
    if pick([True, False]):  # a compaction record changes no rank: it is here to show it
        status = pick(["pending", "sent", "dry_run", "skipped"])
        records.append(ActionRecord("c", "compact", "orders", n, "max_compaction_lag", False, T0 - 1000, status))
    excluded = pick([EXCLUDED, None, None, None, None, None])
    # picked last, so that the choices above stay what they were for a given sequence of picks
    if view.cleaned_up_to is not None:  # when the clean was seen; None: cleaned before compactd kept it
        view = replace(view, cleaned_at=pick([None, T0 - 2 * H, T0 - H, T0 - 1, T0]))
    if (retention := pick([None, None, 0, H, 24 * H])) is not None:
        layer["delete.retention.ms"] = retention
    return Case(view, zcard, lowest, resolve({"global": layer}, "orders"), excluded, tuple(records))


@st.composite
def cases(draw: st.DrawFn, n: int) -> Case:
    return make_case(lambda options: draw(st.sampled_from(options)), n)


def numbers(cs: list[Case]) -> PartitionNumbers:
    """What lua/explain_rank.lua returns for these partitions."""
    i64 = np.int64
    segs = [
        [s.base_offset, s.end_offset, s.first_batch_max_ts, s.size_bytes, s.closed_at]
        for c in cs
        for s in c.view.segments
    ]
    return PartitionNumbers(
        partitions=np.array([c.view.partition for c in cs], dtype=i64),
        counted=np.array([c.view.counted_groups for c in cs], dtype=i64),
        cleaned=np.array([-1 if c.view.cleaned_up_to is None else c.view.cleaned_up_to for c in cs], dtype=i64),
        log_start=np.array([c.view.log_start for c in cs], dtype=i64),
        zcard=np.array([c.zcard for c in cs], dtype=i64),
        lowest=np.array([-1 if c.lowest is None else c.lowest for c in cs], dtype=i64),
        nseg=np.array([len(c.view.segments) for c in cs], dtype=i64),
        segments=np.array(segs, dtype=i64).reshape(-1, 5),
        cleaned_at=np.array([-1 if c.view.cleaned_at is None else c.view.cleaned_at for c in cs], dtype=i64),
    )  # fmt: skip


def view_of(nums: PartitionNumbers, topic: str, row: int) -> PartitionView:
    """Row `row` of a chunk's arrays as the `PartitionView` `RedisState.views` reads (the same state): what tests
    compare the packed read and generated cases with."""
    starts = [0, *np.cumsum(nums.nseg).tolist()]
    counted, zcard, lowest = int(nums.counted[row]), int(nums.zcard[row]), int(nums.lowest[row])
    cleaned, cleaned_at = int(nums.cleaned[row]), int(nums.cleaned_at[row])
    return PartitionView(
        topic=topic,
        partition=int(nums.partitions[row]),
        segments=tuple(Segment(*s) for s in nums.segments[starts[row] : starts[row + 1]].tolist()),
        cleaned_up_to=None if cleaned < 0 else cleaned,
        log_start=int(nums.log_start[row]),
        min_committed=lowest if counted > 0 and zcard == counted and lowest >= 0 else None,
        counted_groups=counted,
        cleaned_at=None if cleaned_at < 0 else cleaned_at,
    )
