"""Every decision rule, with its boundaries. Pure: no Spark, Redis or Kafka."""

from __future__ import annotations

import pytest

from compactd.model import ActionRecord, Decision, PartitionView, Segment
from compactd.policy.arrays import NONE
from compactd.policy.plan import plan_partition
from compactd.policy.rules import (
    Evaluation,
    answered_at,
    decide,
    decide_compaction,
    decide_deletion,
    earliest_uncompacted_ts,
    should_record,
)
from compactd.policy.thresholds import ConfigError, Thresholds, group_counts, resolve, validate_layer

NOW = 1_763_800_000_000
H = 3_600_000


def seg(base: int, end: int, fbmts: int, closed: int | None = None) -> Segment:
    return Segment(base, end, fbmts, 100, fbmts if closed is None else closed)


def view(
    *segments: Segment,
    cleaned: int | None = None,
    log_start: int = 0,
    min_committed: int | None = None,
    counted: int = 1,
) -> PartitionView:
    return PartitionView("orders", 0, tuple(segments), cleaned, log_start, min_committed, counted)


def th(**kw: object) -> Thresholds:
    return Thresholds.model_validate({k.replace("_", "."): v for k, v in kw.items()})


# ---- KIP-354 ----


def test_compaction_not_due_exactly_at_threshold_and_due_one_ms_later() -> None:
    v = view(seg(0, 10, NOW - H))
    assert Evaluation.one(v, th(max_compaction_lag_ms=H), NOW).q.compaction_due[0] == NOW  # due strictly after
    assert decide_compaction(v, th(max_compaction_lag_ms=H), NOW) is None
    d = decide_compaction(v, th(max_compaction_lag_ms=H), NOW + 1)
    assert d is not None and d.delay_ms == 1 and d.reason == "max_compaction_lag" and d.earliest_ts == NOW - H


def test_no_nudge_is_decided_for_a_topic_the_compaction_service_compacts() -> None:
    """Under compaction.service, max.compaction.lag.ms bounds the view's horizon; a nudge would make Kafka's cleaner
    remove what the next run has yet to read (issue 64, item 7)."""
    v = view(seg(0, 10, NOW - 2 * H))
    assert decide_compaction(v, th(max_compaction_lag_ms=H), NOW) is not None
    assert decide_compaction(v, th(max_compaction_lag_ms=H, compaction_service=True), NOW) is None


def test_earliest_uncompacted_skips_cleaned_and_deleted_segments() -> None:
    v = view(seg(0, 10, NOW - 5 * H), seg(10, 20, NOW - 4 * H), seg(20, 30, NOW - 3 * H), cleaned=10)
    assert earliest_uncompacted_ts(v) == NOW - 4 * H
    assert earliest_uncompacted_ts(view(*v.segments, cleaned=10, log_start=20)) == NOW - 3 * H
    assert earliest_uncompacted_ts(view(*v.segments, cleaned=30)) is None


def test_empty_partition_decides_nothing() -> None:
    full = th(max_compaction_lag_ms=1, consumed_retention_ms=0, forced_retention_ms=0)
    assert decide(view(), full, NOW) == []
    assert Evaluation.one(view(), full, NOW).q.deadline[0] == NONE  # and nothing to wake up for


def test_compaction_disabled_without_threshold() -> None:
    assert decide_compaction(view(seg(0, 10, 0)), th(), NOW) is None


# ---- KIP-68 consumed retention ----


def test_consumed_retention_deletes_prefix_below_min_committed() -> None:
    v = view(seg(0, 100, NOW - 3 * H), seg(100, 200, NOW - 2 * H), seg(200, 300, NOW - 2 * H), min_committed=250)
    d = decide_deletion(v, th(consumed_retention_ms=H), NOW)
    assert d == Decision("delete_records", "orders", 0, "consumed_retention", before_offset=200)


def test_segment_ending_exactly_at_min_committed_is_deletable() -> None:
    v = view(seg(0, 100, NOW - 3 * H), min_committed=100)
    assert decide_deletion(v, th(consumed_retention_ms=H), NOW).before_offset == 100
    assert decide_deletion(view(seg(0, 100, NOW - 3 * H), min_committed=99), th(consumed_retention_ms=H), NOW) is None


def test_consumed_retention_age_boundary_is_strict() -> None:
    v = view(seg(0, 100, NOW - H), min_committed=100)
    assert decide_deletion(v, th(consumed_retention_ms=H), NOW) is None
    assert decide_deletion(v, th(consumed_retention_ms=H), NOW + 1).before_offset == 100


def test_unknown_minimum_deletes_nothing() -> None:
    # a counted group has no commit on this partition yet: KIP-68's -1
    v = view(seg(0, 100, NOW - 9 * H), min_committed=None, counted=2)
    assert decide_deletion(v, th(consumed_retention_ms=H), NOW) is None


def test_no_groups_at_all_deletes_nothing() -> None:
    assert (
        decide_deletion(view(seg(0, 100, 0), min_committed=None, counted=0), th(consumed_retention_ms=0), NOW) is None
    )


def test_young_segment_stops_the_prefix() -> None:
    v = view(seg(0, 100, NOW - 3 * H), seg(100, 200, NOW - 1000), seg(200, 300, NOW - 3 * H), min_committed=300)
    assert decide_deletion(v, th(consumed_retention_ms=H), NOW).before_offset == 100


def test_offsets_no_segment_event_covers_stop_the_prefix() -> None:
    """A state rebuilt from a segments topic that lost events knows [0,100) and [200,300) of a log that also has
    [100,200): the unknown middle is never deleted, whatever the others' ages; so is an unknown start."""
    old = NOW - 3 * H
    gap = view(seg(0, 100, old), seg(200, 300, old), min_committed=300)
    for rule in (th(consumed_retention_ms=H), th(forced_retention_ms=H)):
        assert decide_deletion(gap, rule, NOW).before_offset == 100
        assert decide_deletion(view(seg(100, 200, old), min_committed=300), rule, NOW) is None
        # a segment the cleaner merged, listed beside the ones it replaced, leaves no gap
        merged = view(seg(0, 100, old), seg(0, 200, old), seg(100, 200, old), seg(200, 300, old), min_committed=300)
        assert decide_deletion(merged, rule, NOW).before_offset == 300
        assert (
            decide_deletion(view(seg(100, 200, old), log_start=100, min_committed=300), rule, NOW).before_offset == 200
        )


def test_a_segment_not_let_go_holds_back_an_older_report_overlapping_it() -> None:
    """Two logs of one partition reported: the old leader's [1000, 2000), closed hours ago, and the new leader's
    [1200, 1600), closed a minute ago (each broker rolls its own segments; after an unclean election the offsets
    from 1200 hold records written again). The old report alone would delete to 2000, over the new records: the
    prefix ends at the base of the segment that stopped it."""
    old, young = NOW - 3 * H, NOW - 60_000
    v = view(seg(0, 1000, old), seg(1000, 2000, old), seg(1200, 1600, young), min_committed=2000)
    for rule in (th(forced_retention_ms=H), th(consumed_retention_ms=H)):
        assert decide_deletion(v, rule, NOW).before_offset == 1200
    # once the young one is old too: up to the end of the run's last segment (by base), and the rest next time
    later = NOW + 2 * H
    assert decide_deletion(v, th(forced_retention_ms=H), later).before_offset == 1600
    assert decide_deletion(view(*v.segments, log_start=1600), th(forced_retention_ms=H), later).before_offset == 2000


def test_group_rewind_lowers_the_offset() -> None:
    segs = (seg(0, 100, NOW - 3 * H), seg(100, 200, NOW - 3 * H))
    assert decide_deletion(view(*segs, min_committed=200), th(consumed_retention_ms=H), NOW).before_offset == 200
    assert decide_deletion(view(*segs, min_committed=150), th(consumed_retention_ms=H), NOW).before_offset == 100


def test_min_committed_beyond_known_segments_never_passes_last_closed_segment() -> None:
    v = view(seg(0, 100, NOW - 3 * H), min_committed=10**12)
    assert decide_deletion(v, th(consumed_retention_ms=H), NOW).before_offset == 100


def test_nothing_to_do_when_already_below_log_start() -> None:
    v = view(seg(0, 100, NOW - 3 * H), log_start=100, min_committed=100)
    assert decide_deletion(v, th(consumed_retention_ms=H), NOW) is None


# ---- KIP-68 forced retention ----


def test_forced_retention_ignores_groups() -> None:
    v = view(seg(0, 100, NOW - 3 * H), seg(100, 200, NOW - 30 * 60_000), min_committed=None)
    d = decide_deletion(v, th(consumed_retention_ms=H, forced_retention_ms=2 * H), NOW)
    assert (d.reason, d.before_offset) == ("forced_retention", 100)


def test_consumed_wins_when_it_reaches_further() -> None:
    v = view(seg(0, 100, NOW - 3 * H), seg(100, 200, NOW - 90 * 60_000), min_committed=200)
    d = decide_deletion(v, th(consumed_retention_ms=H, forced_retention_ms=2 * H), NOW)
    assert (d.reason, d.before_offset) == ("consumed_retention", 200)


# ---- duplicates, answers, deadlines ----


def rec(
    action: str = "delete_records",
    status: str = "sent",
    before: int | None = 100,
    decided: int = NOW,
    earliest: int | None = None,
) -> ActionRecord:
    return ActionRecord(
        "id",
        action,
        "orders",
        0,
        "consumed_retention",
        False,
        decided,
        status,  # type: ignore[arg-type]
        before_offset=before,
        earliest_ts=earliest,
    )


def test_unanswered_action_is_not_repeated_before_retry_interval() -> None:
    d = Decision("delete_records", "orders", 0, "consumed_retention", before_offset=100)
    assert should_record(d, None, NOW, 1000)
    assert not should_record(d, rec(decided=NOW - 999), NOW, 1000)
    assert should_record(d, rec(decided=NOW - 1000), NOW, 1000)
    assert not should_record(d, rec(status="pending", decided=NOW - 10**9), NOW, 1000)


def test_larger_delete_supersedes_at_once() -> None:
    d = Decision("delete_records", "orders", 0, "consumed_retention", before_offset=200)
    assert should_record(d, rec(before=100, decided=NOW), NOW, 10**9)


def test_answers() -> None:
    def is_answered(r: ActionRecord, v: PartitionView) -> bool:
        return answered_at(r, earliest_uncompacted_ts(v), v.log_start)

    assert is_answered(rec(before=100), view(log_start=100))
    assert not is_answered(rec(before=100), view(log_start=99))
    overdue = view(seg(0, 10, NOW - 2 * H), seg(10, 20, NOW - H))
    compact = rec("compact", before=None, earliest=NOW - 2 * H)
    assert not is_answered(compact, overdue)
    assert is_answered(compact, view(*overdue.segments, cleaned=10))


def test_next_deadline_is_when_time_alone_makes_an_action_due() -> None:
    v = view(seg(0, 10, NOW - 10_000, closed=NOW - 5_000), min_committed=10)

    def next_deadline(t: Thresholds, records: list[ActionRecord]) -> int | None:
        return plan_partition(v, t, records, NOW, deletes_allowed=True).deadline

    assert next_deadline(th(max_compaction_lag_ms=60_000), []) == NOW - 10_000 + 60_000 + 1
    assert next_deadline(th(consumed_retention_ms=60_000), []) == NOW - 5_000 + 60_000 + 1
    # already due: the follow-up is the retry of the live record
    assert next_deadline(th(consumed_retention_ms=1, action_retry_ms=7), [rec(decided=NOW)]) == NOW + 7


# ---- configuration ----


def test_most_specific_scope_wins() -> None:
    layers = {
        "global": {"max.compaction.lag.ms": 1, "dry.run": False},
        "topic:orders": {"max.compaction.lag.ms": 2},
        "partition:orders/3": {"max.compaction.lag.ms": 3},
    }
    assert resolve(layers, "orders", 3).max_compaction_lag_ms == 3
    assert resolve(layers, "orders", 1).max_compaction_lag_ms == 2
    assert resolve(layers, "other", 0).max_compaction_lag_ms == 1
    assert resolve({}, "x", 0).dry_run is True


@pytest.mark.parametrize(
    ("scope", "values", "fragment"),
    [
        ("global", {"max.compaction.lag.ms": -5}, "greater than 0"),
        ("global", {"nope": 1}, "unknown config key"),
        ("topic:", {}, "invalid scope"),
        ("partition:orders/x", {}, "invalid scope"),
        ("global", {"groups.include": ["("]}, "invalid regex"),
        ("global", {"consumed.retention.ms": 10, "forced.retention.ms": 5}, ">= consumed"),
    ],
)
def test_invalid_layers_are_rejected_with_a_reason(scope: str, values: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        validate_layer(scope, values)


def test_forced_below_consumed_across_scopes_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"forced\.retention\.ms"):
        resolve({"global": {"forced.retention.ms": 5}, "topic:t": {"consumed.retention.ms": 10}}, "t", 0)


def test_group_include_exclude() -> None:
    t = th(groups_include=["billing.*", "analytics"], groups_exclude=["billing-test"])
    assert group_counts("billing-prod", t)
    assert group_counts("analytics", t)
    assert not group_counts("billing-test", t)
    assert not group_counts("console-consumer-1", t)
    assert group_counts("anything", th())
    # Spark's Kafka connector's offset reader reading compactd's sources: compactd's own, never a reader
    own = "compactd-source-4f1c2d-118537507-driver-0"
    assert not group_counts(own, th()) and not group_counts(own, th(groups_required=[own]))
    assert group_counts("compactd-sourcery", th())
