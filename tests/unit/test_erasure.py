"""When a partition's tombstones are gone (policy/rules.py `erasure`): KIP-534's two cleaner passes, the second one
bounded by max.compaction.lag.ms only because compactd makes the clean due once records keep arriving."""

from __future__ import annotations

import dataclasses

import numpy as np

from compactd.model import PartitionNumbers, PartitionView, ReplicaState, Segment
from compactd.policy.arrays import NONE
from compactd.policy.rules import Evaluation, Limits, value
from compactd.policy.thresholds import Thresholds

S = 1000
T0 = 1_800_000_000_000
LAG, KEEP = 12 * S, 3 * S  # max.compaction.lag.ms, delete.retention.ms


def th(**extra: object) -> Thresholds:
    return Thresholds.model_validate({"max.compaction.lag.ms": LAG, "delete.retention.ms": KEEP, **extra})


def view(cleaned: int | None = 100, cleaned_at: int | None = T0, dirty_at: int | None = None, log_start: int = 0):
    """Offsets [0, 100) cleaned (the clean seen at `cleaned_at`), where `cleaned`; a dirty segment [100, 150) whose
    first batch is from `dirty_at`, where given."""
    segs = [] if cleaned is None else [Segment(0, 100, T0 - 60 * S, 10, T0 - 50 * S)]
    if dirty_at is not None:
        segs.append(Segment(100, 150, dirty_at, 10, dirty_at + S))
    return PartitionView("orders", 0, tuple(segs), cleaned, log_start, None, 0, cleaned_at)


def deadline(v: PartitionView, t: Thresholds | None = None, now: int = T0) -> dict[str, int | None]:
    er = Evaluation.one(v, t or th(), now).erasure()
    parts = ("removable_after", "clean_by", "first_pass", "dirty_by", "by")
    return {name: value(getattr(er, name), 0) for name in parts}


def test_cleaned_tombstones_are_removable_after_delete_retention_and_gone_by_the_next_clean_the_lag_bounds() -> None:
    assert deadline(view()) == {
        "removable_after": T0 + KEEP,  # the delete horizon the clean at T0 set, at the latest
        "clean_by": T0 + KEEP + LAG,  # the next clean, made due by compactd if records keep arriving
        "first_pass": None,
        "dirty_by": None,
        "by": T0 + KEEP + LAG,
    }


def test_dirty_tombstones_need_their_first_pass_then_delete_retention_then_the_next_clean() -> None:
    d = deadline(view(cleaned=None, cleaned_at=None, dirty_at=T0 - 5 * S))
    assert (d["first_pass"], d["dirty_by"], d["by"]) == (T0 - 5 * S + LAG, T0 - 5 * S + LAG + KEEP + LAG, d["dirty_by"])
    assert d["removable_after"] is None and d["clean_by"] is None


def test_the_deadline_is_the_later_of_the_clean_and_the_dirty_part() -> None:
    recent_clean = deadline(view(cleaned_at=T0, dirty_at=T0 - 30 * S))  # a dirty record older than the clean
    assert recent_clean["by"] == recent_clean["clean_by"] == T0 + KEEP + LAG
    fresh_dirt = deadline(view(cleaned_at=T0 - 30 * S, dirty_at=T0))
    assert fresh_dirt["by"] == fresh_dirt["dirty_by"] == T0 + LAG + KEEP + LAG


def test_no_deadline_without_a_lag_or_without_anything_cleaned_or_dirty() -> None:
    assert deadline(view(), Thresholds.model_validate({"delete.retention.ms": KEEP}))["by"] is None
    assert deadline(view(cleaned=None, cleaned_at=None))["by"] is None  # never cleaned, nothing dirty
    assert deadline(PartitionView("orders", 0))["by"] is None


def test_a_clean_whose_time_is_unknown_bounds_nothing_and_the_dirty_part_still_does() -> None:
    assert deadline(view(cleaned_at=None))["by"] is None
    assert deadline(view(cleaned_at=None, dirty_at=T0))["by"] == T0 + LAG + KEEP + LAG


def test_a_clean_part_wholly_below_the_log_start_holds_no_tombstones() -> None:
    assert deadline(view(log_start=100))["by"] is None  # retention deleted everything the clean saw
    assert deadline(view(log_start=99))["by"] == T0 + KEEP + LAG


def test_the_deadline_is_a_time_that_does_not_move_with_now() -> None:
    # past it, the deadline stays where it was: the gauge (deadline - now) goes negative, overdue
    assert deadline(view(), now=T0 + 3600 * S)["by"] == deadline(view(), now=T0)["by"]


def test_each_row_takes_its_own_delete_retention_and_lag() -> None:
    """A chunk's rows each with their partition scope: the delete.retention.ms and lag of their own scope."""
    views = [view(), view(), view()]
    nums = PartitionNumbers.of_views(views)
    scoped = {1: (th(**{"delete.retention.ms": 10 * S}), False), 2: (th(**{"max.compaction.lag.ms": S}), False)}
    er = Evaluation.of(nums, Limits.of(3, (th(), False), scoped), T0).erasure()
    assert er.by.tolist() == [T0 + KEEP + LAG, T0 + 10 * S + LAG, T0 + KEEP + S]
    assert np.all(er.first_pass == NONE)


def replicas(v: PartitionView, *logs: ReplicaState) -> PartitionView:
    return dataclasses.replace(v, replicas=logs)


def bounds(v: PartitionView, now: int = T0) -> tuple[int | None, int | None, list[int | None], int | None, int | None]:
    """(by, first_by, each replica's bound, slowest, soonest) of one partition."""
    e = Evaluation.one(v, th(), now).erasure()
    each = [None if b == NONE else b for b in e.replica_by.tolist()]
    return value(e.by, 0), value(e.first_by, 0), each, value(e.slowest, 0), value(e.soonest, 0)


def test_a_follower_whose_cleaner_is_behind_is_late_first_and_one_that_cleaned_later_is_the_last() -> None:
    """KIP-534 per replica: a tombstone is gone from the cluster once every replica's cleaner removed it. A follower
    that never cleaned holds every tombstone of the live log: its first pass was due by the oldest record + lag, long
    past here (late), while the leader's bound is ahead; the metric's deadline is the earliest (`first_by`)."""
    v = view(dirty_at=T0 - 5 * S)  # the leader: [0, 100) cleaned at T0, [100, 150) dirty
    leader = deadline(v)["by"]
    assert leader == T0 - 5 * S + LAG + KEEP + LAG  # its dirty part is the later
    oldest = T0 - 60 * S  # replica 2 cleaned nothing: its dirty part starts at the first segment
    never = oldest + LAG + KEEP + LAG
    by, first_by, each, slowest, soonest = bounds(replicas(v, ReplicaState(1, 100, T0, reported=True),
                                                           ReplicaState(2, reported=True)))  # fmt: skip
    assert (by, first_by, each, slowest, soonest) == (leader, never, [leader, never], None, 2)
    # a follower that cleaned later than the leader: its own clean's horizon is the last copy's
    later = replicas(v, ReplicaState(1, 100, T0, reported=True), ReplicaState(3, 100, T0 + 60 * S, reported=True))
    assert bounds(later)[0::3] == (T0 + 60 * S + KEEP + LAG, 3)
    assert bounds(later)[1] == leader  # nothing earlier than the leader's own


def test_a_replica_no_agent_reported_is_unknown_and_left_out() -> None:
    v = view(dirty_at=T0 - 5 * S)
    assert bounds(replicas(v, ReplicaState(1, 100, T0, reported=True), ReplicaState(2))) == (
        deadline(v)["by"],
        deadline(v)["by"],
        [deadline(v)["by"], None],
        None,
        None,
    )


def test_a_chunks_replica_rows_stay_with_their_partitions() -> None:
    """Rows evaluated together (and concatenated chunks) keep each replica with its own partition."""
    behind = replicas(view(), ReplicaState(2, reported=True))  # never cleaned: its bound is the oldest record's
    plain = view()
    nums = PartitionNumbers.concat([PartitionNumbers.of_views([plain]), PartitionNumbers.of_views([plain, behind])])
    assert nums.replicas.tolist() == [[2, 2, -1, -1, 1]]
    er = Evaluation.of(nums, Limits.of(3, (th(), False), {}), T0).erasure()
    assert er.by.tolist() == [T0 + KEEP + LAG] * 3
    assert er.first_by.tolist() == [T0 + KEEP + LAG, T0 + KEEP + LAG, T0 - 60 * S + 2 * LAG + KEEP]
    assert (er.slowest.tolist(), er.soonest.tolist()) == ([NONE] * 3, [NONE, NONE, 2])


def test_taking_rows_keeps_each_rows_segments_in_any_order_and_repeated() -> None:
    """`PartitionNumbers.take`, which gives every replica row its partition's segments, is the same as evaluating
    those partitions' views in that order."""
    views = [view(), view(cleaned=None, cleaned_at=None), view(dirty_at=T0, log_start=5), PartitionView("orders", 9)]
    views = [dataclasses.replace(v, partition=i) for i, v in enumerate(views)]
    rows = [2, 0, 3, 2, 1]
    taken = PartitionNumbers.of_views(views).take(np.array(rows))
    expected = PartitionNumbers.of_views([views[r] for r in rows])
    for name in ("partitions", "counted", "cleaned", "log_start", "zcard", "lowest", "nseg", "segments", "cleaned_at"):
        assert getattr(taken, name).tolist() == getattr(expected, name).tolist(), name
