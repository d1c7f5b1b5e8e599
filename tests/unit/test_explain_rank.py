"""`compactd explain TOPIC` ranks every partition over arrays and explains only the worst. An explanation reads its
`worst` figures from the same arrays (its row of `rule_facts`); what is checked here is that those figures are what
its text shows: how overdue the compaction rule says it is, and the spans its retention rules show as held back or
blocked, whatever the partition, its thresholds and records."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.explain.model import GroupsHere, explain_partition, threshold_sources, worst_first
from compactd.explain.rank import Deletes, worst_figures, worst_order
from compactd.model import ActionRecord, PartitionView, Segment
from compactd.policy.rules import Evaluation, Limits
from compactd.policy.thresholds import Thresholds, resolve
from tests.support.examples import examples
from tests.support.partition_cases import T0, Case, H, cases, make_case, numbers


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
    ev = Evaluation.of(nums, limits, T0)
    figures = worst_figures(ev, ev.insight(), deletes, gate_closed)
    order = worst_order(ev, deletes, gate_closed)
    return [tuple(int(a[i]) for a in figures) for i in range(len(cs))], [int(nums.partitions[i]) for i in order]


def shown(e: dict[str, Any]) -> tuple[int, int, int]:
    """The figures as the text shows them: the compaction's delay past the lag, and per retention what it holds back
    plus what it frees where the rule is blocked (the larger of the two retentions)."""
    lag = e["rules"]["max_compaction_lag"]
    overdue = max(lag["now"].get("delay_ms") or 0, 0)
    by_rule = []
    for name in ("consumed_retention", "forced_retention"):
        r = e["rules"][name]
        spans = [s for s in (r["held_back"], r["frees"] if r["state"] == "blocked" else None) if s]
        by_rule.append((sum(s["bytes"] for s in spans), sum(s["offsets"] for s in spans)))
    return overdue, max(b for b, _ in by_rule), max(o for _, o in by_rule)


GATES = st.sampled_from([None, {"open": True, "why": "", "since": T0 - H}, {"open": False, "why": "x", "since": T0}])


def check(cs: list[Case], gate: dict[str, Any] | None) -> None:
    es = [explained(c, gate) for c in cs]
    figures, order = ranked(cs, gate)
    for c, e, got in zip(cs, es, figures, strict=True):
        w = e["worst"]
        assert got == (w["overdue_ms"], w["blocked_bytes"], w["blocked_offsets"]) == shown(e), (c, e["rules"])
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
    ev = Evaluation.of(nums, limits, T0)
    overdue, _, _ = worst_figures(ev, ev.insight(), Deletes.of(3, {}, T0), False)
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
