"""`compactd explain TOPIC[/PARTITION]`: why a partition has not been compacted or deleted, and what happens next.

Per rule (max compaction lag, consumed retention, forced retention): the threshold and the scope that sets it, the
value now, what blocks it (the lowest counted group and when it last committed, a counted group without a position,
the readiness gate, a dirty segment and its age, a topic exclusion, a cap or a backoff), what it would free, its live
action and the next expected one. `explain_partition` is pure (tests need no Redis) and asks each rule function once.

A topic is ranked first, then explained: `rank` reads a few integers per partition (one read-only script call per
2,000 partitions, lua/explain_rank.lua, returning one string numpy parses) and orders every partition worst first
over arrays (app/explain_rank.py); `explanations` then reads and builds only the partitions shown, 20 by default
(lua/explain.lua, one round trip per chunk). Building an explanation costs ~100 µs of Python and its text is a
screen: at 100k partitions, doing it for all of them was what made the command take half a minute and print 94 MB.
Everything only reads Redis.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from compactd.app.explain_rank import Deletes, worst_figures, worst_order
from compactd.app.progress import Reporter, progress
from compactd.app.settings import Settings
from compactd.clock import now_ms
from compactd.compaction.manifest import RETENTION_SHARE, Manifest, retention_cap, retention_left
from compactd.compaction.store import CompactionState
from compactd.compaction.takeover import Takeover, overlay
from compactd.errors import UsageError
from compactd.keys import parse_partition_key, partition_key
from compactd.model import ActionRecord, PartitionNumbers, PartitionView
from compactd.policy.arrays import NONE
from compactd.policy.plan import NOT_CAUGHT_UP
from compactd.policy.rules import RULES as RULE_NAMES
from compactd.policy.rules import Evaluation, Limits, answered_at, value, view_horizon
from compactd.policy.runtime_config import AppliedLayer, effective_layers
from compactd.policy.thresholds import Thresholds, key_scope, resolve, resolve_global, topic_excluded
from compactd.state.redis_store import PartitionDetail, RedisState, TopicGroups

CHUNK = 2000  # partitions explained per Redis round trip
RANK_CHUNK = 2000  # partitions ranked per script call: each call holds Redis for a few tens of ms
RULES = {
    "max_compaction_lag": "max.compaction.lag.ms",
    "consumed_retention": "consumed.retention.ms",
    "forced_retention": "forced.retention.ms",
}
SCOPED_KEYS = (*RULES.values(), "dry.run")
CLEANER_NOT_VISIBLE = (
    "the broker's cleaner cannot be seen from the Admin API (offsets_source: admin): a nudge could never be seen "
    "answered, so none is decided; the compaction service (compaction.service=true) keeps a compacted view without "
    "broker access"
)
NO_SEGMENT_SOURCE = (
    "no segment event has reached compactd: nothing says what is old here; is an agent running? (`compactd agent "
    "--log-dir` beside each broker, or `compactd agent --admin` once per cluster)"
)
# (state, blocking causes, next expected step) of a rule's action
Progress = tuple[str | None, list[dict[str, Any]], dict[str, Any] | None]
# a rule's live record (or None), whether the rule fires now, and the action kind it would decide
ActionFn = Callable[[ActionRecord | None, bool, str], Progress]


@dataclass(frozen=True)
class GroupsHere:
    """The counted groups as they stand on one partition."""

    lowest: tuple[tuple[str, int], ...] = ()  # (group, offset), lowest first
    without_position: tuple[str, ...] = ()  # counted groups with no offset on this partition
    assigned: frozenset[str] = frozenset()  # groups with members assigned to the topic
    commit_ts: Mapping[str, int] = field(default_factory=dict)  # group -> latest commit time on the topic


@dataclass(frozen=True)
class Caps:
    """The global caps on sending, and how many compaction nudges are in flight (None: not read)."""

    actions_per_second: float = 10.0
    max_concurrent: int = 10
    in_flight: int | None = None


# ---- pure ---------------------------------------------------------------------------------------


def threshold_sources(
    layers: Mapping[str, Mapping[str, Any]],
    applied: Mapping[str, AppliedLayer],
    topic: str,
    partition: int | None,
    keys: Sequence[str] = SCOPED_KEYS,
) -> dict[str, str]:
    """Where each key's value comes from: `<scope> (file)`, `<scope> (config vN)` or `default`."""
    out = {}
    for key in keys:
        scope = key_scope(layers, key, topic, partition)
        if scope is None:
            out[key] = "default"
        elif scope in applied and key in applied[scope].values:
            out[key] = f"{scope} (config v{applied[scope].version})"
        else:
            out[key] = f"{scope} (file)"
    return out


Seg = tuple[int, int, int, int, int]  # base offset, end offset, first batch max ts, size, closed at


@dataclass(frozen=True, slots=True)
class _Facts:
    """One partition's row of the rules' evaluation (policy/rules.py), as explain reads it: nothing here is derived
    again from the segments."""

    earliest: int | None  # KIP-354 earliest uncompacted timestamp
    compaction_due: int | None  # when the oldest dirty record crosses the lag
    overdue: int  # how far past the lag it is, 0 when not (compaction is due exactly when > 0)
    ends: dict[str, int | None]  # each retention's delete offset now
    frees: dict[str, tuple[int, int]]  # each retention's (offsets, bytes) above the log start
    by_age: int | None  # consumed retention's prefix by age alone, as if no group held it back
    held: tuple[int, int]  # (offsets, bytes) the groups hold back beyond what consumed retention frees
    winner: tuple[str, int] | None  # (reason, before_offset) of the delete decided now
    crossings: dict[str, int]  # each rule's next threshold crossing
    gap: tuple[int, Seg] | None  # the first offsets no known segment covers, and the segment after them
    live: tuple[int, int]  # closed segments still on disk: count, bytes
    oldest: Seg | None  # the first of them
    dirty: tuple[int, int]  # dirty segments: count, bytes
    oldest_dirty: Seg | None  # the lowest dirty segment holding the earliest timestamp
    worst: tuple[int, int, int]  # overdue_ms, blocked_bytes, blocked_offsets (app/explain_rank.py)


def _seg(seg: Any, i: int) -> Seg | None:
    return tuple(int(x) for x in seg[i]) if i < len(seg) else None  # type: ignore[return-value]


def rule_facts(
    parts: Sequence[tuple[PartitionView, Thresholds, bool, ActionRecord | None, int | None]],
    gate_closed: bool,
    cleaner_visible: bool,
    now: int,
) -> list[_Facts]:
    """The rules' evaluation of a chunk of partitions, a row each: `parts` is (view, thresholds, excluded, live
    delete record, view cap) per partition. No compaction is decided where the cleaner cannot be seen."""
    n = len(parts)

    def ranked(th: Thresholds) -> Thresholds:
        return th if cleaner_visible else th.model_copy(update={"max_compaction_lag_ms": None})

    nums = PartitionNumbers.of_views([p[0] for p in parts])
    limits = Limits.of(n, (Thresholds(), False), {i: (ranked(p[1]), p[2]) for i, p in enumerate(parts)})
    ev = Evaluation.of(nums, limits, now)
    ins = ev.insight()
    deletes = Deletes.of(n, {i: p[3] for i, p in enumerate(parts) if p[3] is not None}, now)
    caps = np.array([NONE if p[4] is None else p[4] for p in parts], dtype=np.int64)
    worst = [a.tolist() for a in worst_figures(ev, ins, deletes, gate_closed, caps)]
    q, d = ev.q, ev.d
    out = []
    for i in range(n):
        before = value(d.before, i)
        crossings = zip(RULE_NAMES, (q.next_lag, q.next_consumed, q.next_forced), strict=True)
        gap = value(ins.gap_at, i)
        out.append(
            _Facts(
                earliest=value(q.earliest, i),
                compaction_due=value(q.compaction_due, i),
                overdue=int(d.delay[i]),
                ends={"consumed_retention": value(d.consumed_end, i), "forced_retention": value(d.forced_end, i)},
                frees={
                    "consumed_retention": (int(d.consumed_offsets[i]), int(d.consumed_bytes[i])),
                    "forced_retention": (int(d.forced_offsets[i]), int(d.forced_bytes[i])),
                },
                by_age=value(ins.by_age, i),
                held=(int(ins.held_offsets[i]), int(ins.held_bytes[i])),
                winner=None if before is None else
                ("forced_retention" if d.forced[i] else "consumed_retention", before),
                crossings={rule: int(a[i]) for rule, a in crossings if a[i] != NONE},
                gap=None if gap is None else (gap, _seg(ins.seg, int(ins.gap_next[i]))),  # type: ignore[arg-type]
                live=(int(ins.live_count[i]), int(ins.live_bytes[i])),
                oldest=_seg(ins.seg, int(ins.first_live[i])),
                dirty=(int(ins.dirty_count[i]), int(ins.dirty_bytes[i])),
                oldest_dirty=_seg(ins.seg, int(ins.oldest_dirty[i])),
                worst=(worst[0][i], worst[1][i], worst[2][i]),
            )
        )  # fmt: skip
    return out


def _span(start: int, figures: tuple[int, int]) -> dict[str, int] | None:
    """Offsets [start, start + offsets) and the bytes of the closed segments ending inside; None when empty."""
    offsets, size = figures
    return {"from": start, "to": start + offsets, "offsets": offsets, "bytes": size} if offsets > 0 else None


def _cause(cause: str, why: str, **extra: Any) -> dict[str, Any]:
    return {"cause": cause, "why": why, **extra}


def _gate_report(gate: Mapping[str, Any] | None) -> dict[str, Any]:
    if gate is None:
        return {"open": None, "why": "unknown (no job has written it)", "since": None}
    return {"open": bool(gate.get("open")), "why": str(gate.get("why", "")), "since": gate.get("since")}


def _action_status(
    rec: ActionRecord | None,
    wants: bool,
    kind: str,
    view: PartitionView,
    facts: _Facts,
    th: Thresholds,
    dry_source: str,
    caps: Caps,
    deadline: int | None,
    now: int,
) -> Progress:
    """(state, blocking causes, next expected step) from a rule's live record, or from its absence when it fires."""
    dry = _cause("dry_run", f"dry.run is true ({dry_source}): decisions are recorded, nothing is sent")
    if rec is None:
        if not wants:
            return None, [], None
        at = max(deadline, now) if deadline is not None else now
        nxt = {"at": at, "what": f"{kind} decided at the next evaluation"}
        return ("blocked", [dry], nxt) if th.dry_run else ("due", [], nxt)
    verb = rec.action if rec.before_offset is None else f"{rec.action} <{rec.before_offset}"
    again = rec.decided_at + th.action_retry_ms
    if rec.status == "pending":
        retry_at = rec.detail.get("retry_at")
        if retry_at is not None and int(retry_at) > now:
            tries, error = rec.detail.get("try", 1), rec.detail.get("error", "refused")
            why = f"send {tries} failed ({error}); backing off until the next try"
            nxt = {"at": int(retry_at), "what": f"{verb} sent again"}
            return "blocked", [_cause("backoff", why, retry_at=int(retry_at), tries=tries)], nxt
        if rec.dry_run or th.dry_run:
            nxt = {"at": now, "what": f"{verb} recorded as a dry run at the next dispatch"}
            return ("blocked", [dry], nxt) if th.dry_run else ("due", [], nxt)
        since = int(retry_at) if retry_at is not None else rec.decided_at
        if rec.action == "compact" and caps.in_flight is not None and caps.in_flight >= caps.max_concurrent:
            cap = f"compaction.max.concurrent: {caps.in_flight} of {caps.max_concurrent} nudges in flight"
        else:
            cap = f"actions.per.second: {caps.actions_per_second:g} sends per second"
        why = f"in the outbox for {_dur(now - since)}, held by {cap}"
        return (
            "blocked",
            [_cause("held_by_cap", why, since=since)],
            {"at": now, "what": f"{verb} sent when the cap allows"},
        )
    if rec.status == "sent":
        if answered_at(rec, facts.earliest, view.log_start):
            return "acting", [], {"at": deadline or now, "what": f"{verb} answered: leaves at the next evaluation"}
        return "acting", [], {"at": again, "what": f"{verb} decided again if the cluster has not answered"}
    if rec.status == "dry_run":
        nxt = {"at": again, "what": f"{verb} decided again"}
        return ("blocked", [dry], nxt) if th.dry_run else ("due", [], nxt)
    why = str(rec.detail.get("why", rec.status))
    what = "decided afresh when the readiness gate opens" if why == NOT_CAUGHT_UP else "decided again"
    return (
        "blocked",
        [_cause("skipped", f"skipped at send time: {why}", at=rec.decided_at)],
        {"at": again, "what": f"{verb} {what}"},
    )


def _compaction(
    view: PartitionView, th: Thresholds, src: str, facts: _Facts, rec: ActionRecord | None, action: ActionFn, now: int
) -> dict[str, Any]:
    """KIP-354: the oldest dirty segment, how overdue it is, and the compaction's progress."""
    lag = th.max_compaction_lag_ms
    out: dict[str, Any] = {"threshold": {"value": lag, "scope": src}, "now": {}, "action": _rec(rec)}
    if lag is None:
        return {**out, "state": "off", "blocked_by": [], "next": None}
    earliest = facts.earliest
    out["now"] = {
        "cleaned_up_to": view.cleaned_up_to,
        "dirty_segments": facts.dirty[0],
        "dirty_bytes": facts.dirty[1],
        "earliest_uncompacted_ts": earliest,
    }
    if earliest is None or facts.oldest_dirty is None or facts.compaction_due is None:
        state, blockers, nxt = action(rec, False, "compact")
        return {**out, "state": state or "clear", "blocked_by": blockers, "next": nxt}
    base, end, _, size, _ = facts.oldest_dirty
    due_at = facts.compaction_due
    seg = {"base_offset": base, "end_offset": end, "size_bytes": size}
    out["now"].update(dirty_segment={**seg, "dirty_for_ms": now - earliest}, delay_ms=now - due_at, due_at=due_at)
    if facts.overdue <= 0:
        state, blockers, nxt = action(rec, False, "compact")
        nxt = nxt or {"at": due_at + 1, "what": "the oldest dirty record passes the lag: compact decided"}
        return {**out, "state": state or "waiting", "blocked_by": blockers, "next": nxt}
    why = (
        f"segment [{base}, {end}) has held a record uncompacted for "
        f"{_dur(now - earliest)}, {_dur(facts.overdue)} past {_dur(lag)}"
    )
    state, more, nxt = action(rec, True, "compact")
    blockers = [_cause("dirty_segment", why, **seg, dirty_for_ms=now - earliest, overdue_ms=facts.overdue), *more]
    return {**out, "state": state or "due", "blocked_by": blockers, "next": nxt}


def _rec(rec: ActionRecord | None) -> dict[str, Any] | None:
    return None if rec is None else rec.audit()


def _group(name: str, offset: int | None, groups: GroupsHere, now: int) -> dict[str, Any]:
    ts = groups.commit_ts.get(name)
    return {
        "group": name,
        "offset": offset,
        "last_commit": ts,
        "since_ms": None if ts is None else now - ts,
        "assigned": name in groups.assigned,
    }


def _who(g: Mapping[str, Any], now: int) -> str:
    """A group without a position here, and what compactd knows of it."""
    seen = "no commit seen" if g["last_commit"] is None else f"last commit elsewhere {_at(g['last_commit'], now)}"
    return f"group {g['group']} ({'assigned, ' if g['assigned'] else ''}{seen})"


def _group_causes(
    view: PartitionView, groups: GroupsHere, held: bool, now: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Consumed retention's groups now, and what they block: an unknown minimum, or the lowest group(s) when
    segments old enough wait beyond it (`held`)."""
    info = {
        "min_committed": view.min_committed,
        "counted_groups": view.counted_groups,
        "lowest": [_group(g, o, groups, now) for g, o in groups.lowest if o == view.min_committed],
        "without_position": [_group(g, None, groups, now) for g in groups.without_position],
    }
    if view.counted_groups == 0:
        why = "no counted group commits here or is assigned to the topic: the minimum is unknown"
        return info, [_cause("no_counted_group", why)]
    if view.min_committed is None:
        named = ", ".join(_who(g, now) for g in info["without_position"]) or "a counted group"
        why = f"{named} counts but has no offset here: the minimum is unknown"
        return info, [_cause("group_without_position", why, groups=info["without_position"])]
    causes = []
    for g in info["lowest"] if held else []:
        last = "no commit time seen" if g["last_commit"] is None else f"last commit {_at(g['last_commit'], now)}"
        causes.append(_cause("lowest_group", f"group {g['group']} at offset {g['offset']}, {last}", **g))
    return info, causes


def _deletion(
    rule: str,
    view: PartitionView,
    th: Thresholds,
    src: str,
    facts: _Facts,
    groups: GroupsHere,
    delete: ActionRecord | None,
    action: ActionFn,
    gate: Mapping[str, Any] | None,
    now: int,
) -> dict[str, Any]:
    """Consumed or forced retention: what it frees, what holds the rest back, and the delete's progress."""
    consumed = rule == "consumed_retention"
    ms = th.consumed_retention_ms if consumed else th.forced_retention_ms
    own = delete if delete is not None and delete.reason == rule else None
    out: dict[str, Any] = {"threshold": {"value": ms, "scope": src}, "now": {}, "action": _rec(own)}
    if ms is None:
        return {**out, "state": "off", "blocked_by": [], "frees": None, "held_back": None, "next": None}
    ls = view.log_start
    end = facts.ends[rule]
    frees = _span(ls, facts.frees[rule])
    held = _span(max(end or ls, ls), facts.held) if consumed else None
    blockers: list[dict[str, Any]] = []
    if consumed:
        out["now"], blockers = _group_causes(view, groups, held is not None, now)
    gap = facts.gap
    if gap is not None and gap[1] is not None and now - gap[1][4] > ms and (end or ls) <= gap[0]:
        lo, after = gap[0], gap[1][0]
        why = (
            f"offsets {lo}-{after} are in no segment compactd knows (their segment events were lost: a rebuild from a "
            "segments topic past its retention?): deletes stop there until the agent's next full scan (--full-every-ms)"
        )
        blockers.append(_cause("segments_unknown", why, offsets={"from": lo, "to": after}))
    out.update(frees=frees, held_back=held)
    winner = facts.winner
    if frees is not None and winner is not None and winner[0] != rule and own is None:
        covered = {"rule": winner[0], "before_offset": winner[1]}
        return {**out, "state": "covered", "blocked_by": blockers, "next": None, "covered_by": covered}
    wants = frees is not None and winner is not None and winner[0] == rule
    state, more, nxt = action(own, wants, "delete_records")
    if (wants or (own is not None and own.status == "pending")) and gate is not None and not gate.get("open"):
        since = gate.get("since")
        why = f"readiness gate closed: {gate.get('why', '')}" + (f", since {_at(since, now)}" if since else "")
        more = [_cause("gate_closed", why, since=since), *more]
        state = "blocked"
    if state is None:  # nothing to send: held back by the groups, waiting for a segment to age, or clear
        crossing = facts.crossings.get(rule)
        if crossing is not None:
            nxt = {"at": crossing, "what": "a segment ages past the retention"}
        state = "blocked" if blockers else ("waiting" if crossing is not None else "clear")
    return {**out, "state": state, "blocked_by": blockers + more, "next": nxt}


def _view_horizon(rules: dict[str, dict[str, Any]], cap: int, log_start: int) -> None:
    """A retention that would free past the compacted view's horizon is told so: deletes stop there, so the view and
    the topic's tail keep every live key; the next generation moves the horizon (`compactd compact status`)."""
    why = (
        f"the compacted view's horizon is at offset {cap}: deletes stop there so the view and the topic's tail keep "
        "every key; the next generation moves it (`compactd compact status TOPIC`)"
    )
    for name in ("consumed_retention", "forced_retention"):
        r = rules[name]
        frees = r.get("frees")
        if r["state"] in ("off", "covered") or not frees:
            continue
        allowed = int(view_horizon(frees["to"], cap, log_start))
        if allowed == frees["to"]:
            continue
        r["blocked_by"].append(_cause("view_horizon", why, horizon=cap))
        if allowed == NONE:  # nothing of it may go until a generation is published past the log start
            r["state"], r["next"] = "blocked", None


def view_report(
    manifest: Manifest | None, retention: Mapping[str, Any] | None, view: PartitionView, now: int
) -> dict[str, Any] | None:
    """The partition's compacted view (compaction service): its generation and horizon, and how long until the
    source's own retention.ms may delete a record the view does not hold yet (a run starts at RETENTION_SHARE of
    it; past it the view has a gap). None: the topic has no published view."""
    if manifest is None or manifest.generation <= 0:
        return None
    horizon = manifest.horizon(view.partition)
    retention_ms = None if retention is None else retention.get("retention_ms")
    taken = None if retention is None else retention.get("takeover")
    beyond = any(s.end_offset > horizon for s in view.segments)
    left = retention_left(manifest, view.partition, retention_ms, now, beyond)
    return {
        "generation": manifest.generation,
        "horizon": horizon,
        "source_retention_ms": retention_ms,
        "retention_read_at": None if retention is None else retention.get("at"),
        "retention_left_ms": left,
        "run_by_ms": None if left is None or retention_ms is None else left - int(retention_ms * (1 - RETENTION_SHARE)),
        "retention_takeover": taken,
    }


def explain_partition(
    view: PartitionView,
    th: Thresholds,
    sources: Mapping[str, str],
    groups: GroupsHere,
    gate: Mapping[str, Any] | None,
    records: Sequence[ActionRecord],
    last: ActionRecord | None,
    deadline: int | None,
    now: int,
    excluded: str | None = None,
    caps: Caps = Caps(),
    view_cap: int | None = None,
    cleaner_visible: bool = True,
    segment_source: bool = True,
    facts: _Facts | None = None,
) -> dict[str, Any]:
    """Why one partition stands where it does, per rule, as a JSON-ready dict. Pure. `view_cap`: the compacted
    view's published horizon when the topic has one (compaction service): no delete passes it. `cleaner_visible`:
    False where the job never nudges (offsets_source admin); `segment_source`: False while no segment event has ever
    reached the job's state. `facts`: the partition's row of its chunk's evaluation (`rule_facts`); evaluated here
    alone when not given."""
    live = {r.action: r for r in records}
    dry_src = sources.get("dry.run", "default")
    if facts is None:
        closed = gate is not None and not gate.get("open")
        one = (view, th, bool(excluded), live.get("delete_records"), view_cap)
        facts = rule_facts([one], closed, cleaner_visible, now)[0]

    def action(rec: ActionRecord | None, wants: bool, kind: str) -> Progress:
        if excluded and (wants or rec is not None):
            return "blocked", [_cause("topic_excluded", f"compactd never acts on this topic: {excluded}")], None
        return _action_status(rec, wants, kind, view, facts, th, dry_src, caps, deadline, now)

    delete = live.get("delete_records")
    rules = {
        "max_compaction_lag": _compaction(
            view, th, sources.get("max.compaction.lag.ms", "default"), facts, live.get("compact"), action, now
        ),
        "consumed_retention": _deletion(
            "consumed_retention", view, th, sources.get("consumed.retention.ms", "default"), facts, groups, delete,
            action, gate, now,
        ),
        "forced_retention": _deletion(
            "forced_retention", view, th, sources.get("forced.retention.ms", "default"), facts, groups, delete,
            action, gate, now,
        ),
    }  # fmt: skip
    if not cleaner_visible and rules["max_compaction_lag"]["state"] != "off":
        lag = rules["max_compaction_lag"]
        lag["now"], lag["state"], lag["next"] = {}, "blocked", None
        lag["blocked_by"] = [_cause("cleaner_not_visible", CLEANER_NOT_VISIBLE)]
    if not segment_source and not view.segments:
        for r in rules.values():
            if r["state"] != "off":
                r["blocked_by"].insert(0, _cause("no_segment_source", NO_SEGMENT_SOURCE))
                r["state"], r["next"] = "blocked", None
    if excluded:  # the controller plans nothing here and sends nothing: no rule has a next step
        why = f"compactd never acts on this topic: {excluded}"
        for r in rules.values():
            if r["state"] != "off":
                if not any(b["cause"] == "topic_excluded" for b in r["blocked_by"]):
                    r["blocked_by"].append(_cause("topic_excluded", why))
                r["state"], r["next"] = "blocked", None
    if view_cap is not None:
        _view_horizon(rules, view_cap, view.log_start)
    steps = [r["next"] for r in rules.values() if r["next"]]
    oldest = facts.oldest
    overdue, blocked_bytes, blocked_offsets = facts.worst
    return {
        "partition": view.key,
        "topic": view.topic,
        "number": view.partition,
        "now": now,
        "log_start": view.log_start,
        "closed_segments": facts.live[0],
        "bytes": facts.live[1],
        "oldest_segment": None
        if oldest is None
        else {"base_offset": oldest[0], "end_offset": oldest[1], "closed_at": oldest[4]},
        "excluded": excluded,
        "dry_run": {"value": th.dry_run, "scope": dry_src},
        "gate": _gate_report(gate),
        "rules": rules,
        "last_action": _rec(last),
        "deadline": deadline,
        "next": min(steps, key=lambda s: s["at"]) if steps else None,
        "worst": {"overdue_ms": overdue, "blocked_bytes": blocked_bytes, "blocked_offsets": blocked_offsets},
    }


def worst_first(explanation: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Most overdue compaction first, then most bytes and offsets blocked, then partition number."""
    w = explanation["worst"]
    return (-w["overdue_ms"], -w["blocked_bytes"], -w["blocked_offsets"], explanation["number"])


# ---- text ---------------------------------------------------------------------------------------


def _dur(ms: int) -> str:
    """A duration for people: 250ms, 45s, 12m30s, 3h05m, 2d04h."""
    ms = abs(int(ms))
    s = ms // 1000
    if s == 0:
        return f"{ms}ms"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _at(ts: int, now: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts / 1000))
    if ts == now:
        return f"{when} (now)"
    return f"{when} ({_dur(now - ts)} ago)" if ts < now else f"{when} (in {_dur(ts - now)})"


def _size(n: int) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _span_text(s: Mapping[str, int]) -> str:
    return f"[{s['from']}, {s['to']}) {s['offsets']} offsets, {_size(s['bytes'])}"


def _describe(rec: Mapping[str, Any], now: int) -> str:
    target = f" <{rec['before_offset']}" if "before_offset" in rec else ""
    dry = " (dry run)" if rec["dry_run"] and rec["status"] != "dry_run" else ""
    answered = rec["detail"].get("answered_at")
    tail = f", answered {_at(answered, now)}" if answered else ""
    return (
        f"{rec['action']}{target} ({rec['reason']}) {rec['status']}{dry}, decided {_at(rec['decided_at'], now)}{tail}"
    )


SHORT = {
    "lowest_group": "group {group}",
    "group_without_position": "a counted group without a position",
    "no_counted_group": "no counted group",
    "gate_closed": "the readiness gate",
    "dry_run": "dry.run",
    "held_by_cap": "a cap",
    "backoff": "a backoff",
    "skipped": "a send-time check",
    "topic_excluded": "the topic's exclusion",
    "view_horizon": "the compacted view's horizon",
    "no_segment_source": "no segment source",
}


GROUP_CAUSES = ("lowest_group", "group_without_position", "no_counted_group")


def _headline(e: Mapping[str, Any]) -> str:
    """The answer in one line: how overdue compaction is, and how much data what holds back (the groups hold back
    what is old enough beyond the minimum; the gate, dry.run, a cap or a backoff hold what is deletable now)."""
    rules = e["rules"]
    parts: list[str] = []
    lag = rules["max_compaction_lag"]
    if lag["state"] != "off" and (lag["now"].get("delay_ms") or 0) > 0:
        parts.append(f"compaction overdue by {_dur(lag['now']['delay_ms'])}")
    for b in lag["blocked_by"]:
        if b["cause"] in ("cleaner_not_visible", "no_segment_source"):
            parts.append(f"compaction unknown: {b['cause'].replace('_', ' ')}")
    seen: set[str] = set()
    for name in ("consumed_retention", "forced_retention"):
        r = rules[name]
        for b in r["blocked_by"]:
            span = r["held_back"] if b["cause"] in GROUP_CAUSES else r["frees"]
            if b["cause"] not in SHORT or not span or b["cause"] in seen:
                continue
            seen.add(b["cause"])
            who = SHORT[b["cause"]].format(**b)
            parts.append(f"{span['offsets']} offsets ({_size(span['bytes'])}) held by {who}")
    if e["excluded"] and not parts:
        parts.append(f"excluded: {e['excluded']}")
    return "; ".join(parts) or "nothing held back"


def format_text(e: Mapping[str, Any]) -> str:
    """One screen: a headline, the partition's context, a short block per rule, the last and next action."""
    now = e["now"]
    gate = e["gate"]
    if gate["open"] is None:
        gate_line = gate["why"]
    else:
        since = f" since {_at(gate['since'], now)}" if gate.get("since") else ""
        gate_line = ("open" if gate["open"] else "CLOSED") + since + (f": {gate['why']}" if gate["why"] else "")
    lines = [
        f"{e['partition']} — {_headline(e)}",
        f"  topic     {'excluded: ' + e['excluded'] if e['excluded'] else 'acted on'}; "
        f"dry.run {str(e['dry_run']['value']).lower()} [{e['dry_run']['scope']}]",
        f"  gate      {gate_line}",
        f"  log       start {e['log_start']}; {e['closed_segments']} closed segments, {_size(e['bytes'])}"
        + (f"; next evaluation {_at(e['deadline'], now)}" if e["deadline"] is not None else ""),
    ]
    for name, r in e["rules"].items():
        th = r["threshold"]
        value = "off" if th["value"] is None else _dur(th["value"])
        lines.append(f"  {name.replace('_', ' '):<20} {value} [{th['scope']}]  {r['state']}")
        if r["state"] == "off":
            continue
        n = r["now"]
        if name == "max_compaction_lag":
            if not n:  # nothing known of the cleaner: the cause below says why
                pass
            elif n["earliest_uncompacted_ts"] is None:
                lines.append(f"    nothing dirty (cleaned up to {n['cleaned_up_to']})")
            elif n["delay_ms"] <= 0:
                seg = n["dirty_segment"]
                lines.append(
                    f"    oldest dirty segment [{seg['base_offset']}, {seg['end_offset']}) uncompacted for "
                    f"{_dur(seg['dirty_for_ms'])}; {n['dirty_segments']} dirty, {_size(n['dirty_bytes'])}"
                )
        else:
            if name == "consumed_retention" and n["min_committed"] is not None:
                lines.append(f"    min committed {n['min_committed']} over {n['counted_groups']} counted groups")
            seg = e["oldest_segment"]
            if seg and not r["frees"] and r["state"] == "waiting":
                lines.append(
                    f"    oldest closed segment [{seg['base_offset']}, {seg['end_offset']}) closed "
                    f"{_dur(now - seg['closed_at'])} ago"
                )
        for b in r["blocked_by"]:
            lines.append(f"    {'overdue' if b['cause'] == 'dirty_segment' else 'blocked'}: {b['why']}")
        if r.get("covered_by"):
            c = r["covered_by"]
            lines.append(f"    covered: {c['rule'].replace('_', ' ')} deletes further, up to {c['before_offset']}")
        if r.get("frees"):
            lines.append(f"    frees {_span_text(r['frees'])}")
        if r.get("held_back"):
            lines.append(f"    held back {_span_text(r['held_back'])}")
        if r["action"]:
            lines.append(f"    action: {_describe(r['action'], now)}")
        if r["next"]:
            lines.append(f"    next: {_at(r['next']['at'], now)}: {r['next']['what']}")
    if e.get("reset"):
        reset = e["reset"]
        lines.append(f"  reset     {_at(reset['at'], now)}: topic re-created ({reset['why']}); state re-learned since")
    if e.get("unlisted_groups"):
        u = e["unlisted_groups"]
        lines.append(
            f"  groups    {', '.join(u['groups'])} counted here but not listed by the cluster at "
            f"{_at(u['at'], now)} (no Describe ACL, or gone): the cluster cannot vouch for them"
        )
    if e.get("compacted_view"):
        lines.append(f"  view      {_view_text(e['compacted_view'])}")
    lines.append(f"  last      {_describe(e['last_action'], now) if e['last_action'] else 'no action yet'}")
    nxt = e["next"]
    lines.append(f"  next      {_at(nxt['at'], now)}: {nxt['what']}" if nxt else "  next      nothing scheduled")
    return "\n".join(lines)


def _view_text(v: Mapping[str, Any]) -> str:
    head = f"generation {v['generation']}, horizon {v['horizon']}"
    taken = v.get("retention_takeover")
    if taken:
        was = taken["original"] if taken["original"] is not None else "the broker's default"
        return (
            f"{head}; the source's retention.ms ({was}) is taken over (compaction.retention.takeover): -1 on the "
            f"topic, applied by compactd as forced retention ({_dur(taken['applies_ms'])}) that stops at the horizon"
        )
    if v["source_retention_ms"] is None:
        return head + "; the source has no time retention that compactd could read (retention.ms)"
    left = v["retention_left_ms"]
    if left <= 0:
        return (
            f"{head}; the source's retention.ms ({_dur(v['source_retention_ms'])}) may already have deleted records "
            "beyond the horizon: `compactd compact status TOPIC` names any gap"
        )
    return (
        f"{head}; the source's retention.ms ({_dur(v['source_retention_ms'])}) reaches past the horizon in "
        f"{_dur(left)} at the earliest; a run starts by then{'' if v['run_by_ms'] > 0 else ' (due now)'}"
    )


# ---- IO -----------------------------------------------------------------------------------------


def parse_target(target: str) -> tuple[str, int | None]:
    """`TOPIC/PARTITION` or `TOPIC` (topic names cannot contain `/`)."""
    if "/" in target:
        return parse_partition_key(target)
    if not target:
        raise UsageError("expected TOPIC or TOPIC/PARTITION")
    return target, None


def _chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


LIMIT = 20  # partitions `compactd explain TOPIC` shows unless --limit says otherwise


@dataclass(frozen=True)
class Target:
    """What is the same for every partition explained, read or resolved once per command: a topic's partitions share
    its thresholds unless a partition scope exists, its groups, the gate and the caps."""

    topic: str
    partition: int | None
    layers: Mapping[str, Mapping[str, Any]]
    applied: Mapping[str, AppliedLayer]
    groups: TopicGroups
    gate: dict[str, Any] | None
    caps: Caps  # in_flight is read only when a shown partition has a compaction waiting in the outbox
    own: frozenset[str]
    scoped: frozenset[int]  # partitions with a partition scope of their own
    topic_rules: tuple[Thresholds, dict[str, str], str | None]  # thresholds, their sources, the exclusion
    manifest: Manifest | None = None  # the compacted view's published generation (compaction service), from Redis
    reset: dict[str, Any] | None = None  # the topic's last reset (a re-created topic): {"at", "why", "partitions"}
    unlisted: dict[str, Any] | None = None  # counted groups the cluster did not list at the last delete check
    retention: dict[str, Any] | None = None  # the source's retention.ms as the job last read it: {retention_ms, at}
    cleaner_visible: bool = True  # False with offsets_source admin: the job decides no nudge
    segment_source: bool = True  # False while no segment event has reached the state (health `segments_at`)

    def cap(self, n: int, now: int) -> int | None:
        """Partition n's compacted view horizon, where the topic has a view: no delete passes it."""
        th = self.rules(n)[0]
        return retention_cap(self.manifest, th.compaction_service, n, now, th.compaction_view_grace_ms)

    def rules(self, n: int) -> tuple[Thresholds, dict[str, str], str | None]:
        """Partition n's thresholds, their sources and its exclusion: the topic's unless a partition scope exists."""
        if n not in self.scoped:
            return self.topic_rules
        th = resolve(self.layers, self.topic, n)
        return th, threshold_sources(self.layers, self.applied, self.topic, n), topic_excluded(self.topic, th, self.own)


def read_target(state: RedisState, settings: Settings, target: str) -> Target:
    """Read and resolve what every partition of the target shares. UsageError (exit 2) when compactd has no state
    for the target."""
    topic, partition = parse_target(target)
    applied = {s: AppliedLayer.from_json(v) for s, v in state.config_layers().items()}
    layers = effective_layers(settings.thresholds, applied)  # what the job applies: the file, then config events
    cv = CompactionState(state.r, settings.key_prefix)
    retention = cv.retention(topic)
    taken = Takeover.from_json((retention or {}).get("takeover") or {})
    if taken is not None:  # the source's retention.ms, taken over: applied as forced retention, as the job does
        layers = overlay(layers, [taken])
    groups = state.topic_groups(topic, partition)
    reset = state.reset_cause(topic)
    if not groups.size:
        since = "" if reset is None else f" (reset, re-created: {reset['why']}; it re-learns from its next events)"
        raise UsageError(f"unknown topic {topic!r}: compactd has no state for it{since}")
    if partition is not None and not groups.partitions:
        raise UsageError(
            f"unknown partition {partition_key(topic, partition)}: compactd knows {groups.size} other "
            f"partition(s) of {topic!r}"
        )
    g = resolve_global(layers)
    own = frozenset(settings.own_topics())
    prefix = f"partition:{topic}/"
    scoped = frozenset(int(s[len(prefix) :]) for s in layers if s.startswith(prefix) and s[len(prefix) :].isdigit())
    th = resolve(layers, topic)
    return Target(
        topic, partition, layers, applied, groups, state.gate(), Caps(g.actions_per_second, g.max_concurrent_nudges),
        own, scoped, (th, threshold_sources(layers, applied, topic, None), topic_excluded(topic, th, own)),
        cv.manifest(topic), reset, state.unlisted(topic), retention, settings.offsets_source != "admin",
        "segments_at" in state.health(),
    )  # fmt: skip


def rank(state: RedisState, t: Target, now: int) -> list[int]:
    """The target's partitions worst first, in `worst_first`'s order, from a few numbers per partition read a chunk
    per script call (app/explain_rank.py); no explanation is built here."""
    if t.partition is not None:
        return [t.partition]
    parts = sorted(t.groups.partitions)
    nums = PartitionNumbers.concat([state.partition_numbers(t.topic, list(c)) for c in _chunks(parts, RANK_CHUNK)])
    row = {n: i for i, n in enumerate(parts)}
    deletes = Deletes.of(len(parts), {row[n]: r for n, r in state.live_deletes(t.topic).items() if n in row}, now)

    def ranked(th: Thresholds) -> Thresholds:  # no compaction is decided where the cleaner cannot be seen
        return th if t.cleaner_visible else th.model_copy(update={"max_compaction_lag_ms": None})

    scoped = {
        row[n]: (ranked(th), excluded is not None) for n in t.scoped if n in row for th, _, excluded in [t.rules(n)]
    }
    limits = Limits.of(len(parts), (ranked(t.topic_rules[0]), t.topic_rules[2] is not None), scoped)
    caps = np.array([NONE if (c := t.cap(n, now)) is None else c for n in parts], dtype=np.int64)
    ev = Evaluation.of(nums, limits, now)
    gate_closed = t.gate is not None and not t.gate.get("open")
    return [int(n) for n in nums.partitions[worst_order(ev, deletes, gate_closed, caps)]]


def explanations(state: RedisState, t: Target, partitions: Sequence[int], now: int) -> Iterator[dict[str, Any]]:
    """Explanations of `partitions` in the order given, read a chunk at a time (one round trip per chunk) and
    evaluated a chunk at a time (`rule_facts`)."""
    in_flight: int | None = None
    gate_closed = t.gate is not None and not t.gate.get("open")
    for chunk in _chunks(partitions, CHUNK):
        details = state.partition_details(t.topic, list(chunk), t.groups)
        if in_flight is None and any(_held_compaction(d, now) for d in details):
            in_flight = state.compactions_in_flight()  # once, only when a nudge may be waiting for that cap
        caps = replace(t.caps, in_flight=in_flight)
        rules = [t.rules(d.view.partition) for d in details]
        caps_here = [t.cap(d.view.partition, now) for d in details]
        live_deletes = [next((r for r in d.records if r.action == "delete_records"), None) for d in details]
        facts = rule_facts(
            [(d.view, th, ex is not None, rec, cap)
             for d, (th, _, ex), rec, cap in zip(details, rules, live_deletes, caps_here, strict=True)],
            gate_closed, t.cleaner_visible, now,
        )  # fmt: skip
        for d, (th, src, excluded), cap, f in zip(details, rules, caps_here, facts, strict=True):
            here = groups_here(d, t.groups)
            e = explain_partition(
                d.view, th, src, here, t.gate, d.records, d.last, d.deadline, now, excluded, caps, cap,
                t.cleaner_visible, t.segment_source, f,
            )  # fmt: skip
            e["reset"], e["unlisted_groups"] = t.reset, t.unlisted
            e["compacted_view"] = view_report(t.manifest, t.retention, d.view, now)
            yield e


def iter_explain(
    state: RedisState, settings: Settings, target: str, now: int, limit: int = 0
) -> Iterator[dict[str, Any]]:
    """Explanations of a partition, or of a topic's partitions worst first: its `limit` worst when limit > 0.
    Ranking all partitions costs a few numbers each; only the explanations returned are built. UsageError (exit 2)
    at once when compactd has no state for the target."""
    t = read_target(state, settings, target)
    order = rank(state, t, now)
    return explanations(state, t, order[:limit] if limit > 0 else order, now)


def explain(state: RedisState, settings: Settings, target: str, now: int, limit: int = 0) -> list[dict[str, Any]]:
    """Explanations of a partition, or of a topic's partitions worst first (its `limit` worst when limit > 0)."""
    return sorted(iter_explain(state, settings, target, now, limit), key=worst_first)


def _held_compaction(d: PartitionDetail, now: int) -> bool:
    """Whether the partition has a compaction that only a cap can be holding: in the outbox, not a dry run, not
    backing off. Only then does `_action_status` name compaction.max.concurrent, and need the in-flight count."""
    return any(
        r.action == "compact"
        and r.status == "pending"
        and not r.dry_run
        and not (r.detail.get("retry_at") is not None and int(r.detail["retry_at"]) > now)
        for r in d.records
    )


def groups_here(d: PartitionDetail, groups: TopicGroups) -> GroupsHere:
    """The topic's groups as they stand on one partition."""
    missing: tuple[str, ...] = ()
    if d.positioned is not None:
        missing = tuple(sorted(groups.counted - d.positioned))
    return GroupsHere(d.lowest, missing, groups.assigned, groups.commit_ts)


def _write(
    rows: Iterator[dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    as_json: bool,
    bar: Reporter | None,
    total: int,
) -> None:
    """Each explanation as soon as it is made, a blank line between texts (one JSON object a line with --json)."""
    for i, e in enumerate(rows):
        text = render(e)
        sys.stdout.write(text + "\n" if as_json or i == 0 else "\n" + text + "\n")
        if bar is not None and (i % 500 == 0 or i + 1 == total):
            bar.advance(i + 1, total, f"{i + 1:,}/{total:,} partitions")


def more_line(topic: str, shown: int, total: int) -> str | None:
    """The line after a topic's worst partitions: how many more there are and how to see them (None: none)."""
    if total <= shown:
        return None
    return (
        f"... {total - shown:,} more partition(s) of {topic} rank below these {shown}: "
        f"--limit 0 shows all {total:,}, --limit N the N worst"
    )


def print_explain(settings: Settings, target: str, as_json: bool = False, limit: int = LIMIT) -> None:
    """A partition, or a topic's `limit` worst partitions (all when limit is 0) worst first, each rendered as soon as
    it is made; for a topic, then one line saying how many partitions were left out (on stderr with --json, so that
    stdout stays one JSON object per line)."""
    render: Callable[[dict[str, Any]], str] = json.dumps if as_json else format_text
    state = settings.redis_state()
    state.start()  # one line naming the setting if Redis does not answer
    try:
        with progress(f"explain {target}") as bar:  # on stderr, only on a terminal; gone when it ends
            now = now_ms()
            bar.phase("ranking")
            t = read_target(state, settings, target)
            order = rank(state, t, now)
            shown = order[:limit] if limit > 0 else order
            rows = explanations(state, t, shown, now)
            bar.phase("explaining")
            if limit > 0:  # a screenful: ordered by the figures they show, should Redis have moved since the ranking
                rows = iter(sorted(rows, key=worst_first))
            if not sys.stdout.isatty():  # written to a file or a pipe: count the partitions here meanwhile
                _write(rows, render, as_json, bar, len(shown))
        if sys.stdout.isatty():  # on the terminal the text itself shows the progress, once the line is gone
            _write(rows, render, as_json, None, len(shown))
    finally:
        state.close()
    more = more_line(t.topic, len(shown), len(order)) if t.partition is None else None
    if more is not None and as_json:
        sys.stderr.write(more + "\n")
    elif more is not None:
        sys.stdout.write("\n" + more + "\n")
