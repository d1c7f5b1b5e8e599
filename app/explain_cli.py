"""`compactd explain TOPIC[/PARTITION]`: reads Redis (read-only), ranks, explains, prints.

A topic is ranked first, then explained: `rank` reads a few integers per partition (one read-only script call per
2,000 partitions, lua/explain_rank.lua, returning one string numpy parses) and orders every partition worst first
over arrays (explain/rank.py); `explanations` then reads and builds only the partitions shown, 20 by default
(lua/explain.lua, one round trip per chunk). Building an explanation costs ~100 µs of Python and its text is a
screen: at 100k partitions, doing it for all of them was what made the command take half a minute and print 94 MB.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from compactd.app.progress import Reporter, progress
from compactd.clock import now_ms
from compactd.compaction.manifest import Manifest, retention_cap
from compactd.compaction.store import CompactionState
from compactd.compaction.takeover import Takeover, overlay
from compactd.errors import UsageError
from compactd.explain.model import Caps, GroupsHere, explain_partition, threshold_sources, view_report, worst_first
from compactd.explain.rank import Deletes, rule_facts, worst_order
from compactd.explain.text import format_text
from compactd.keys import parse_partition_key, partition_key
from compactd.model import PartitionNumbers
from compactd.policy.arrays import NONE
from compactd.policy.readers import (
    SHARE_GROUP,
    ReaderHold,
    fold_numbers,
    fold_view,
    holding,
    holds_from_doc,
    holds_on,
)
from compactd.policy.rules import Evaluation, Limits
from compactd.policy.runtime_config import AppliedLayer, effective_layers
from compactd.policy.thresholds import Thresholds, group_counts, resolve, resolve_global, topic_excluded
from compactd.settings import Settings
from compactd.state.redis_store import PartitionDetail, RedisState, TopicGroups

CHUNK = 2000  # partitions explained per Redis round trip
RANK_CHUNK = 2000  # partitions ranked per script call: each call holds Redis for a few tens of ms


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
    holds: tuple[ReaderHold, ...] = ()  # the readers that count on the topic, as the job last read them

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
        tuple(h for h in holds_on(holds_from_doc(state.readers()), topic)
              if h.kind != SHARE_GROUP or group_counts(h.reader, th)),
    )  # fmt: skip


def rank(state: RedisState, t: Target, now: int) -> list[int]:
    """The target's partitions worst first, in `worst_first`'s order, from a few numbers per partition read a chunk
    per script call (explain/rank.py); no explanation is built here."""
    if t.partition is not None:
        return [t.partition]
    parts = sorted(t.groups.partitions)
    nums = PartitionNumbers.concat([state.partition_numbers(t.topic, list(c)) for c in _chunks(parts, RANK_CHUNK)])
    nums = fold_numbers(nums, t.holds)  # readers count like groups, as in the job's plans
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
        details = [with_readers(d, t.holds) for d in state.partition_details(t.topic, list(chunk), t.groups)]
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
            here = groups_here(d, t.groups, t.holds)
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


def groups_here(d: PartitionDetail, groups: TopicGroups, holds: tuple[ReaderHold, ...] = ()) -> GroupsHere:
    """The topic's groups as they stand on one partition, with the readers that count like groups (named by their
    label: `share group sg1`, `reader etl`)."""
    missing: tuple[str, ...] = ()
    if d.positioned is not None:
        missing = tuple(sorted(groups.counted - d.positioned))
    rows = holding(holds, d.view.partition)
    missing += tuple(label for label, pos in rows if pos is None)
    return GroupsHere(d.lowest, missing, groups.assigned, groups.commit_ts, frozenset(label for label, _ in rows))


def with_readers(d: PartitionDetail, holds: tuple[ReaderHold, ...]) -> PartitionDetail:
    """A partition's detail with the readers folded in: its view's minimum, and the readers among its lowest."""
    if not holds:
        return d
    known = tuple((label, pos) for label, pos in holding(holds, d.view.partition) if pos is not None)
    lowest = tuple(sorted(d.lowest + known, key=lambda g: (g[1], g[0])))
    return replace(d, view=fold_view(d.view, holds), lowest=lowest)


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
