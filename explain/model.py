"""`compactd explain`'s explanation of one partition, per rule: why it has not been compacted or deleted, and what
happens next. Pure (tests need no Redis).

Per rule (max compaction lag, consumed retention, forced retention): the threshold and the scope that sets it, the
value now, what blocks it (the lowest counted group and when it last committed, a counted group without a position,
the readiness gate, a dirty segment and its age, a topic exclusion, a cap or a backoff), what it would free, its live
action and the next expected one; under max compaction lag, when the tombstones the partition holds now are gone
(KIP-534's two cleaner passes). What the rules decide, free and hold back is the partition's row of its chunk's
evaluation (`explain/rank.py` `rule_facts`, policy/rules.py): nothing here derives a rule again; what is added is why,
in words. One function per rule section, and the causes they share; the text is explain/text.py, reading Redis
and the command app/explain_cli.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compactd.compaction.manifest import RETENTION_SHARE, Manifest, retention_left
from compactd.explain.rank import RowFacts, rule_facts
from compactd.explain.text import fmt_at, fmt_dur
from compactd.model import ActionRecord, PartitionView
from compactd.policy.arrays import NONE
from compactd.policy.plan import NOT_CAUGHT_UP
from compactd.policy.rules import answered_at, view_horizon
from compactd.policy.runtime_config import AppliedLayer
from compactd.policy.thresholds import Thresholds, key_scope

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
    readers: frozenset[str] = frozenset()  # the names above that are readers counted like groups, by their label


@dataclass(frozen=True)
class Caps:
    """The global caps on sending, and how many compaction nudges are in flight (None: not read)."""

    actions_per_second: float = 10.0
    max_concurrent: int = 10
    in_flight: int | None = None


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
    facts: RowFacts,
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
        why = f"in the outbox for {fmt_dur(now - since)}, held by {cap}"
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
    view: PartitionView, th: Thresholds, src: str, facts: RowFacts, rec: ActionRecord | None, action: ActionFn, now: int
) -> dict[str, Any]:
    """KIP-354: the oldest dirty segment, how overdue it is, and the compaction's progress."""
    lag = th.max_compaction_lag_ms
    out: dict[str, Any] = {"threshold": {"value": lag, "scope": src}, "now": {}, "action": _rec(rec)}
    if lag is None:
        return {**out, "state": "off", "blocked_by": [], "next": None}
    earliest = facts.earliest
    out["now"] = {
        "cleaned_up_to": view.cleaned_up_to,
        "cleaned_at": view.cleaned_at,
        "dirty_segments": facts.dirty[0],
        "dirty_bytes": facts.dirty[1],
        "earliest_uncompacted_ts": earliest,
        "tombstones": _tombstones(view, th, facts),
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
        f"{fmt_dur(now - earliest)}, {fmt_dur(facts.overdue)} past {fmt_dur(lag)}"
    )
    state, more, nxt = action(rec, True, "compact")
    blockers = [_cause("dirty_segment", why, **seg, dirty_for_ms=now - earliest, overdue_ms=facts.overdue), *more]
    return {**out, "state": state or "due", "blocked_by": blockers, "next": nxt}


def _tombstones(view: PartitionView, th: Thresholds, facts: RowFacts) -> dict[str, Any]:
    """When the tombstones the partition holds now are gone (KIP-534's two cleaner passes, `rules.Erasure`): the clean
    part's delete horizon and the clean after it, the dirty part's first pass and the one after, and the later of the
    two (`gone_by`, the metric's deadline). `clean_time_unknown`: the log has a clean part whose clean compactd saw
    before it kept the time, so it has no bound until the next clean."""
    e = facts.erasure
    out = {
        "delete_retention_ms": th.delete_retention_ms,
        "removable_after": e["removable_after"],
        "clean_by": e["clean_by"],
        "first_pass_by": e["first_pass"],
        "dirty_by": e["dirty_by"],
        "gone_by": e["by"],
        "clean_time_unknown": view.cleaned_at is None and (view.cleaned_up_to or 0) > view.log_start,
    }
    if view.replicas:  # every replica's cleaner erases on its own: the tombstones are gone once the last one has
        out["replicas"] = [
            {"replica": r.replica, "reported": r.reported, "cleaned_up_to": r.cleaned_up_to, "cleaned_at": r.cleaned_at,
             "gone_by": facts.replica_erasure.get(r.replica)}
            for r in view.replicas
        ]  # fmt: skip
        out["slowest_replica"] = facts.slowest
        out["first_gone_by"] = e["first_by"]  # the earliest replica's bound: past it, that replica is late
        out["soonest_replica"] = e["soonest"]
    return out


def _tiers(view: PartitionView) -> dict[str, Any] | None:
    """Where the partition's offsets are, as its replicas' agents report their local logs: below every replica's
    oldest local segment (and above the log start) they are in the remote tier only (tiered storage, KIP-405), which
    a DeleteRecords deletes like the rest. None where no agent reports a local log."""
    local = {r.replica: r.local_log_start for r in view.replicas if r.local_log_start is not None}
    if not local:
        return None
    lowest = min(local.values())
    remote = {"from": view.log_start, "to": lowest} if lowest > view.log_start else None
    return {"log_start": view.log_start, "local_log_start": local, "remote_only": remote}


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
        "reader": name in groups.readers,
    }


def _named(g: Mapping[str, Any]) -> str:
    """A group as `group billing`; a reader by its label (`share group sg1`, `reader etl`)."""
    return g["group"] if g.get("reader") else f"group {g['group']}"


def _who(g: Mapping[str, Any], now: int) -> str:
    """A group without a position here, and what compactd knows of it."""
    seen = "no commit seen" if g["last_commit"] is None else f"last commit elsewhere {fmt_at(g['last_commit'], now)}"
    if g.get("reader"):
        return f"{g['group']} (its position cannot be read, or it has none here yet)"
    return f"{_named(g)} ({'assigned, ' if g['assigned'] else ''}{seen})"


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
        last = "no commit time seen" if g["last_commit"] is None else f"last commit {fmt_at(g['last_commit'], now)}"
        if g.get("reader"):
            last = "a reader: it commits no group offsets"
        causes.append(_cause("lowest_group", f"{_named(g)} at offset {g['offset']}, {last}", **g))
    return info, causes


def _deletion(
    rule: str,
    view: PartitionView,
    th: Thresholds,
    src: str,
    facts: RowFacts,
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
        why = f"readiness gate closed: {gate.get('why', '')}" + (f", since {fmt_at(since, now)}" if since else "")
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
    pv = manifest.partitions.get(str(view.partition))
    return {
        "generation": manifest.generation,
        "horizon": horizon,
        # the share of the view's range that delta runs appended since its last rewrite (readers read it too)
        "dirty_ratio": 0.0 if pv is None else round(pv.dirty, 4),
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
    facts: RowFacts | None = None,
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
        rules["max_compaction_lag"]["now"].pop("tombstones", None)  # nor does any nudge bound their erasure
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
        "tiers": _tiers(view),
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
