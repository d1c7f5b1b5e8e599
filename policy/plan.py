"""One partition's evaluation as a plan: pure code decides, the controller applies (Redis, sinks).

An action record's lifecycle, in one place:

    decided ──enqueue──▶ pending (in the outbox)
    pending ──dispatch──▶ dry_run | sent | failed | skipped   (written to the audit topic, then leaves the outbox)
    any     ──the cluster did it (is_answered)──▶ answered    (leaves the live set; kept as the partition's last)
    unanswered after action.retry.ms ──▶ decided again with attempts + 1; a larger delete supersedes at once
    skipped "offsets not caught up" ──readiness gate opens──▶ dropped and decided afresh
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from compactd.errors import UnsafeDecision
from compactd.keys import partition_key
from compactd.model import ActionRecord, Decision, PartitionView, action_id
from compactd.policy.arrays import NONE
from compactd.policy.rules import Evaluation, answered_at, decide_deletion, should_record, view_horizon
from compactd.policy.thresholds import Thresholds, group_counts

NOT_CAUGHT_UP = "offsets not caught up"


class PartitionPlan(msgspec.Struct, frozen=True):
    """What evaluating one partition at `now` wants done (a struct: one a decided partition, built in C)."""

    topic: str
    partition: int
    answered: tuple[ActionRecord, ...] = ()  # the cluster did these: they leave the live set
    enqueue: tuple[ActionRecord, ...] = ()  # new decisions (or retries) for the outbox
    dropped: tuple[str, ...] = ()  # unsafe decisions, never sent; why, for the log
    deadline: int | None = None  # next time evaluating could decide something new
    compaction_due: int | None = None  # when the oldest dirty record crosses max.compaction.lag.ms

    @property
    def compactions_answered(self) -> bool:
        """A sent compaction was answered: the topic's nudged config may be put back."""
        return any(r.action == "compact" and r.status == "sent" for r in self.answered)


def check_delete_safe(d: Decision, f: Facts) -> None:
    """The safety invariant, checked once more right before a delete goes to the outbox."""
    key = partition_key(f.topic, f.partition)
    if d.before_offset is None or d.before_offset <= f.log_start:
        raise UnsafeDecision(f"{key}: before_offset {d.before_offset} not above log start {f.log_start}")
    if d.reason == "consumed_retention" and (f.min_committed is None or d.before_offset > f.min_committed):
        raise UnsafeDecision(f"{key}: before_offset {d.before_offset} past min committed {f.min_committed}")


def send_check(
    rec: ActionRecord,
    view: PartitionView,
    th: Thresholds,
    now: int,
    excluded: str | None,
    view_cap: int | None = None,
) -> str | None:
    """Why an action decided earlier must not go out now (None: send it). Runs right before the sink.

    The state may have moved since the decision: a group rewound or joined, a config event raised a retention or
    excluded the topic. A delete goes out only if deciding afresh, now, allows at least its offset.
    """
    if excluded:
        return excluded
    if rec.action != "delete_records":
        return None
    if rec.before_offset is None:
        return "no offset"
    if view_cap is not None and view_horizon(rec.before_offset, view_cap, view.log_start) != rec.before_offset:
        return f"past the compacted view's horizon {view_cap}: view + tail would lose keys"
    if rec.reason == "consumed_retention" and (view.min_committed is None or rec.before_offset > view.min_committed):
        return f"no longer safe: min committed offset is {view.min_committed} (unknown if None)"
    fresh = decide_deletion(view, th, now)
    allowed = None if fresh is None else fresh.before_offset
    if allowed is None or rec.before_offset > allowed:
        return f"no longer decided: deletable up to {allowed} now"
    return None


def cluster_check(
    rec: ActionRecord,
    committed: Mapping[str, Mapping[int, int]],
    th: Thresholds,
    unlisted: frozenset[str] = frozenset(),
    strict: bool = False,
    assigned: frozenset[str] = frozenset(),
) -> str | None:
    """Why a consumed-retention delete must not go, by the committed offsets the cluster itself holds (None: it may).

    `committed`: group -> partition -> offset on the record's topic, as OffsetFetch answers. The decision's group
    filters apply; a counted group that committed on the topic but not on this partition has an unknown position
    there (KIP-68's -1), which blocks the delete as it does in the state. Groups compactd knows only from its
    commits topic are not Kafka groups: the state's check covers them. `unlisted`: groups compactd knows on the
    topic that the cluster does not list (no Describe ACL, or gone); `strict` (cluster_check: strict): a counted
    one holds the delete, since the cluster cannot vouch for its position. `assigned`: groups whose members are
    assigned the topic and that committed nothing on it (a KIP-848 group backfilling from the start): their position
    is unknown, which holds the delete as it does for a classic group compactd knows assigned.
    """
    if rec.action != "delete_records" or rec.reason != "consumed_retention" or rec.before_offset is None:
        return None
    for group in sorted(g for g in assigned if group_counts(g, th)):
        return f"group {group} is assigned {rec.topic} and has committed nothing there: its position is unknown"
    if strict:
        for group in sorted(g for g in unlisted if group_counts(g, th)):
            return (
                f"group {group} counts on {rec.topic} but the cluster does not list it (ACLs?); cluster_check: strict"
            )
    for group in sorted(committed):
        if not group_counts(group, th):
            continue
        offset = committed[group].get(rec.partition)
        if offset is None:
            return f"group {group} has no committed offset on {rec.topic}/{rec.partition} in the cluster"
        if rec.before_offset > offset:
            return f"past group {group}'s committed offset {offset} in the cluster"
    return None


def to_record(d: Decision, previous: ActionRecord | None, th: Thresholds, now: int) -> ActionRecord:
    """A decision as an outbox record. `attempts` counts the decisions for this partition and action since the
    last answered one, so every decision gets its own id: a re-decision after a supersede, or after the readiness
    gate held it, never repeats an id already on the audit topic.
    """
    attempts = previous.attempts + 1 if previous is not None else 1
    detail: dict[str, Any] = {}
    if d.action == "compact":
        detail["nudge"] = th.compaction_nudge
    return ActionRecord(
        id=action_id(d, attempts),
        action=d.action,
        topic=d.topic,
        partition=d.partition,
        reason=d.reason,
        dry_run=th.dry_run,
        decided_at=now,
        status="pending",
        before_offset=d.before_offset,
        delay_ms=d.delay_ms,
        earliest_ts=d.earliest_ts,
        attempts=attempts,
        detail=detail,
    )


def plans(
    topic: str,
    ev: Evaluation,
    rows: list[int],
    th_of: Callable[[int], Thresholds],
    records: Mapping[int, list[ActionRecord]],
    deletes_allowed: bool,
    caps: Mapping[int, int] | None = None,
) -> list[PartitionPlan]:
    """The plans of `rows` of an evaluated chunk: the rules' decisions (none on an excluded topic's rows, which get
    no deadline either), then `plan_decided` judges each row's action records. `th_of(row)`: the row's thresholds;
    `records`: partition -> its action records; `caps`: row -> the compacted view's horizon, where there is one."""
    q, now = ev.q, ev.now
    parts = ev.nums.partitions[rows].tolist() if rows else []
    earliest, crossing = q.earliest[rows].tolist(), q.deadline[rows].tolist()
    low, ls = q.min_committed[rows].tolist(), ev.nums.log_start[rows].tolist()
    excluded = ev.limits.excluded[rows].tolist()
    decided = ev.decisions(topic, rows, caps)
    out = []
    for i, row in enumerate(rows):
        n = parts[i]
        facts = Facts(
            topic, n, None if earliest[i] == NONE else earliest[i], ls[i], None if low[i] == NONE else low[i],
            None if crossing[i] == NONE or excluded[i] else crossing[i],
        )  # fmt: skip
        decisions = [] if excluded[i] else decided[i]
        out.append(plan_decided(facts, decisions, records.get(n, []), th_of(row), now,
                                deletes_allowed=deletes_allowed, excluded=excluded[i]))  # fmt: skip
    return out


def plan_partition(
    view: PartitionView,
    th: Thresholds,
    records: list[ActionRecord],
    now: int,
    deletes_allowed: bool,
    excluded: str | None = None,
    view_cap: int | None = None,
) -> PartitionPlan:
    """One partition's plan (a chunk of one). `excluded`: why compactd never acts on this topic (internal, its own,
    topics.exclude); None to decide. `view_cap`: the compacted view's published horizon (compaction service): no
    delete goes past it."""
    ev = Evaluation.one(view, th, now, excluded=bool(excluded))
    caps = None if view_cap is None else {0: view_cap}
    return plans(view.topic, ev, [0], lambda _: th, {view.partition: records}, deletes_allowed, caps)[0]


class Facts(msgspec.Struct, frozen=True):
    """What planning reads of a partition besides the rules' decisions. `crossing`: the next threshold crossing
    (`Quiet.deadline`; None on an excluded topic)."""

    topic: str
    partition: int
    earliest: int | None  # KIP-354 earliest uncompacted timestamp
    log_start: int
    min_committed: int | None
    crossing: int | None


def plan_decided(
    f: Facts, decisions: list[Decision], records: list[ActionRecord], th: Thresholds, now: int, *,
    deletes_allowed: bool, excluded: bool = False,
) -> PartitionPlan:  # fmt: skip
    """A partition's plan from what the rules decided now and its action records: which records the cluster
    answered, which decisions become records (no duplicates, a larger delete supersedes, unsafe ones dropped), and
    when to look again. `deletes_allowed`: the readiness gate is open; `excluded`: no deadline."""
    answered: list[ActionRecord] = []
    live: list[ActionRecord] = []
    previous = {rec.action: rec for rec in records}  # for attempt counting, whatever became of them
    for rec in records:
        if rec.detail.get("why") == NOT_CAUGHT_UP and deletes_allowed:
            continue  # held back by the readiness gate, which is open now: decide afresh
        if answered_at(rec, f.earliest, f.log_start):
            answered.append(rec)
            del previous[rec.action]  # the cluster did it: the next decision starts a new count
        else:
            live.append(rec)
    enqueue: list[ActionRecord] = []
    dropped: list[str] = []
    for decision in decisions:
        existing = next((r for r in live if r.action == decision.action), None)
        if not should_record(decision, existing, now, th.action_retry_ms):
            continue
        if decision.action == "delete_records":
            try:
                check_delete_safe(decision, f)
            except UnsafeDecision as exc:
                dropped.append(str(exc))
                continue
        rec = to_record(decision, previous.get(decision.action), th, now)
        enqueue.append(rec)
        live = [r for r in live if r.action != rec.action] + [rec]
    lag = th.max_compaction_lag_ms
    return PartitionPlan(
        topic=f.topic,
        partition=f.partition,
        answered=tuple(answered),
        enqueue=tuple(enqueue),
        dropped=tuple(dropped),
        deadline=None if excluded else _soonest(f.crossing, [r.decided_at + th.action_retry_ms for r in live], now),
        compaction_due=None if lag is None or f.earliest is None else f.earliest + lag,
    )


def _soonest(crossing: int | None, retries: list[int], now: int) -> int | None:
    """The next threshold crossing or the soonest future retry of a live record."""
    future = [t for t in retries if t > now]
    if crossing is not None:
        future.append(crossing)
    return min(future) if future else None
