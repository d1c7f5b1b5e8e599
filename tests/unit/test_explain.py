"""`compactd explain`, the pure part: every blocking cause, what would be freed, and the next step, per rule."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from compactd.app.explain_cli import parse_target
from compactd.explain.model import Caps, GroupsHere, explain_partition, threshold_sources, worst_first
from compactd.explain.text import fmt_at, fmt_dur, format_text
from compactd.model import ActionRecord, PartitionView, ReplicaState, Segment
from compactd.policy.runtime_config import AppliedLayer, effective_layers
from compactd.policy.thresholds import key_scope, resolve

H = 3_600_000
T0 = 1_800_000_000_000
OPEN = {"open": True, "why": "", "since": T0 - H}


def view(min_committed: int | None = 150, counted: int = 2, cleaned: int | None = 300, log_start: int = 0):
    """Three closed segments: [0,100) closed 4h ago, [100,200) 3h ago, [200,300) 30m ago."""
    segments = (
        Segment(0, 100, T0 - 5 * H, 1000, T0 - 4 * H),
        Segment(100, 200, T0 - 3 * H, 2000, T0 - 3 * H),
        Segment(200, 300, T0 - H, 500, T0 - H // 2),
    )
    return PartitionView("orders", 3, segments, cleaned, log_start, min_committed, counted)


def explain(
    v: PartitionView,
    layer: dict[str, Any],
    groups: GroupsHere = GroupsHere(),  # noqa: B008
    gate: dict[str, Any] | None = OPEN,
    records: tuple[ActionRecord, ...] = (),
    excluded: str | None = None,
    caps: Caps = Caps(),  # noqa: B008
    deadline: int | None = None,
) -> dict[str, Any]:
    layers = {"global": {"dry.run": False, **layer}}
    th = resolve(layers, v.topic, v.partition)
    src = threshold_sources(layers, {}, v.topic, v.partition)
    return explain_partition(v, th, src, groups, gate, records, None, deadline, T0, excluded, caps)


def record(action: str = "delete_records", status: str = "pending", **kw: Any) -> ActionRecord:
    base: dict[str, Any] = dict(
        id="x", action=action, topic="orders", partition=3, dry_run=False, decided_at=T0 - 60_000, status=status
    )
    if action == "delete_records":
        base.update(reason="consumed_retention", before_offset=100)
    else:
        base.update(reason="max_compaction_lag", delay_ms=1, earliest_ts=T0 - 3 * H)
    base.update(kw)
    return ActionRecord(**base)


def causes(rule: dict[str, Any]) -> list[str]:
    return [b["cause"] for b in rule["blocked_by"]]


def test_lowest_group_is_named_with_its_last_commit_and_what_it_holds_back() -> None:
    groups = GroupsHere(lowest=(("billing", 150), ("search", 250)), commit_ts={"billing": T0 - 2 * H})
    e = explain(view(), {"consumed.retention.ms": H}, groups)
    r = e["rules"]["consumed_retention"]
    [lowest] = [b for b in r["blocked_by"] if b["cause"] == "lowest_group"]
    assert (lowest["group"], lowest["offset"], lowest["last_commit"], lowest["since_ms"]) == (
        "billing",
        150,
        T0 - 2 * H,
        2 * H,
    )
    # [0,100) is below the minimum and old enough: freed; [100,200) is old enough but billing has not read it
    assert r["frees"] == {"from": 0, "to": 100, "offsets": 100, "bytes": 1000}
    assert r["held_back"] == {"from": 100, "to": 200, "offsets": 100, "bytes": 2000}
    assert r["state"] == "due" and r["next"]["what"] == "delete_records decided at the next evaluation"
    assert "100 offsets (2.0 kB) held by group billing" in format_text(e).splitlines()[0]


def test_counted_group_without_a_position_blocks_consumed_retention_and_is_named() -> None:
    groups = GroupsHere(without_position=("new-app",), assigned=frozenset({"new-app"}))
    e = explain(view(min_committed=None), {"consumed.retention.ms": H}, groups)
    r = e["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and causes(r) == ["group_without_position"]
    assert r["blocked_by"][0]["groups"][0]["group"] == "new-app" and r["blocked_by"][0]["groups"][0]["assigned"]
    assert "new-app" in r["blocked_by"][0]["why"] and r["frees"] is None
    assert r["held_back"]["to"] == 200  # what would go once every counted group has a position


def test_no_counted_group_means_the_minimum_is_unknown() -> None:
    r = explain(view(min_committed=None, counted=0), {"consumed.retention.ms": H})["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and causes(r) == ["no_counted_group"]


def test_closed_readiness_gate_blocks_deletes_but_not_compaction() -> None:
    gate = {"open": False, "why": "state rebuilding after loss", "since": T0 - 600_000}
    e = explain(view(min_committed=300), {"consumed.retention.ms": H, "max.compaction.lag.ms": H}, gate=gate)
    r = e["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and causes(r) == ["gate_closed"]
    assert r["blocked_by"][0]["since"] == T0 - 600_000 and "state rebuilding" in r["blocked_by"][0]["why"]
    assert "gate_closed" not in causes(e["rules"]["max_compaction_lag"])
    assert e["gate"] == gate


def test_gate_never_written_is_reported_unknown_and_blocks_nothing() -> None:
    e = explain(view(min_committed=300), {"consumed.retention.ms": H}, gate=None)
    assert e["gate"] == {"open": None, "why": "unknown (no job has written it)", "since": None}
    assert e["rules"]["consumed_retention"]["state"] == "due"
    assert "unknown (no job has written it)" in format_text(e)


def test_overdue_compaction_names_the_dirty_segment_and_its_age() -> None:
    e = explain(view(cleaned=100), {"max.compaction.lag.ms": H})
    r = e["rules"]["max_compaction_lag"]
    [dirty] = r["blocked_by"]
    assert (dirty["cause"], dirty["base_offset"], dirty["end_offset"]) == ("dirty_segment", 100, 200)
    assert dirty["overdue_ms"] == 2 * H and r["now"]["dirty_segment"]["dirty_for_ms"] == 3 * H
    assert r["now"]["dirty_segments"] == 2 and r["now"]["dirty_bytes"] == 2500
    assert e["worst"]["overdue_ms"] == 2 * H


def test_compaction_not_yet_overdue_says_when_it_will_be() -> None:
    r = explain(view(cleaned=100), {"max.compaction.lag.ms": 4 * H})["rules"]["max_compaction_lag"]
    assert r["state"] == "waiting" and r["blocked_by"] == []
    assert r["next"]["at"] == T0 - 3 * H + 4 * H + 1


def test_excluded_topic_blocks_every_rule_and_plans_nothing() -> None:
    e = explain(view(min_committed=300), {"consumed.retention.ms": H}, excluded="excluded by topics.exclude")
    r = e["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and causes(r) == ["topic_excluded"] and r["next"] is None
    assert "topics.exclude" in r["blocked_by"][0]["why"] and e["next"] is None
    assert e["rules"]["max_compaction_lag"]["state"] == "off"


def test_refused_send_is_in_backoff_until_its_retry() -> None:
    rec = record(detail={"try": 2, "retry_at": T0 + 10_000, "error": "timed out"})
    r = explain(view(min_committed=300), {"consumed.retention.ms": H}, records=(rec,))["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and causes(r) == ["backoff"]
    assert r["blocked_by"][0]["retry_at"] == T0 + 10_000 and "timed out" in r["blocked_by"][0]["why"]
    assert r["next"]["at"] == T0 + 10_000 and r["action"]["id"] == "x"


def test_pending_compaction_past_its_decision_is_held_by_the_concurrency_cap() -> None:
    rec = record("compact")
    full = Caps(actions_per_second=10, max_concurrent=2, in_flight=2)
    r = explain(view(cleaned=100), {"max.compaction.lag.ms": H}, records=(rec,), caps=full)["rules"]
    assert causes(r["max_compaction_lag"]) == ["dirty_segment", "held_by_cap"]
    assert "compaction.max.concurrent: 2 of 2" in r["max_compaction_lag"]["blocked_by"][1]["why"]
    rate = explain(view(cleaned=100), {"max.compaction.lag.ms": H}, records=(rec,), caps=Caps(in_flight=0))["rules"]
    assert "actions.per.second" in rate["max_compaction_lag"]["blocked_by"][1]["why"]


def test_dry_run_is_the_cause_when_decisions_are_only_recorded() -> None:
    rec = record(status="dry_run", dry_run=True)
    layers = {"consumed.retention.ms": H, "dry.run": True}
    r = explain(view(min_committed=300), layers, records=(rec,))["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and causes(r) == ["dry_run"] and "global (file)" in r["blocked_by"][0]["why"]
    assert r["next"]["at"] == rec.decided_at + 300_000  # action.retry.ms


def test_sent_delete_waits_for_the_cluster_and_is_decided_again_after_the_retry_interval() -> None:
    rec = record(status="sent")
    r = explain(view(min_committed=300), {"consumed.retention.ms": H}, records=(rec,))["rules"]["consumed_retention"]
    assert r["state"] == "acting" and r["next"]["at"] == rec.decided_at + 300_000


def test_forced_retention_deleting_further_covers_consumed_retention() -> None:
    e = explain(view(min_committed=150), {"consumed.retention.ms": H, "forced.retention.ms": 2 * H})
    consumed = e["rules"]["consumed_retention"]
    assert consumed["state"] == "covered" and consumed["frees"]["to"] == 100
    assert consumed["covered_by"] == {"rule": "forced_retention", "before_offset": 200}
    forced = e["rules"]["forced_retention"]
    assert forced["state"] == "due" and forced["frees"]["to"] == 200


def test_offsets_in_no_known_segment_block_deletes_and_are_named() -> None:
    """The middle segment's event was lost: forced retention frees [0,100) only and says what stops it."""
    full = view(min_committed=300)
    gap = PartitionView("orders", 3, (full.segments[0], full.segments[2]), None, 0, 300, 2)
    r = explain(gap, {"forced.retention.ms": 10 * 60_000})["rules"]["forced_retention"]
    assert r["frees"]["to"] == 100 and causes(r) == ["segments_unknown"]
    assert r["blocked_by"][0]["offsets"] == {"from": 100, "to": 200}
    whole = explain(full, {"forced.retention.ms": 10 * 60_000})["rules"]["forced_retention"]
    assert whole["frees"]["to"] == 300 and causes(whole) == []


def test_segment_too_young_waits_for_the_retention_crossing() -> None:
    r = explain(view(min_committed=300), {"consumed.retention.ms": 5 * H})["rules"]["consumed_retention"]
    assert r["state"] == "waiting" and r["frees"] is None
    assert r["next"]["at"] == T0 - 4 * H + 5 * H + 1


def test_sources_say_which_scope_and_which_origin_sets_each_key() -> None:
    base = {"global": {"dry.run": False}, "topic:orders": {"consumed.retention.ms": 1000}}
    applied = {"partition:orders/3": AppliedLayer({"consumed.retention.ms": 2000}, 4, T0)}
    layers = effective_layers(base, applied)
    src = threshold_sources(layers, applied, "orders", 3)
    assert src["consumed.retention.ms"] == "partition:orders/3 (config v4)"
    assert src["dry.run"] == "global (file)" and src["forced.retention.ms"] == "default"
    assert threshold_sources(layers, applied, "orders", 1)["consumed.retention.ms"] == "topic:orders (file)"
    assert key_scope(layers, "consumed.retention.ms", "orders") == "topic:orders"
    assert key_scope(layers, "forced.retention.ms", "orders", 3) is None


def test_worst_first_puts_most_overdue_then_most_blocked_first() -> None:
    def fake(n: int, overdue: int, blocked: int) -> dict[str, Any]:
        return {"number": n, "worst": {"overdue_ms": overdue, "blocked_bytes": blocked, "blocked_offsets": 0}}

    rows = [fake(0, 0, 10), fake(1, 5, 0), fake(2, 0, 99), fake(3, 5, 1)]
    assert [r["number"] for r in sorted(rows, key=worst_first)] == [3, 1, 2, 0]


def test_explanation_is_json_and_text_fits_one_screen() -> None:
    groups = GroupsHere(lowest=(("billing", 150),), commit_ts={"billing": T0 - H})
    layer = {"consumed.retention.ms": H, "forced.retention.ms": 6 * H, "max.compaction.lag.ms": H}
    v = replace(view(cleaned=100), cleaned_at=T0 - H)  # both tombstone parts: the longest max-compaction-lag block
    e = explain(v, layer, groups, records=(record("compact", status="sent"),), deadline=T0 + 5000)
    assert json.loads(json.dumps(e)) == e
    text = format_text(e)
    assert len(text.splitlines()) <= 25 and all(len(line) <= 120 for line in text.splitlines())


def test_target_is_a_topic_or_a_partition() -> None:
    assert parse_target("orders") == ("orders", None)
    assert parse_target("orders/3") == ("orders", 3)


def test_collected_changes_keep_each_groups_latest_commit_time_per_topic() -> None:
    from compactd.streaming.aggregate import collect_changes

    def row(kind: str, grp: str, topic: str, partition: int, ts: int, src_offset: int) -> dict[str, Any]:
        offset = 10 if kind == "offset_commit" else None
        return dict(k="offset", n=1, stream="commits", kind=kind, grp=grp, topic=topic, partition=partition,
                    value_offset=offset, ts=ts, ord_a=0, ord_b=src_offset)  # fmt: skip

    rows = [
        row("offset_commit", "billing", "orders", 0, T0 - 5, 1),
        row("offset_commit", "billing", "orders", 1, T0, 2),
        row("offset_commit", "billing", "clicks", 0, T0 - 9, 3),
        row("offset_delete", "search", "orders", 0, T0 + 7, 4),  # a tombstone is not a commit
    ]
    changes = collect_changes(rows).changes
    assert changes.topics["orders"].commit_ts == {"billing": T0}
    assert changes.topics["clicks"].commit_ts == {"billing": T0 - 9}


def test_a_compacted_views_horizon_is_named_where_it_stops_a_delete() -> None:
    layers = {"global": {"dry.run": False, "forced.retention.ms": 2 * H}}
    v = view()
    th = resolve(layers, v.topic, v.partition)
    src = threshold_sources(layers, {}, v.topic, v.partition)
    capped = explain_partition(v, th, src, GroupsHere(), OPEN, (), None, None, T0, None, Caps(), 150)
    forced = capped["rules"]["forced_retention"]
    assert forced["frees"]["to"] == 200 and "view_horizon" in causes(forced)
    assert next(b for b in forced["blocked_by"] if b["cause"] == "view_horizon")["horizon"] == 150
    nothing = explain_partition(v, th, src, GroupsHere(), OPEN, (), None, None, T0, None, Caps(), 0)
    assert nothing["rules"]["forced_retention"]["state"] == "blocked"  # nothing published: nothing may go
    beyond = explain_partition(v, th, src, GroupsHere(), OPEN, (), None, None, T0, None, Caps(), 500)
    assert "view_horizon" not in causes(beyond["rules"]["forced_retention"])
    assert "view_horizon" not in causes(explain(v, {"forced.retention.ms": 2 * H})["rules"]["forced_retention"])


def test_the_view_line_says_when_the_sources_retention_reaches_past_the_horizon() -> None:
    from compactd.compaction.manifest import Manifest
    from compactd.compaction.manifest import ViewPartition as ViewPart
    from compactd.explain.model import view_report

    week = 7 * 24 * H
    published = Manifest("orders", "orders.compacted", 3, partitions={"3": ViewPart(250, 0, 10, beyond_since=T0 - H)})
    v = view()  # segments reach offset 300: records beyond the horizon 250, the oldest written at T0 - 1h at most
    report = view_report(published, {"retention_ms": week, "at": T0}, v, T0)
    assert report is not None and report["retention_left_ms"] == week - H and report["horizon"] == 250
    assert report["run_by_ms"] == week // 2 - H  # a run is due at half the retention
    e = explain(v, {"forced.retention.ms": 2 * H})
    e["compacted_view"] = report
    line = "view      generation 3, horizon 250; the source's retention.ms (7d00h) reaches past the horizon in 6d23h"
    assert line in format_text(e)
    quiet = PartitionView("orders", 3, v.segments[:2], 300, 0, 150, 2)  # nothing known beyond the horizon
    assert view_report(published, {"retention_ms": week, "at": T0}, quiet, T0)["retention_left_ms"] == week
    late = view_report(published, {"retention_ms": H // 2, "at": T0}, v, T0)
    e["compacted_view"] = late
    assert late["retention_left_ms"] < 0 and "may already have deleted records beyond the horizon" in format_text(e)
    e["compacted_view"] = view_report(published, {"retention_ms": None, "at": T0}, v, T0)
    assert "no time retention that compactd could read" in format_text(e)
    assert view_report(None, None, v, T0) is None
    assert view_report(Manifest("orders", "orders.compacted", 0), None, v, T0) is None
    # delta runs appended 4 of the range's 10 records since its last rewrite: readers read them too
    appended = Manifest("orders", "orders.compacted", 4, partitions={"3": ViewPart(250, 0, 10, base_end=6)})
    e["compacted_view"] = view_report(appended, {"retention_ms": week, "at": T0}, v, T0)
    assert e["compacted_view"]["dirty_ratio"] == 0.4
    assert "generation 4, horizon 250 (40% of it appended by delta runs since the last rewrite)" in format_text(e)


def test_where_the_cleaner_cannot_be_seen_compaction_is_blocked_by_that_and_nothing_claims_it_overdue() -> None:
    v = view(cleaned=None)  # the admin agent's slices: nothing is ever seen compacted
    layers = {"global": {"dry.run": False, "max.compaction.lag.ms": H}}
    th = resolve(layers, v.topic, v.partition)
    src = threshold_sources(layers, {}, v.topic, v.partition)
    seen = explain_partition(v, th, src, GroupsHere(), OPEN, (), None, None, T0)
    assert seen["rules"]["max_compaction_lag"]["state"] == "due"  # a cleaner compactd could see: overdue
    e = explain_partition(v, th, src, GroupsHere(), OPEN, (), None, None, T0, cleaner_visible=False)
    lag = e["rules"]["max_compaction_lag"]
    assert (lag["state"], causes(lag), lag["next"]) == ("blocked", ["cleaner_not_visible"], None)
    assert lag["threshold"]["value"] == H  # the configured value stays visible
    assert e["worst"]["overdue_ms"] == 0
    text = format_text(e)
    assert "compaction unknown: cleaner not visible" in text and "compaction.service" in text


def test_without_any_segment_event_every_rule_on_says_no_segment_source() -> None:
    v = PartitionView("orders", 3, (), None, 0, 150, 2)  # commits known, no segment event ever
    layers = {"global": {"dry.run": False, "consumed.retention.ms": H, "max.compaction.lag.ms": H}}
    th = resolve(layers, v.topic, v.partition)
    src = threshold_sources(layers, {}, v.topic, v.partition)
    quiet = explain_partition(v, th, src, GroupsHere(), OPEN, (), None, None, T0)
    assert quiet["rules"]["consumed_retention"]["state"] == "clear"  # what users saw: silence
    e = explain_partition(v, th, src, GroupsHere(), OPEN, (), None, None, T0, segment_source=False)
    for name in ("consumed_retention", "max_compaction_lag"):
        assert e["rules"][name]["state"] == "blocked" and causes(e["rules"][name])[0] == "no_segment_source"
    assert e["rules"]["forced_retention"]["state"] == "off"
    assert "compactd agent --admin" in format_text(e)


def test_explain_says_when_the_cleaned_and_the_dirty_tombstones_are_gone_if_records_keep_arriving() -> None:
    """KIP-534's two passes: the tombstones below cleaned_up_to (cleaned at C) are removable after C +
    delete.retention.ms and gone at the next clean, which max.compaction.lag.ms bounds; the dirty ones get their first
    pass by earliest + lag, then the same. The later of the two is the metric's deadline."""
    seen = T0 - 10_000
    v = replace(view(cleaned=100), cleaned_at=seen)  # dirty: [100, 200) from T0 - 3h, [200, 300) from T0 - 1h
    e = explain(v, {"max.compaction.lag.ms": H, "delete.retention.ms": 60_000})
    lag = e["rules"]["max_compaction_lag"]
    assert lag["now"]["cleaned_at"] == seen
    assert lag["now"]["tombstones"] == {
        "delete_retention_ms": 60_000,
        "removable_after": seen + 60_000,
        "clean_by": seen + 60_000 + H,
        "first_pass_by": T0 - 2 * H,
        "dirty_by": T0 - 2 * H + 60_000 + H,
        "gone_by": seen + 60_000 + H,
        "clean_time_unknown": False,
    }
    text = format_text(e).splitlines()
    at = lambda ts: fmt_at(ts, T0)  # noqa: E731
    block = text[text.index(f"    tombstones (delete.retention.ms 1m): all gone by {at(seen + 60_000 + H)} if records "
                            "keep arriving"):][:4]  # fmt: skip
    assert block[1:] == [
        f"      cleaned {at(seen)}, removable after {at(seen + 60_000)}",
        f"      next clean by {at(seen + 60_000 + H)} (max.compaction.lag.ms), once new records make the log dirty",
        f"      not cleaned yet: first pass by {at(T0 - 2 * H)}, gone by {at(T0 - H + 60_000)}",
    ]
    assert "tombstone" not in text[0]  # not overdue: nothing in the headline


def test_tombstones_past_their_deadline_are_overdue_in_the_headline() -> None:
    v = replace(view(cleaned=300), cleaned_at=T0 - 3 * H)  # nothing dirty; no write since made Kafka clean again
    e = explain(v, {"max.compaction.lag.ms": H, "delete.retention.ms": 60_000})
    assert e["rules"]["max_compaction_lag"]["now"]["tombstones"]["gone_by"] == T0 - 2 * H + 60_000
    text = format_text(e)
    assert "tombstone erasure overdue by 1h59m" in text.splitlines()[0]
    assert f"all gone by {fmt_at(T0 - 2 * H + 60_000, T0)} if records keep arriving, overdue" in text


def test_a_clean_compactd_did_not_time_has_no_tombstone_bound_and_an_excluded_topic_none_at_all() -> None:
    unknown = explain(view(cleaned=300), {"max.compaction.lag.ms": H})  # cleaned before compactd kept clean times
    t = unknown["rules"]["max_compaction_lag"]["now"]["tombstones"]
    assert (t["gone_by"], t["clean_time_unknown"]) == (None, True)
    text = format_text(unknown)
    assert "    tombstones (delete.retention.ms 1d00h): no bound" in text
    assert "below offset 300: cleaned before compactd kept when; no bound until the next clean" in text
    assert "tombstones" not in format_text(explain(view(cleaned=300), {}))  # no max.compaction.lag.ms: no bound
    excluded = explain(replace(view(cleaned=100), cleaned_at=T0), {"max.compaction.lag.ms": H}, excluded="by rule")
    assert "tombstones" not in excluded["rules"]["max_compaction_lag"]["now"]
    assert "tombstones" not in format_text(excluded)  # compactd never nudges it: nothing bounds the next clean


def test_explain_names_each_replicas_cleaner_and_the_one_that_is_late() -> None:
    """On a replicated cluster every replica's cleaner erases on its own (KIP-534 per replica): each reported replica
    has its own bound, the earliest is the one a replica misses first (the headline says which), the latest is when
    every copy is gone; a replica no agent reports is named, not guessed."""
    leader_clean = T0 - 10_000
    v = replace(
        view(cleaned=300),
        cleaned_at=leader_clean,
        replicas=(
            ReplicaState(1, 300, leader_clean, 0, reported=True),
            ReplicaState(2, None, None, 0, reported=True),  # its cleaner has not run: every tombstone still there
            ReplicaState(3),
        ),
    )
    e = explain(v, {"max.compaction.lag.ms": H, "delete.retention.ms": 60_000})
    t = e["rules"]["max_compaction_lag"]["now"]["tombstones"]
    leader = leader_clean + 60_000 + H
    never = T0 - 5 * H + H + 60_000 + H  # the oldest record's first pass, then delete.retention.ms, then the next
    assert (t["gone_by"], t["first_gone_by"], t["soonest_replica"], t["slowest_replica"]) == (leader, never, 2, None)
    assert [(r["replica"], r["reported"], r["gone_by"]) for r in t["replicas"]] == [
        (1, True, leader), (2, True, never), (3, False, None)
    ]  # fmt: skip
    text = format_text(e)
    assert f"tombstone erasure overdue on replica 2 by {fmt_dur(T0 - never)}" in text.splitlines()[0]
    assert f"      replica 2: never cleaned, gone by {fmt_at(never, T0)}, overdue" in text
    assert "      replica 3: no agent reports its log; its cleaner is unknown, left out" in text


def test_explain_says_which_offsets_are_in_the_remote_tier_only() -> None:
    """Tiered storage: below every replica's oldest local segment (and above the log start) the offsets are in the
    remote tier only; a DeleteRecords deletes them there too."""
    v = replace(
        view(), replicas=(ReplicaState(1, None, None, 36, reported=True), ReplicaState(2, None, None, 45, True))
    )
    e = explain(v, {"consumed.retention.ms": H})
    assert e["tiers"] == {"log_start": 0, "local_log_start": {1: 36, 2: 45}, "remote_only": {"from": 0, "to": 36}}
    assert "  tiers     offsets 0-35 in the remote tier only; local logs from 36 (replica 1), 45 (replica 2)" in (
        format_text(e)
    )
    assert explain(view(), {})["tiers"] is None  # no agent reports a local log: nothing said
    local = explain(replace(v, log_start=36), {})["tiers"]
    assert local["remote_only"] is None  # everything above the log start is on a disk too
