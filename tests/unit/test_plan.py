"""Planning one partition is pure: answered records, new decisions, the safety re-check and the wake-up time."""

from __future__ import annotations

import msgspec
import pytest

from compactd.errors import UnsafeDecision
from compactd.model import ActionRecord, Decision, PartitionView, Segment
from compactd.policy.plan import NOT_CAUGHT_UP, Facts, check_delete_safe, cluster_check, plan_partition
from compactd.policy.thresholds import Thresholds

H = 3_600_000
NOW = 1_800_000_000_000


def view(**kw) -> PartitionView:  # type: ignore[no-untyped-def]
    segs = (Segment(0, 100, NOW - 5 * H, 1, NOW - 4 * H), Segment(100, 200, NOW - 3 * H, 1, NOW - 2 * H))
    return PartitionView("t", 0, segments=segs, **kw)


def test_overdue_compaction_and_consumed_delete_are_planned_with_a_deadline() -> None:
    th = Thresholds.model_validate({"max.compaction.lag.ms": H, "consumed.retention.ms": H})
    plan = plan_partition(view(min_committed=150, counted_groups=1), th, [], NOW, deletes_allowed=True)
    assert sorted((r.action, r.reason, r.before_offset) for r in plan.enqueue) == [
        ("compact", "max_compaction_lag", None),
        ("delete_records", "consumed_retention", 100),
    ]
    assert all(r.status == "pending" and r.dry_run for r in plan.enqueue)
    assert plan.compaction_due == NOW - 5 * H + H and plan.deadline == NOW + th.action_retry_ms


def test_answered_records_leave_and_a_sent_compaction_answer_asks_for_restore() -> None:
    sent = ActionRecord("c", "compact", "t", 0, "max_compaction_lag", False, NOW - H, "sent", earliest_ts=NOW - 9 * H)
    plan = plan_partition(view(cleaned_up_to=200), Thresholds(), [sent], NOW, deletes_allowed=True)
    assert plan.answered == (sent,) and plan.compactions_answered and plan.enqueue == ()


def test_a_delete_held_by_the_readiness_gate_is_decided_afresh_once_it_opens() -> None:
    held = ActionRecord(
        "d", "delete_records", "t", 0, "forced_retention", False, NOW, "skipped", before_offset=200
    ).with_status("skipped", why=NOT_CAUGHT_UP)
    th = Thresholds.model_validate({"forced.retention.ms": H})
    assert plan_partition(view(), th, [held], NOW, deletes_allowed=False).enqueue == ()  # still held, no retry yet
    again = plan_partition(view(), th, [held], NOW, deletes_allowed=True).enqueue
    assert [(r.action, r.before_offset, r.attempts) for r in again] == [
        ("delete_records", 200, 2)
    ]  # a new id: the held one is on the audit topic


def test_safety_recheck_refuses_a_consumed_delete_past_the_minimum() -> None:
    d = Decision("delete_records", "t", 0, "consumed_retention", before_offset=200)

    def facts(log_start: int = 0, min_committed: int | None = None) -> Facts:
        return Facts("t", 0, None, log_start, min_committed, None)

    with pytest.raises(UnsafeDecision, match="past min committed"):
        check_delete_safe(d, facts(min_committed=150))
    with pytest.raises(UnsafeDecision, match="past min committed"):
        check_delete_safe(d, facts(min_committed=None))
    with pytest.raises(UnsafeDecision, match="not above log start"):
        check_delete_safe(d, facts(log_start=200, min_committed=300))
    check_delete_safe(d, facts(min_committed=200))


def consumed_delete(before: int, partition: int = 0) -> ActionRecord:
    return ActionRecord(
        "x", "delete_records", "t", partition, "consumed_retention", False, NOW, "pending", before_offset=before
    )


def test_cluster_check_skips_a_delete_past_any_counted_kafka_groups_committed_offset() -> None:
    th = Thresholds.model_validate({"consumed.retention.ms": H})
    committed = {"g1": {0: 2600}, "g2": {0: 1100}}
    assert cluster_check(consumed_delete(1000), committed, th) is None
    assert cluster_check(consumed_delete(1100), committed, th) is None
    assert cluster_check(consumed_delete(2000), committed, th) == "past group g2's committed offset 1100 in the cluster"


def test_cluster_check_blocks_a_counted_group_without_an_offset_on_the_partition() -> None:
    th = Thresholds.model_validate({"consumed.retention.ms": H})
    why = cluster_check(consumed_delete(10, partition=1), {"g1": {0: 500}}, th)
    assert why == "group g1 has no committed offset on t/1 in the cluster"


def test_cluster_check_applies_the_decisions_group_filters_and_leaves_other_deletes_alone() -> None:
    th = Thresholds.model_validate({"consumed.retention.ms": H, "groups.exclude": ["audit-.*"]})
    assert cluster_check(consumed_delete(2000), {"audit-7": {0: 5}, "g1": {0: 2600}}, th) is None
    forced = msgspec.structs.replace(consumed_delete(2000), reason="forced_retention")
    assert cluster_check(forced, {"g2": {0: 5}}, th) is None  # forced retention deletes whatever groups did
    assert cluster_check(consumed_delete(2000), {}, th) is None  # groups known only from compactd.commits


def test_a_record_with_a_new_status_keeps_every_other_field() -> None:
    """`with_status` changes the status and adds to the detail, whatever fields the record grows; the original
    stays as it was."""
    rec = ActionRecord(
        id="x-1", action="delete_records", topic="t", partition=3, reason="consumed_retention", dry_run=True,
        decided_at=5, status="pending", before_offset=7, delay_ms=11, earliest_ts=13, attempts=2, detail={"a": 1},
    )  # fmt: skip
    # every field set off its default
    assert all(getattr(rec, f.name) != f.default for f in msgspec.structs.fields(ActionRecord))
    got = rec.with_status("sent", b=2)
    assert got == msgspec.structs.replace(rec, status="sent", detail={"a": 1, "b": 2})
    assert rec.detail == {"a": 1}


def test_records_round_trip_through_json_and_a_record_off_the_types_still_reads() -> None:
    rec = ActionRecord(id="x-1", action="compact", topic="t", partition=3, reason="max_compaction_lag", dry_run=False,
                       decided_at=5, status="pending", detail={"nudge": True})  # fmt: skip
    raw = rec.to_json()
    assert raw.startswith('{"action":"compact","attempts":1,"before_offset":null,')  # keys sorted, nulls kept
    assert ActionRecord.from_json(raw) == rec == ActionRecord.from_json(raw.encode())
    odd = raw.replace('"pending"', '"queued"')  # not a status this version knows: read as it is, not refused
    assert ActionRecord.from_json(odd).status == "queued"
    other = msgspec.structs.replace(rec, partition=4)
    assert ActionRecord.many_from_json([raw.encode(), other.to_json().encode()]) == [rec, other]
    mixed = ActionRecord.many_from_json([raw.encode(), odd.encode()])  # one odd record: each read on its own
    assert [r.status for r in mixed] == ["pending", "queued"] and ActionRecord.many_from_json([]) == []


def test_a_gate_waiting_for_the_admin_agent_opens_for_no_offset_and_without_nudges_no_compaction_is_decided() -> None:
    from compactd.policy.readiness import Readiness
    from compactd.policy.thresholds import resolve, without_nudges

    gate = Readiness.waiting("waiting for the admin agent's first complete poll")
    assert not gate.ready() and not gate.observe({"compactd.commits": {"0": 10**9}}) and not gate.ready()
    layers = {"global": {"max.compaction.lag.ms": 1000}, "topic:orders": {"max.compaction.lag.ms": 5, "dry.run": False}}
    off = without_nudges(layers)
    assert resolve(off, "orders").max_compaction_lag_ms is None and resolve(off, "orders").dry_run is False
    assert resolve(layers, "orders").max_compaction_lag_ms == 5  # the configured layers are not changed
