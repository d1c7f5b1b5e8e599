"""`compactd explain TOPIC` ranks every partition over arrays and explains only the worst: the ranking must give each
partition exactly the `worst` figures its explanation reports, whatever the partition, its thresholds and records."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.app.explain import GroupsHere, explain_partition, threshold_sources, worst_first
from compactd.app.explain_rank import Deletes, Limits, worst_figures, worst_order
from compactd.model import ActionRecord, PartitionView, Segment
from compactd.policy.thresholds import Thresholds, resolve
from compactd.state.redis_store import PartitionNumbers
from tests.support.examples import examples

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
    for _ in range(pick([0, 1, 2, 3, 3, 4, 5])):  # closed segments in offset order, mostly contiguous
        start += pick([0, 0, 0, 50])
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
    )  # fmt: skip


def explained(c: Case, gate: dict[str, Any] | None) -> dict[str, Any]:
    # what partition_details and groups_here give: the lowest counted groups, the one at the minimum first
    groups = GroupsHere(lowest=(("billing", c.lowest), ("search", c.lowest + 7)) if c.lowest is not None else ())
    src = threshold_sources({}, {}, "orders", c.view.partition)
    return explain_partition(c.view, c.th, src, groups, gate, c.records, None, None, T0, c.excluded)


def ranked(cs: list[Case], gate: dict[str, Any] | None) -> tuple[list[tuple[int, int, int]], list[int]]:
    nums = numbers(cs)
    scoped = {i: (c.th, c.excluded is not None) for i, c in enumerate(cs)}  # every row its own thresholds
    limits = Limits.of(len(cs), (Thresholds(), False), scoped)
    deletes = Deletes.of(
        len(cs), {i: r for i, c in enumerate(cs) for r in c.records if r.action == "delete_records"}, T0
    )
    gate_closed = gate is not None and not gate.get("open")
    figures = worst_figures(nums, limits, deletes, gate_closed, T0)
    order = worst_order(nums, limits, deletes, gate_closed, T0)
    return [tuple(int(a[i]) for a in figures) for i in range(len(cs))], [int(nums.partitions[i]) for i in order]


GATES = st.sampled_from([None, {"open": True, "why": "", "since": T0 - H}, {"open": False, "why": "x", "since": T0}])


def check(cs: list[Case], gate: dict[str, Any] | None) -> None:
    es = [explained(c, gate) for c in cs]
    figures, order = ranked(cs, gate)
    for c, e, got in zip(cs, es, figures, strict=True):
        w = e["worst"]
        assert got == (w["overdue_ms"], w["blocked_bytes"], w["blocked_offsets"]), (c, e["rules"])
    assert order == [e["number"] for e in sorted(es, key=worst_first)]


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), size=st.integers(1, 8), gate=GATES)
def test_every_partition_gets_the_figures_its_explanation_reports(data: st.DataObject, size: int, gate: Any) -> None:
    check([data.draw(cases(n)) for n in range(size)], gate)


def test_thousands_of_random_partitions_in_one_ranking() -> None:
    """Many rows at once, as a topic is ranked: every partition's figures, and the order they make."""
    rng = random.Random(20_261_123)
    for gate in (None, {"open": True, "why": "", "since": T0}, {"open": False, "why": "rebuilding", "since": T0}):
        check([make_case(rng.choice, n) for n in range(1500)], gate)


def test_topic_thresholds_apply_to_every_row_and_a_partition_scope_only_to_its_own() -> None:
    seg = (Segment(0, 100, T0 - 5 * H, 1000, T0 - 4 * H),)
    views = [PartitionView("orders", n, seg, None, 0, 100, 1) for n in range(3)]
    cs = [Case(v, 1, 100, Thresholds(), None, ()) for v in views]
    nums = numbers(cs)
    lag = resolve({"global": {"max.compaction.lag.ms": H}}, "orders")
    longer = resolve({"global": {"max.compaction.lag.ms": 2 * H}}, "orders")
    limits = Limits.of(3, (lag, False), {1: (longer, False), 2: (lag, True)})
    overdue, _, _ = worst_figures(nums, limits, Deletes.of(3, {}, T0), False, T0)
    assert overdue.tolist() == [4 * H, 3 * H, 4 * H]
    assert limits.excluded.tolist() == [False, False, True] and limits.dry_run.all()  # dry.run defaults to true


def test_segments_out_of_offset_order_are_ranked_as_the_rules_sort_them() -> None:
    segs = (Segment(100, 200, T0 - 3 * H, 2000, T0 - 3 * H), Segment(0, 100, T0 - 5 * H, 1000, T0 - 4 * H))
    c = Case(PartitionView("orders", 0, segs, None, 0, 200, 1), 1, 200, resolve({"global": {
        "consumed.retention.ms": H, "dry.run": True}}, "orders"), None, ())  # fmt: skip
    figures, _ = ranked([c], None)
    w = explained(c, None)["worst"]
    assert figures == [(w["overdue_ms"], w["blocked_bytes"], w["blocked_offsets"])] == [(0, 3000, 200)]


def test_no_partition_has_no_segments_to_rank() -> None:
    c = Case(PartitionView("orders", 0), 0, None, resolve({"global": {"forced.retention.ms": H}}, "orders"), None, ())
    assert ranked([c, Case(PartitionView("orders", 1), 0, None, c.th, None, ())], None) == ([(0, 0, 0)] * 2, [0, 1])


@pytest.mark.parametrize(("status", "figures"), [("pending", (0, 3000, 300)), ("sent", (0, 2000, 200))])
def test_closed_gate_holds_a_pending_delete_of_the_rule_that_does_not_delete_furthest(
    status: str, figures: tuple[int, int, int]
) -> None:
    """Consumed retention's own delete while forced retention would delete further: waiting in the outbox, the gate
    holds it, so what it frees counts as blocked (with the groups' held-back part, more than forced frees); sent, it
    is acting, and the gate holds only forced retention's."""
    segs = (
        Segment(0, 100, T0 - 5 * H, 1000, T0 - 5 * H),
        Segment(100, 200, T0 - 3 * H, 1000, T0 - 3 * H),
        Segment(200, 300, T0 - 2 * H, 1000, T0 - 3 * H // 2),
    )
    th = resolve({"global": {"consumed.retention.ms": H, "forced.retention.ms": 2 * H, "dry.run": False}}, "orders")
    rec = ActionRecord("d", "delete_records", "orders", 0, "consumed_retention", True, T0 - 1000, status, 100)
    c = Case(PartitionView("orders", 0, segs, None, 0, 100, 1), 1, 100, th, None, (rec,))
    gate = {"open": False, "why": "rebuilding", "since": T0}
    check([c], gate)
    assert ranked([c], gate)[0] == [figures]
