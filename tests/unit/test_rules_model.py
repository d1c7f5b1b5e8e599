"""The rules (policy/rules.py) are written once, over arrays; here they are checked against a model written from
docs/contract.md ("Decisions") one partition at a time, in plain Python, on generated partitions: what is decided,
when time next makes something due, and what each retention frees. A chunk is also planned as each of its rows alone
would be (`plan_partition`, a chunk of one), and its metrics as each row's alone (`partition_stats`, a chunk of one,
the tombstones' erasure deadline included): no row's segments reach into another's."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.policy.arrays import NONE
from compactd.policy.forecast import partition_stats, stats_rows
from compactd.policy.plan import plan_partition, plans
from compactd.policy.rules import Evaluation, Limits
from compactd.policy.thresholds import Thresholds
from tests.support.examples import examples, seeds
from tests.support.partition_cases import T0, Case, H, cases, make_case, numbers, view_of


def model(c: Case, now: int) -> dict[str, Any]:
    """The contract's rules for one partition, read literally."""
    v, th = c.view, c.th
    live = sorted(s for s in v.segments if s.end_offset > v.log_start)  # on disk: not wholly below the log start
    cleaned = -1 if v.cleaned_up_to is None else v.cleaned_up_to
    earliest = min((s.first_batch_max_ts for s in live if s.end_offset > cleaned), default=None)

    def prefix(ms: int, limit: int | None) -> int | None:
        """deleteRecords frees a prefix: the oldest segments, each old enough, read (limit), with no offsets unknown
        before it; the first that fails stops it, and the prefix ends at its base at the latest (segments overlap
        where two replicas' logs were reported: what one of them holds back is held back)."""
        end, reach = None, v.log_start
        for s in live:
            if s.base_offset > reach or (limit is not None and s.end_offset > limit) or now - s.closed_at <= ms:
                end = None if end is None else min(end, s.base_offset)
                break
            end, reach = s.end_offset, max(reach, s.end_offset)
        return end

    # under compaction.service the lag bounds the view's horizon, and Kafka's cleaner is never nudged (issue 64)
    lag = None if th.compaction_service else th.max_compaction_lag_ms
    cms, fms = th.consumed_retention_ms, th.forced_retention_ms
    consumed = None if cms is None or v.min_committed is None else prefix(cms, v.min_committed)
    forced = None if fms is None else prefix(fms, None)
    decided: list[tuple[Any, ...]] = []
    if lag is not None and earliest is not None and now - lag - earliest > 0:
        decided.append(("compact", "max_compaction_lag", now - lag - earliest))
    if forced is not None and (consumed is None or forced > consumed):
        before, reason = forced, "forced_retention"
    else:
        before, reason = consumed, "consumed_retention"
    if before is not None and before > v.log_start:
        decided.append(("delete_records", reason, before))
    crossings = []
    if lag is not None and earliest is not None and earliest + lag + 1 > now:
        crossings.append(("max_compaction_lag", earliest + lag + 1))
    for rule, ms, segs in (
        (
            "consumed_retention",
            cms,
            [s for s in live if v.min_committed is not None and s.end_offset <= v.min_committed],
        ),
        ("forced_retention", fms, live),
    ):
        future = [s.closed_at + ms + 1 for s in segs if ms is not None and s.closed_at + ms + 1 > now]
        if future:
            crossings.append((rule, min(future)))

    def frees(end: int | None) -> tuple[int, int]:
        if end is None or end <= v.log_start:
            return 0, 0
        return end - v.log_start, sum(s.size_bytes for s in live if s.end_offset <= end)

    # when the tombstones held now are gone: the clean part (still above the log start) by its clean's time +
    # delete.retention.ms + the lag, the dirty part by its first pass (earliest + lag) + delete.retention.ms + the lag
    gone = []
    if lag is not None and v.cleaned_at is not None and cleaned > v.log_start:
        gone.append(v.cleaned_at + th.delete_retention_ms + lag)
    if lag is not None and earliest is not None:
        gone.append(earliest + lag + th.delete_retention_ms + lag)
    return {
        "decided": decided,
        "crossings": tuple(crossings),
        "deadline": min((t for _, t in crossings), default=None),
        "frees": (*frees(consumed), *frees(forced)),
        "earliest": earliest,
        "erasure": max(gone, default=None),
    }


def held_at_log_start(c: Case) -> bool:
    """The first live segment is let go, yet the one after it overlaps it (another replica's report) and holds the
    prefix back at its base, at or below the log start: the one way a row `quiet` finds busy decides nothing."""
    live = sorted(s for s in c.view.segments if s.end_offset > c.view.log_start)
    return any(b.base_offset < a.end_offset and b.base_offset <= c.view.log_start for a, b in itertools.pairwise(live))


def check(cs: list[Case], now: int) -> int:
    """The chunk's evaluation against the model on every row, and its plans against each row's alone; returns how
    many rows were quiet."""
    nums = numbers(cs)
    limits = Limits.of(len(cs), (Thresholds(), False), {i: (c.th, False) for i, c in enumerate(cs)})
    ev = Evaluation.of(nums, limits, now)
    rows = list(range(len(cs)))
    stats = stats_rows(rows, nums, limits, ev.q, ev.d)
    quiet_stats = stats_rows([i for i in rows if ev.q.quiet[i]], nums, limits, ev.q)
    for i, c in enumerate(cs):
        assert view_of(nums, "orders", i) == c.view
        m = model(c, now)
        got = [
            (d.action, d.reason, d.delay_ms if d.action == "compact" else d.before_offset)
            for d in ev.decisions("orders", [i])[0]
        ]
        assert got == m["decided"], (i, c)
        if ev.q.quiet[i]:
            assert m["decided"] == [], (i, c)
        elif m["decided"] == []:  # `quiet` reads the first live segment only: busy, `due` decided nothing
            assert held_at_log_start(c), (i, c)
        assert (None if ev.q.deadline[i] == NONE else int(ev.q.deadline[i])) == m["deadline"], (i, c)
        st_ = stats[i]
        assert st_.next_at == m["crossings"] and st_.earliest_ts == m["earliest"], (i, c)
        assert (st_.consumed_offsets, st_.consumed_bytes, st_.forced_offsets, st_.forced_bytes) == m["frees"], (i, c)
        assert st_.erasure_at == m["erasure"], (i, c)
        assert partition_stats(c.view, c.th, now) == st_, (i, c)  # a row of a chunk is the partition alone
        if ev.q.quiet[i]:  # a quiet row's metrics need no decision: it frees nothing
            assert quiet_stats.pop(0) == st_
    records = {c.view.partition: list(c.records) for c in cs}
    caps = {i: c.view.log_start + cap for i, c in enumerate(cs) if (cap := (0, 120, None)[i % 3]) is not None}
    for allowed in (True, False):
        chunk = plans("orders", ev, rows, lambda row: cs[row].th, records, allowed, caps)
        for i, c in enumerate(cs):
            alone = plan_partition(c.view, c.th, list(c.records), now, allowed, None, caps.get(i))
            assert chunk[i] == alone, (i, c)
    return int(ev.q.quiet.sum())


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data(), size=st.integers(1, 8), shift=st.sampled_from([0, 1, -1, H, -H, 3 * H]))
def test_the_rules_decide_as_the_contract_says(data: st.DataObject, size: int, shift: int) -> None:
    check([data.draw(cases(n)) for n in range(size)], T0 + shift)


@pytest.mark.parametrize("seed", seeds(4))
def test_a_large_chunk_has_quiet_and_busy_rows_and_every_one_is_decided_as_the_contract_says(seed: int) -> None:
    """One chunk of 3,000 partitions (what the controller evaluates at once): both kinds of rows occur, so neither
    side is vacuous, and segment-less rows sit between the others."""
    rng = random.Random(seed)
    quiet_rows = check([make_case(rng.choice, n) for n in range(3000)], T0)
    assert 300 < quiet_rows < 2700


def test_an_excluded_row_decides_nothing_and_has_no_deadline() -> None:
    rng = random.Random(7)
    cs = [make_case(rng.choice, n) for n in range(200)]
    nums = numbers(cs)
    limits = Limits.of(len(cs), (Thresholds(), True), {i: (c.th, True) for i, c in enumerate(cs)})
    ev = Evaluation.of(nums, limits, T0)
    found = plans("orders", ev, list(range(len(cs))), lambda row: cs[row].th, {}, True)
    assert any(ev.decisions("orders", list(range(len(cs)))))  # there was something to decide
    assert all(p.enqueue == () and p.deadline is None for p in found)
