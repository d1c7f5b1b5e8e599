"""The controller plans most partitions over arrays (`policy.bulk.quiet`) and the rest one by one (`plan_partition`):
on every generated partition the arrays must say "nothing due" exactly when the rules decide nothing, and give such a
partition the deadline, compaction-due time and metrics the per-partition plan gives it. The rows with something due
or with action records are planned from the arrays too (`bulk.due`, `bulk.plans`): the same plan and metrics."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.policy.bulk import NONE, Limits, due, plans, quiet
from compactd.policy.forecast import partition_stats
from compactd.policy.plan import plan_partition
from compactd.policy.rules import decide
from compactd.policy.thresholds import Thresholds
from tests.support.examples import examples
from tests.support.partition_cases import T0, Case, H, cases, make_case, numbers


def none(value: int) -> int | None:
    return None if value == NONE else value


def check(cs: list[Case], now: int) -> int:
    """Compare the arrays with the per-partition plan on every row; returns how many rows were quiet."""
    nums = numbers(cs)
    limits = Limits.of(len(cs), (Thresholds(), False), {i: (c.th, False) for i, c in enumerate(cs)})
    q = quiet(nums, limits, now)
    quiet_rows = [i for i in range(len(cs)) if q.quiet[i]]
    stats = dict(zip(quiet_rows, q.stats_rows(quiet_rows, nums, limits), strict=True))
    for i, c in enumerate(cs):
        assert nums.view("orders", i) == c.view
        plan = plan_partition(c.view, c.th, [], now, True)
        assert bool(q.quiet[i]) == (decide(c.view, c.th, now) == []), (i, c)
        assert none(int(q.compaction_due[i])) == plan.compaction_due, (i, c)
        if q.quiet[i]:
            assert plan.enqueue == () and plan.dropped == () and plan.answered == ()
            assert none(int(q.deadline[i])) == plan.deadline, (i, c)
            assert stats[i] == partition_stats(c.view, c.th, now), (i, c)
    # every row planned over arrays, with its records, a compacted view's cap on some: the per-partition plan
    d = due(nums, limits, q, now)
    rows = list(range(len(cs)))
    records = {c.view.partition: list(c.records) for c in cs}
    caps = {i: c.view.log_start + cap for i, c in enumerate(cs) if (cap := (0, 120, None)[i % 3]) is not None}
    all_stats = q.stats_rows(rows, nums, limits, d)
    for allowed in (True, False):
        by_array = plans("orders", nums, q, d, rows, lambda row: cs[row].th, records, now, allowed, caps)
        for i, c in enumerate(cs):
            reference = plan_partition(c.view, c.th, list(c.records), now, allowed, None, caps.get(i))
            assert by_array[i] == reference, (i, c)
    for i, c in enumerate(cs):
        assert all_stats[i] == partition_stats(c.view, c.th, now), (i, c)
    return len(quiet_rows)


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data(), size=st.integers(1, 8), shift=st.sampled_from([0, 1, -1, H, -H, 3 * H]))
def test_quiet_rows_plan_as_the_rules_do(data: st.DataObject, size: int, shift: int) -> None:
    cs = [data.draw(cases(n)) for n in range(size)]
    check(cs, T0 + shift)


@pytest.mark.parametrize("seed", range(3))
def test_a_large_chunk_has_quiet_and_busy_rows_and_every_one_agrees(seed: int) -> None:
    """One chunk of 3,000 partitions (what the controller evaluates at once): both kinds of rows occur, so neither
    side of the comparison is vacuous, and segment-less rows sit between the others."""
    rng = random.Random(seed)
    cs = [make_case(rng.choice, n) for n in range(3000)]
    quiet_rows = check(cs, T0)
    assert 300 < quiet_rows < 2700
