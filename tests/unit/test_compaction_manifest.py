"""The compaction service's pure rules: what a run covers, what is garbage, how far the source may be deleted, when
a run is due, and the delete cap in the partition plan."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from compactd.compaction.manifest import (
    Gap,
    Manifest,
    Previous,
    ViewPartition,
    delta_partitions,
    epoch_moved,
    find_gaps,
    garbage_below,
    plan_ranges,
    rebuild_cut,
    retention_cap,
    run_due,
    source_changed,
    written_again,
    written_again_line,
)
from compactd.compaction.strategy import Strategy
from compactd.model import PartitionView as StateView
from compactd.model import Segment
from compactd.policy.plan import plan_partition, send_check
from compactd.policy.thresholds import Thresholds

NOW = 1_000_000_000


def manifest(horizons: dict[int, int], generation: int = 1, previous: Previous | None = None, **kw) -> Manifest:
    parts = {str(p): ViewPartition(h, 10 * p, 10 * p + 5, beyond_since=NOW - 1000) for p, h in horizons.items()}
    return Manifest("t", "t.compacted", generation, partitions=parts, previous=previous, **kw)


def test_manifest_round_trips_through_json() -> None:
    m = manifest({0: 5, 1: 7}, previous=Previous(1, NOW, {"0": 3}), records_in=9, bytes_in=90)
    assert Manifest.loads(m.dumps()) == m
    assert Manifest.from_json({**m.to_json(), "future_field": 1}) == m  # a newer writer's extra fields are ignored


def test_first_run_reads_the_source_from_its_start_and_stops_at_the_young_records() -> None:
    plan = plan_ranges(None, {0: 3, 1: 0}, {0: 100, 1: 50}, {0: 60})
    assert [(r.partition, r.source_start, r.horizon, r.view_end - r.view_start) for r in plan] == [
        (0, 3, 60, 0),
        (1, 0, 50, 0),
    ]


def test_incremental_run_reads_the_previous_view_and_the_delta_and_never_moves_back() -> None:
    prev = manifest({0: 40, 1: 50})
    plan = plan_ranges(prev, {0: 0, 1: 0}, {0: 100, 1: 50}, {0: 20})
    r0, r1 = plan
    assert (r0.view_start, r0.view_end, r0.source_start, r0.horizon) == (0, 5, 40, 40)  # young from 20 < 40: stays
    assert (r1.view_start, r1.view_end, r1.source_start, r1.horizon) == (10, 15, 50, 50)


def test_a_delta_is_appended_only_to_a_contiguous_generation_of_the_same_rule_not_yet_too_dirty() -> None:
    """What decides between appending a delta and rewriting: the pure rule, partition by partition."""
    day = 86_400_000
    parts = {
        "0": ViewPartition(40, 0, 100, records=100, base_end=100, base_at=NOW),  # clean
        "1": ViewPartition(40, 0, 100, records=100, base_end=60, base_at=NOW),  # 40 % appended
        "2": ViewPartition(40, 0, 100, records=100, tombstones=3, base_end=100, base_at=NOW - day),  # stale deletes
        "3": ViewPartition(40, 0, 100, records=100, base_end=100, base_at=NOW),  # someone wrote above it
        "4": ViewPartition(40, 0, 100, records=100, tombstones=3, base_end=100, base_at=NOW - day + 1),
    }
    m = Manifest("t", "t.compacted", 3, partitions=parts)
    high = {0: 100, 1: 100, 2: 100, 3: 104, 4: 100}
    assert delta_partitions(m, Strategy(), high, NOW, day, 0.5) == {0, 1, 4}
    assert delta_partitions(m, Strategy(), high, NOW, day, 0.4) == {0, 4}  # 40 % is a ratio of 0.4 reached
    assert delta_partitions(m, Strategy(), high, NOW, day, 0) == set()  # every run rewrites
    assert delta_partitions(m, Strategy("timestamp"), high, NOW, day, 0.5) == set()  # another rule: rewrite
    latest = Strategy.of("header", "v", tombstone="latest")  # does not merge winners: always rewrites
    assert delta_partitions(replace(m, strategy="header", strategy_header="v", strategy_tombstone="latest"),
                            latest, high, NOW, day, 0.5) == set()  # fmt: skip
    assert delta_partitions(None, Strategy(), high, NOW, day, 0.5) == set()
    assert delta_partitions(replace(m, generation=0), Strategy(), high, NOW, day, 0.5) == set()
    empty = replace(m, partitions={"0": ViewPartition(0, 7, 7, base_end=7, base_at=NOW)})
    assert delta_partitions(empty, Strategy(), {0: 7}, NOW, day, 0.5) == set()  # nothing to append to


def test_a_manifest_from_before_delta_runs_reads_as_full_rewrites() -> None:
    old = {
        "topic": "t",
        "view": "v",
        "generation": 2,
        "partitions": {"0": {"horizon": 9, "view_start": 3, "view_end": 8}},
    }
    m = Manifest.from_json(old)
    assert m.partitions["0"].base == 8 and m.appended == ()
    assert delta_partitions(m, Strategy(), {0: 8}, NOW, 1000, 0.5) == {0}  # no tombstones: nothing stale
    tomb = replace(m, partitions={"0": replace(m.partitions["0"], tombstones=1)})
    assert delta_partitions(tomb, Strategy(), {0: 8}, NOW, 1000, 0.5) == set()  # their clock is unknown: rewrite


def test_garbage_waits_for_the_grace_of_the_previous_generation() -> None:
    m = manifest({0: 5}, generation=2, previous=Previous(1, NOW, {"0": 3}))
    assert garbage_below(m, NOW + 999, 1000) == {}
    assert garbage_below(m, NOW + 1000, 1000) == {0: 0}
    assert garbage_below(manifest({0: 5}, generation=0), NOW, 0) == {}


@given(
    horizon=st.integers(0, 1000),
    prev=st.one_of(st.none(), st.integers(0, 1000)),
    age=st.integers(0, 5000),
    grace=st.integers(0, 3000),
    service=st.booleans(),
)
def test_retention_cap_never_passes_a_readable_generations_horizon(
    horizon: int, prev: int | None, age: int, grace: int, service: bool
) -> None:
    previous = None if prev is None else Previous(1, NOW, {"0": prev})
    m = manifest({0: horizon}, generation=2, previous=previous)
    cap = retention_cap(m, service, 0, NOW + age, grace)
    assert cap is not None and cap <= horizon
    if prev is not None and age < grace:
        assert cap <= prev
    assert retention_cap(None, True, 0, NOW, grace) == 0  # on, nothing published: nothing may go
    assert retention_cap(None, False, 0, NOW, grace) is None
    assert retention_cap(manifest({0: 9}, generation=0), True, 0, NOW, grace) == 0


def test_run_due_by_first_generation_bytes_and_lag() -> None:
    assert run_due(None, {0: 10}, NOW, None, None).due
    assert not run_due(None, {0: 0}, NOW, None, None).due
    m = manifest({0: 100}, records_in=100, bytes_in=10_000)  # 100 bytes per record
    assert not run_due(m, {0: 100}, NOW, 1, 1).due  # nothing beyond the horizon
    assert run_due(m, {0: 110}, NOW, 1000, None).due  # 10 records ≈ 1000 bytes
    assert not run_due(m, {0: 109}, NOW, 1000, None).due
    assert run_due(m, {0: 109}, NOW, 1000, None, beyond_bytes=5000).due  # segment events know better
    lag = run_due(m, {0: 101}, NOW, None, 1000)
    assert lag.due and "max.compaction.lag.ms" in lag.why and lag.beyond_age_ms == 1000
    assert not run_due(m, {0: 101}, NOW, None, 1001).due
    assert run_due(m, {0: 100, 1: 5}, NOW, None, None).due  # a partition without a view


def test_run_due_before_the_sources_retention_reaches_the_horizon() -> None:
    m = manifest({0: 100}, records_in=100, bytes_in=10_000)  # records beyond the horizon for 1000 ms
    early = run_due(m, {0: 101}, NOW, None, None, retention_ms=2001)
    assert not early.due and early.retention_left_ms == 1001
    half = run_due(m, {0: 101}, NOW, None, None, retention_ms=2000)
    assert half.due and "retention.ms" in half.why and half.retention_left_ms == 1000
    assert run_due(m, {0: 101}, NOW, None, None).retention_left_ms is None  # no time retention: no deadline
    assert run_due(m, {0: 100}, NOW, None, None, retention_ms=5000).retention_left_ms == 5000  # nothing beyond


def test_a_gap_is_what_the_source_lost_past_the_published_horizon() -> None:
    m = manifest({0: 100, 1: 50})
    assert find_gaps(m, {0: 100, 1: 0}) == []  # retention up to the horizon: nothing lost
    assert find_gaps(m, {0: 150, 1: 51}) == [Gap(0, 100, 150), Gap(1, 50, 51)]
    assert find_gaps(manifest({0: 100}, generation=0), {0: 500}) == []  # nothing published: nothing to lose
    assert find_gaps(None, {0: 500}) == []


def test_a_source_that_is_another_log_is_told_apart() -> None:
    m = manifest({0: 100, 1: 50}, source_id="A")
    parts = {str(p): ViewPartition(h, 0, 5, source_low=10) for p, h in ((0, 100), (1, 50))}
    low = replace(m, partitions=parts)
    same = source_changed(m, 2, {0: 0, 1: 0}, {0: 100, 1: 80}, "A")
    assert same is None and source_changed(m, 3, {0: 0, 1: 0}, {0: 100, 1: 80}, None) is None  # grown: same log
    assert "topic ID A is now B" in str(source_changed(m, 2, {}, {0: 100, 1: 80}, "B"))
    assert "1 partitions" in str(source_changed(m, 1, {}, {0: 100}, "A"))
    assert "ends at 40, below the horizon 50" in str(source_changed(m, 2, {}, {0: 100, 1: 40}, None))
    assert "starts at 0, below its log start 10" in str(source_changed(low, 2, {0: 0}, {0: 100, 1: 50}, None))
    # a broker killed before it checkpointed a deleteRecords' log start comes back with the older one: same ID, same
    # log (the ID is the evidence; without one the log start is all there is)
    assert source_changed(low, 2, {0: 0, 1: 10}, {0: 100, 1: 50}, "A") is None
    assert "starts at 0" in str(source_changed(replace(low, source_id=None), 2, {0: 0}, {0: 100, 1: 50}, "A"))
    assert source_changed(replace(m, generation=0), 1, {}, {}, "B") is None


def view_with(log_start: int = 0) -> StateView:
    seg = Segment(0, 500, NOW - 10_000_000, 1, NOW - 10_000_000)
    return StateView("t", 0, segments=(seg,), log_start=log_start, cleaned_up_to=0)


def test_plan_caps_a_delete_at_the_view_horizon_and_send_check_holds_it() -> None:
    th = Thresholds.model_validate({"forced.retention.ms": 0, "dry.run": False})
    free = plan_partition(view_with(), th, [], NOW, True)
    assert [r.before_offset for r in free.enqueue] == [500]
    capped = plan_partition(view_with(), th, [], NOW, True, view_cap=120)
    assert [r.before_offset for r in capped.enqueue] == [120]
    assert plan_partition(view_with(120), th, [], NOW, True, view_cap=120).enqueue == ()  # nothing beyond the start
    assert plan_partition(view_with(), th, [], NOW, True, view_cap=0).enqueue == ()
    rec = free.enqueue[0]
    assert send_check(rec, view_with(), th, NOW, None, view_cap=120) is not None
    assert send_check(capped.enqueue[0], view_with(), th, NOW, None, view_cap=120) is None


def _epoch_manifest(epoch: int, horizon: int = 100) -> Manifest:
    pv = ViewPartition(horizon=horizon, view_start=0, view_end=10, epoch=epoch)
    return Manifest(topic="t", view="t.compacted", generation=3, partitions={"0": pv, "1": replace(pv, epoch=-1)})


def test_only_a_partition_whose_leader_epoch_moved_since_the_view_read_it_is_looked_into() -> None:
    m = _epoch_manifest(4)
    assert epoch_moved(m, {0: 4, 1: 9}) == []  # no leader since; partition 1's epoch was never known
    assert epoch_moved(m, {0: 5, 1: 9}) == [0]
    assert epoch_moved(_epoch_manifest(4, horizon=0), {0: 5}) == []  # nothing below the horizon to rewrite
    assert epoch_moved(replace(m, generation=0), {0: 5}) == []


def test_a_record_below_the_horizon_of_a_later_epoch_means_the_log_was_written_again() -> None:
    pv = _epoch_manifest(4).partitions["0"]
    assert written_again(pv, (99, 5))
    assert not written_again(pv, (99, 4))  # a clean election: the records below the high watermark stay
    assert not written_again(pv, None)  # nothing below the horizon any more
    assert not written_again(pv, (99, -1))  # a record without an epoch cannot say
    assert not written_again(replace(pv, epoch=-1), (99, 7))  # a manifest from before epochs were kept
    line = written_again_line(_epoch_manifest(4), {0: 99})
    assert "partition 0" in line and "offset 99" in line and "horizon 100" in line and "after 4" in line


def test_the_view_is_kept_below_the_log_start_or_where_the_log_was_written_again_whichever_is_lower() -> None:
    assert rebuild_cut(20, 50, False) == 20
    assert rebuild_cut(60, 50, False) == 50  # the source lost [50, 60) of the new log: the view's are of the old one
    assert rebuild_cut(20, 20, True) is None  # no record of the old epoch left: where it was cut is unknown


def test_a_partition_written_again_is_read_from_the_source_log_start_and_never_appended() -> None:
    m = _epoch_manifest(4)
    plan = plan_ranges(m, {0: 20, 1: 0}, {0: 110, 1: 120}, {}, frozenset({0, 1}), {0: 20})
    by = {r.partition: r for r in plan}
    assert (by[0].source_start, by[0].horizon, by[0].append, by[0].view_below) == (20, 110, False, 20)
    assert (by[1].source_start, by[1].append, by[1].view_below) == (100, True, -1)
