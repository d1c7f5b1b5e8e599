"""`compactd explain`'s text: one screen per partition, a headline first (the figures its JSON holds, in words)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from compactd.policy.identity import TRUNCATED


def fmt_dur(ms: int) -> str:
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


def fmt_at(ts: int, now: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts / 1000))
    if ts == now:
        return f"{when} (now)"
    return f"{when} ({fmt_dur(now - ts)} ago)" if ts < now else f"{when} (in {fmt_dur(ts - now)})"


def fmt_size(n: int) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _span_text(s: Mapping[str, int]) -> str:
    return f"[{s['from']}, {s['to']}) {s['offsets']} offsets, {fmt_size(s['bytes'])}"


def _describe(rec: Mapping[str, Any], now: int) -> str:
    target = f" <{rec['before_offset']}" if "before_offset" in rec else ""
    dry = " (dry run)" if rec["dry_run"] and rec["status"] != "dry_run" else ""
    answered = rec["detail"].get("answered_at")
    tail = f", answered {fmt_at(answered, now)}" if answered else ""
    decided = fmt_at(rec["decided_at"], now)
    if floor := rec["detail"].get("floor"):  # the nudge was raised to what the topic allows
        tail += f"; nudged {rec['detail'].get('nudge')}={rec['detail'].get('value')}, the lowest its {floor} allows"
    return f"{rec['action']}{target} ({rec['reason']}) {rec['status']}{dry}, decided {decided}{tail}"


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


def _tombstone_lines(t: Mapping[str, Any], n: Mapping[str, Any], now: int) -> list[str]:
    """When the tombstones held now are gone (KIP-534's two cleaner passes): the later bound first, then the clean part
    (cleaned, removable past its delete horizon, gone at the next clean) and the dirty part (its first pass, then the
    same). Kafka runs that next clean only once new records make the log dirty: every bound holds "if records keep
    arriving". Each line fits 120 columns with the longest times."""
    parts = []
    if t["clean_by"] is not None:
        parts.append(
            f"      cleaned {fmt_at(n['cleaned_at'], now)}, removable after {fmt_at(t['removable_after'], now)}"
        )
        parts.append(
            f"      next clean by {fmt_at(t['clean_by'], now)} (max.compaction.lag.ms), "
            "once new records make the log dirty"
        )
    elif t["clean_time_unknown"]:
        parts.append(
            f"      below offset {n['cleaned_up_to']}: cleaned before compactd kept when; no bound until the next clean"
        )
    if t["first_pass_by"] is not None:
        first, gone_by = fmt_at(t["first_pass_by"], now), fmt_at(t["dirty_by"], now)
        parts.append(f"      not cleaned yet: first pass by {first}, gone by {gone_by}")
    for r in t.get("replicas", []):  # each replica's own cleaner: the cluster's bound is the latest of them
        if not r["reported"]:
            parts.append(f"      replica {r['replica']}: no agent reports its log; its cleaner is unknown, left out")
            continue
        cleaned = "never cleaned" if r["cleaned_up_to"] is None else f"cleaned up to {r['cleaned_up_to']}"
        seen = f" {fmt_at(r['cleaned_at'], now)}" if r["cleaned_at"] is not None else ""
        gone = "no bound" if r["gone_by"] is None else f"gone by {fmt_at(r['gone_by'], now)}"
        late = ", overdue" if r["gone_by"] is not None and r["gone_by"] < now else ""
        slowest = " (the last)" if t.get("slowest_replica") == r["replica"] else ""
        parts.append(f"      replica {r['replica']}: {cleaned}{seen}, {gone}{late}{slowest}")
    if not parts:
        return []
    gone = t["gone_by"]
    bound = "no bound" if gone is None else f"all gone by {fmt_at(gone, now)} if records keep arriving"
    late = ", overdue" if gone is not None and gone < now else ""
    return [f"    tombstones (delete.retention.ms {fmt_dur(t['delete_retention_ms'])}): {bound}{late}", *parts]


def _headline(e: Mapping[str, Any]) -> str:
    """The answer in one line: how overdue compaction is, and how much data what holds back (the groups hold back
    what is old enough beyond the minimum; the gate, dry.run, a cap or a backoff hold what is deletable now)."""
    rules = e["rules"]
    parts: list[str] = []
    lag = rules["max_compaction_lag"]
    if lag["state"] != "off" and (lag["now"].get("delay_ms") or 0) > 0:
        parts.append(f"compaction overdue by {fmt_dur(lag['now']['delay_ms'])}")
    for b in lag["blocked_by"]:
        if b["cause"] in ("cleaner_not_visible", "no_segment_source"):
            parts.append(f"compaction unknown: {b['cause'].replace('_', ' ')}")
    tomb = (lag["now"] or {}).get("tombstones") or {}
    gone = tomb.get("first_gone_by", tomb.get("gone_by"))
    if gone is not None and gone < e["now"]:
        late = tomb.get("soonest_replica")
        where = f" on replica {late}" if late is not None else ""
        parts.append(f"tombstone erasure overdue{where} by {fmt_dur(e['now'] - gone)}")
    seen: set[str] = set()
    for name in ("consumed_retention", "forced_retention"):
        r = rules[name]
        for b in r["blocked_by"]:
            span = r["held_back"] if b["cause"] in GROUP_CAUSES else r["frees"]
            if b["cause"] not in SHORT or not span or b["cause"] in seen:
                continue
            seen.add(b["cause"])
            who = SHORT[b["cause"]].format(**b)
            parts.append(f"{span['offsets']} offsets ({fmt_size(span['bytes'])}) held by {who}")
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
        since = f" since {fmt_at(gate['since'], now)}" if gate.get("since") else ""
        gate_line = ("open" if gate["open"] else "CLOSED") + since + (f": {gate['why']}" if gate["why"] else "")
    lines = [
        f"{e['partition']} — {_headline(e)}",
        f"  topic     {'excluded: ' + e['excluded'] if e['excluded'] else 'acted on'}; "
        f"dry.run {str(e['dry_run']['value']).lower()} [{e['dry_run']['scope']}]",
        f"  gate      {gate_line}",
        f"  log       start {e['log_start']}; {e['closed_segments']} closed segments, {fmt_size(e['bytes'])}"
        + (f"; next evaluation {fmt_at(e['deadline'], now)}" if e["deadline"] is not None else ""),
    ]
    if e.get("tiers"):
        tiers = e["tiers"]
        local = ", ".join(f"{o} (replica {r})" for r, o in sorted(tiers["local_log_start"].items()))
        remote = tiers["remote_only"]
        where = f"offsets {remote['from']}-{remote['to'] - 1} in the remote tier only; " if remote else ""
        lines.append(f"  tiers     {where}local logs from {local}")
    for name, r in e["rules"].items():
        th = r["threshold"]
        value = "off" if th["value"] is None else fmt_dur(th["value"])
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
                    f"{fmt_dur(seg['dirty_for_ms'])}; {n['dirty_segments']} dirty, {fmt_size(n['dirty_bytes'])}"
                )
            if n.get("tombstones"):
                lines += _tombstone_lines(n["tombstones"], n, now)
        else:
            if name == "consumed_retention" and n["min_committed"] is not None:
                lines.append(f"    min committed {n['min_committed']} over {n['counted_groups']} counted groups")
            seg = e["oldest_segment"]
            if seg and not r["frees"] and r["state"] == "waiting":
                lines.append(
                    f"    oldest closed segment [{seg['base_offset']}, {seg['end_offset']}) closed "
                    f"{fmt_dur(now - seg['closed_at'])} ago"
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
            lines.append(f"    next: {fmt_at(r['next']['at'], now)}: {r['next']['what']}")
    if e.get("reset"):
        reset = e["reset"]
        what = "log truncated" if TRUNCATED in reset["why"] else "topic re-created"
        lines.append(f"  reset     {fmt_at(reset['at'], now)}: {what} ({reset['why']}); state re-learned since")
    if e.get("unlisted_groups"):
        u = e["unlisted_groups"]
        lines.append(
            f"  groups    {', '.join(u['groups'])} counted here but not listed by the cluster at "
            f"{fmt_at(u['at'], now)} (no Describe ACL, or gone): the cluster cannot vouch for them"
        )
    if e.get("compacted_view"):
        lines.append(f"  view      {_view_text(e['compacted_view'])}")
    lines.append(f"  last      {_describe(e['last_action'], now) if e['last_action'] else 'no action yet'}")
    nxt = e["next"]
    lines.append(f"  next      {fmt_at(nxt['at'], now)}: {nxt['what']}" if nxt else "  next      nothing scheduled")
    return "\n".join(lines)


def _view_text(v: Mapping[str, Any]) -> str:
    head = f"generation {v['generation']}, horizon {v['horizon']}"
    if v.get("dirty_ratio"):
        head += f" ({v['dirty_ratio']:.0%} of it appended by delta runs since the last rewrite)"
    taken = v.get("retention_takeover")
    if taken:
        was = taken["original"] if taken["original"] is not None else "the broker's default"
        return (
            f"{head}; the source's retention.ms ({was}) is taken over (compaction.retention.takeover): -1 on the "
            f"topic, applied by compactd as forced retention ({fmt_dur(taken['applies_ms'])}) that stops at the horizon"
        )
    if v["source_retention_ms"] is None:
        return head + "; the source has no time retention that compactd could read (retention.ms)"
    left = v["retention_left_ms"]
    if left <= 0:
        return (
            f"{head}; the source's retention.ms ({fmt_dur(v['source_retention_ms'])}) may already have deleted records "
            "beyond the horizon: `compactd compact status TOPIC` names any gap"
        )
    return (
        f"{head}; the source's retention.ms ({fmt_dur(v['source_retention_ms'])}) reaches past the horizon in "
        f"{fmt_dur(left)} at the earliest; a run starts by then{'' if v['run_by_ms'] > 0 else ' (due now)'}"
    )
