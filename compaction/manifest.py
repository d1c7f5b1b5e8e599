"""The manifest of a topic's compacted view, and the pure rules that read it: what a run covers, what is garbage,
how far the source may be deleted, and when a run is due.

The manifest names the published generation: per partition the horizon and the view range that holds, in source
offset order, the winner of every live key below that horizon. Publishing a generation is writing its manifest (a
record keyed by topic on the compacted manifest topic), so a run that dies before that leaves the previous generation
readable and its own writes unpublished: the view range below the published one is garbage that the next publish
deletes once `compaction.view.grace.ms` has passed, and what a dead run wrote above it is overwritten by nothing and
dropped by the next publish's garbage collection in turn.

The previous generation's horizons stay in the manifest while its readers may still be reading it (the grace), so
source retention stays below both: a reader of either generation finds the source tail it needs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from compactd.compaction.strategy import Strategy
from compactd.policy.identity import written_after


@dataclass(frozen=True)
class ViewPartition:
    """One source partition in a view generation: how far it is compacted, and where its records are in the view."""

    horizon: int  # source offsets below it are compacted into the view
    view_start: int  # the generation's records are view offsets [view_start, view_end)
    view_end: int
    records: int = 0  # records written (live keys + kept tombstones + kept null keys)
    keys: int = 0  # live keys
    tombstones: int = 0
    bytes: int = 0
    # the earliest time a record beyond the horizon may have been written: bounds its age for max.compaction.lag.ms
    beyond_since: int = 0
    source_low: int = 0  # the source's log start when the run began: a later one below it is another log
    # the last full rewrite's records are [view_start, base_end); delta runs appended [base_end, view_end) after it.
    # -1: written before delta runs existed, a full rewrite (`base_end` = `view_end`)
    base_end: int = -1
    base_at: int = 0  # when the last full rewrite ran: its tombstones' clock (delete.retention.ms)
    # the source partition's leader epoch when the run read it: every record below the horizon was written under it
    # or an earlier one, and a record there of a later epoch was written after (an unclean leader election truncated
    # the log under the view: `written_again`). -1: not known (a manifest from before, or a broker that says none)
    epoch: int = -1

    @property
    def base(self) -> int:
        """Where the last full rewrite's records end in the view."""
        return self.view_end if self.base_end < 0 else self.base_end

    @property
    def dirty(self) -> float:
        """The share of the range that delta runs appended (0: one record per key, as the last rewrite wrote it)."""
        size = self.view_end - self.view_start
        return (self.view_end - self.base) / size if size > 0 else 0.0


@dataclass(frozen=True)
class Gap:
    """Source offsets [start, end) of a partition lost before any generation held them: the source's own retention
    (or anyone's deleteRecords) passed the published horizon. Published only with `compact --accept-gap`, and then
    recorded in every later manifest of the lineage."""

    partition: int
    start: int
    end: int
    at: int = 0  # when the gap was accepted (epoch ms)
    accepted_by: str = ""  # who accepted it: user@host


@dataclass(frozen=True)
class Previous:
    """The generation this one replaced, kept readable until `retired_at + compaction.view.grace.ms`."""

    generation: int
    retired_at: int
    horizons: dict[str, int]


@dataclass(frozen=True)
class Manifest:
    topic: str
    view: str
    generation: int  # 0: the view is created and claimed, nothing published yet
    strategy: str = "offset"
    strategy_header: str | None = None
    strategy_header_format: str = "long"
    strategy_tombstone: str = "version"  # `compaction.strategy.tombstone`: version (KIP-280) or latest
    partitions: dict[str, ViewPartition] = field(default_factory=dict)
    started_at: int = 0
    finished_at: int = 0
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    keys: int = 0
    tombstones: int = 0
    null_keys: int = 0
    created_view: bool = True  # compactd writes only into a view topic it created itself
    previous: Previous | None = None
    # the run that published it (its lease token): of two manifests of one generation, the first on the topic wins
    run: str = ""
    lineage: int = 1  # a new lineage starts from the source alone: the source was re-created, or `--rebuild`
    lineage_why: str = ""
    source_id: str | None = None  # the source's topic ID (KIP-516) when the cluster reports one
    gaps: tuple[Gap, ...] = ()
    # the partitions whose delta this run appended to the previous generation's range; the others it rewrote
    appended: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Manifest:
        data = dict(raw)
        data["partitions"] = {str(p): ViewPartition(**v) for p, v in (data.get("partitions") or {}).items()}
        prev = data.get("previous")
        data["previous"] = None if not prev else Previous(**prev)
        data["gaps"] = tuple(Gap(**g) for g in data.get("gaps") or ())
        data["appended"] = tuple(int(p) for p in data.get("appended") or ())
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def loads(cls, raw: bytes | str) -> Manifest:
        return cls.from_json(json.loads(raw))

    @property
    def strategy_rule(self) -> Strategy:
        return Strategy.of(
            self.strategy,  # type: ignore[arg-type]
            self.strategy_header,
            self.strategy_header_format,  # type: ignore[arg-type]
            self.strategy_tombstone,  # type: ignore[arg-type]
        )

    def horizon(self, partition: int) -> int:
        """Source offsets below it are in the view; 0 when nothing was published for the partition."""
        pv = self.partitions.get(str(partition))
        return 0 if pv is None else pv.horizon

    def horizons(self) -> dict[str, int]:
        return {p: pv.horizon for p, pv in self.partitions.items()}


@dataclass(frozen=True)
class RunRange:
    """What one run reads for one partition: the previous generation's view range and the source delta."""

    partition: int
    view_start: int
    view_end: int
    source_start: int
    horizon: int  # the new horizon: the delta is source offsets [source_start, horizon)
    # the delta's winners are appended after the previous generation's range, which is not read (`delta_partitions`)
    append: bool = False
    # view records of source offsets at or past it are not read (-1: all are): the source below the horizon was
    # written again from there (`written_again`), and the delta is read from the source's log start instead
    view_below: int = -1


def plan_ranges(
    previous: Manifest | None,
    source_low: Mapping[int, int],
    stable: Mapping[int, int],
    young_from: Mapping[int, int],
    append: frozenset[int] = frozenset(),
    rewritten: Mapping[int, int] | None = None,
) -> list[RunRange]:
    """Per partition, what the next generation is made of.

    `stable`: the last stable offset of each partition when the run starts (read_committed: an open transaction's
    records are beyond it). `young_from`: the first offset whose record is younger than `min.compaction.lag.ms`
    (absent when none is). The horizon is the lower of the two, never below the previous horizon; the delta starts
    at the previous horizon, or at the source's first offset for a partition never compacted. `append`: the
    partitions whose delta is appended to the previous generation (`delta_partitions`). `rewritten`: the
    partitions an unclean leader election wrote again below the horizon, each with the source offset from which the
    view's records are not kept (`rebuild_cut`): their delta is the source from its log start, and the horizon
    never goes below what the source holds now.
    """
    rewritten = rewritten or {}
    out = []
    for p in sorted(stable):
        pv = previous.partitions.get(str(p)) if previous is not None else None
        start = pv.horizon if pv is not None else source_low.get(p, 0)
        cut = rewritten.get(p, -1) if pv is not None else -1
        if cut >= 0:
            start = source_low.get(p, 0)
        new = stable[p]
        if p in young_from and young_from[p] >= 0:
            new = min(new, young_from[p])
        new = max(new, start)
        vs, ve = (pv.view_start, pv.view_end) if pv is not None else (0, 0)
        out.append(RunRange(p, vs, ve, start, new, pv is not None and p in append and cut < 0, cut))
    return out


def appends_winners(strategy: Strategy) -> bool:
    """Whether a delta's winner of a key is always the key's winner over base and delta, so that appending it makes
    the view's last record of the key its KIP-280 winner.

    The view is a Kafka topic, read by tools that are not compactd (a KTable, a Connect sink, ksqlDB): they take the
    last record of a key in log order as its value. Only `offset` makes the delta's winner beat the base's whatever
    it holds (a later offset always wins, under either tombstone rule). Under `timestamp` or `header` a delta's
    winner may rank below the base's (a late record of a lower version, a late record for a deleted key), and
    appended after it, it would be what those readers read: a wrong value, or a deleted key back. Such runs rewrite.
    """
    return strategy.kind == "offset"


def delta_partitions(
    published: Manifest | None,
    strategy: Strategy,
    view_high: Mapping[int, int],
    now: int,
    delete_retention_ms: int,
    dirty_ratio: float,
) -> frozenset[int]:
    """The partitions whose next generation is the previous one plus the delta's winners appended, read by nobody
    but the delta: a run over them costs the delta, not the view.

    Not when (a full rewrite instead):
    - there is no published generation of this lineage, or it was built under another strategy or tombstone rule,
      or a delta's winner may lose to the base's (`appends_winners`: only `offset` appends);
    - the view has records above the generation's range (a dead or fenced run's writes): the range would not be
      one contiguous run of the view any more;
    - the records the deltas already appended are `dirty_ratio` of the generation's range or more
      (`compaction.view.dirty.ratio`, as Kafka's `min.cleanable.dirty.ratio`; 0: every run rewrites): readers read
      every superseded record until a rewrite;
    - the partition holds tombstones and its last full rewrite is `delete.retention.ms` old: only a rewrite drops
      the expired ones.
    """
    if published is None or published.generation <= 0 or dirty_ratio <= 0 or not appends_winners(strategy):
        return frozenset()
    if published.strategy_rule != strategy:
        return frozenset()
    out = set()
    for p, pv in published.partitions.items():
        part = int(p)
        if view_high.get(part, -1) != pv.view_end:
            continue
        if pv.view_end == pv.view_start or pv.dirty >= dirty_ratio:
            continue
        if pv.tombstones > 0 and now >= pv.base_at + delete_retention_ms:
            continue
        out.add(part)
    return frozenset(out)


def find_gaps(published: Manifest | None, source_low: Mapping[int, int]) -> list[Gap]:
    """Partitions whose source lost offsets beyond the published horizon: a run over them would resurrect deleted
    keys and keep superseded values (what the lost records replaced or deleted is gone), so it must not publish."""
    if published is None or published.generation <= 0:
        return []
    return [
        Gap(int(p), pv.horizon, source_low[int(p)])
        for p, pv in sorted(published.partitions.items(), key=lambda kv: int(kv[0]))
        if source_low.get(int(p), 0) > pv.horizon
    ]


def source_changed(
    published: Manifest | None,
    count: int,
    low: Mapping[int, int],
    high: Mapping[int, int],
    topic_id: str | None,
) -> str | None:
    """Why the source is no longer the log the published generation was built from (None: nothing says so): its
    topic ID changed, it has fewer partitions, or a partition's log ends below the horizon or starts below the log
    start it had. A view of another log is never mixed with this one.

    A log start going back is evidence only where the topic ID cannot say: a broker killed before it checkpointed a
    deleteRecords' log start (`log.flush.start.offset.checkpoint.interval.ms`, a minute by default) starts again
    with the older one (`policy/identity.py`). Same topic ID, same log: read as another log, the new lineage would
    be built from the source alone and every key that lived only in the view would be lost."""
    if published is None or published.generation <= 0:
        return None
    if topic_id and published.source_id and topic_id != published.source_id:
        return f"topic ID {published.source_id} is now {topic_id}"
    same_log = bool(topic_id and published.source_id)  # and equal: another ID returned above
    had = 1 + max((int(p) for p in published.partitions), default=-1)
    if count < had:
        return f"{count} partitions, generation {published.generation} had {had}"
    for p, pv in sorted(published.partitions.items(), key=lambda kv: int(kv[0])):
        if high.get(int(p), 0) < pv.horizon:
            return f"partition {p} ends at {high.get(int(p), 0)}, below the horizon {pv.horizon}"
        if low.get(int(p), 0) < pv.source_low and not same_log:
            return f"partition {p} starts at {low.get(int(p), 0)}, below its log start {pv.source_low} then"
    return None


def epoch_moved(published: Manifest | None, epochs: Mapping[int, int]) -> list[int]:
    """The partitions whose leader epoch is later than when the published generation read them: only there may the
    log below the horizon have been written again (an unclean leader election); a clean one never truncates below
    the high watermark, which the horizon never passes. Each is looked into by the last record below its horizon
    (`written_again`); the others cost nothing."""
    if published is None or published.generation <= 0:
        return []
    return [
        int(p)
        for p, pv in sorted(published.partitions.items(), key=lambda kv: int(kv[0]))
        if pv.epoch >= 0 and pv.horizon > 0 and epochs.get(int(p), -1) > pv.epoch
    ]


def written_again(pv: ViewPartition, below: tuple[int, int] | None) -> bool:
    """Whether `below`, (offset, epoch) of the last record below the horizon now, was written after the generation
    read the partition: under a later leader epoch. Then an unclean leader election truncated the log under the
    view and a new leader wrote it again: the view holds records no reader of the source will see, and lacks the
    new ones (policy/identity.py `written_after`)."""
    return written_after(pv.epoch, below)


def written_again_line(published: Manifest, again: Mapping[int, int]) -> str:
    """One line for the partitions `written_again` found: partition -> the offset of its last record below the
    horizon, of a later leader epoch."""
    parts = ", ".join(
        f"{p} (offset {off} below the horizon {published.horizon(p)} is of an epoch after "
        f"{published.partitions[str(p)].epoch})"
        for p, off in sorted(again.items())
    )
    return f"an unclean leader election wrote the source again under the view: partition {parts}"


def rebuild_cut(low: int, first_later: int, at_log_start: bool) -> int | None:
    """The source offset below which the view's records still hold, when the log was written again from
    `first_later` (the first record of a later epoch, `at_log_start` when it is the first record the log holds):
    what the view holds below the source's log start (the source lost it), or below `first_later` when the log
    start is past it. None when the log holds no record of the old epoch: where it was cut cannot be known, and
    any view record from the log start down may be of the lost epoch (a run publishes only with `--accept-gap`,
    keeping those below the log start, or `--rebuild`)."""
    if at_log_start:
        return None
    return min(low, first_later)


def garbage_below(manifest: Manifest, now: int, grace_ms: int) -> dict[int, int]:
    """View offsets below which every record is garbage (an older generation, or a dead run's writes) and may be
    deleted now: the published generation's start, once the previous generation's readers have had the grace."""
    if manifest.generation <= 0:
        return {}
    if manifest.previous is not None and now < manifest.previous.retired_at + grace_ms:
        return {}
    return {int(p): pv.view_start for p, pv in manifest.partitions.items()}


def retention_cap(manifest: Manifest | None, service_on: bool, partition: int, now: int, grace_ms: int) -> int | None:
    """The highest source offset a delete on this partition may reach so that view + tail keep every live key.

    None: no view, no cap. A topic with the service on and nothing published yet is capped at 0 (nothing may go).
    While the previous generation is in its grace, its horizon caps too: its readers read the source from there.
    """
    if manifest is None or manifest.generation <= 0:
        return 0 if service_on else None
    cap = manifest.horizon(partition)
    prev = manifest.previous
    if prev is not None and now < prev.retired_at + grace_ms:
        cap = min(cap, prev.horizons.get(str(partition), 0))
    return cap


RETENTION_SHARE = 0.5  # a run starts once records beyond the horizon may be this share of retention.ms old


def retention_left(
    manifest: Manifest | None, partition: int, retention_ms: int | None, now: int, beyond: bool
) -> int | None:
    """How long until the source's `retention.ms` may delete a record beyond the partition's horizon (None: no
    view of it, or no time retention). `beyond`: records are known beyond the horizon; the oldest of them was written
    no earlier than the partition's `beyond_since`. With none, the next record has the whole retention ahead."""
    if manifest is None or manifest.generation <= 0 or retention_ms is None or retention_ms < 0:
        return None
    pv = manifest.partitions.get(str(partition))
    if pv is None:
        return None
    return retention_ms - max(0, now - pv.beyond_since) if beyond else retention_ms


@dataclass(frozen=True)
class RunDue:
    """Whether a compaction run of a topic is due now, and why (what lies beyond the horizon, how old, how long the
    source's retention leaves)."""

    due: bool
    why: str
    beyond_bytes: int = 0
    beyond_records: int = 0
    beyond_age_ms: int = 0
    retention_left_ms: int | None = None  # until the source's retention.ms may reach past the horizon


def run_due(
    manifest: Manifest | None,
    stable: Mapping[int, int],
    now: int,
    threshold_bytes: int | None,
    max_lag_ms: int | None,
    beyond_bytes: int | None = None,
    retention_ms: int | None = None,
) -> RunDue:
    """Whether the controller starts a run for a topic with the service on.

    Bytes beyond the horizon come from segment events when the caller has them (`beyond_bytes`), else they are
    estimated from the records beyond the horizon times the last run's bytes per record. A topic never compacted
    is due at once (there is no view to read yet); a topic whose records beyond the horizon may be older than
    `max.compaction.lag.ms` is due whatever the bytes.
    """
    if manifest is None or manifest.generation <= 0:
        records = sum(stable.values())
        return RunDue(records > 0, "no generation yet" if records else "source is empty", beyond_records=records)
    records = sum(max(0, hi - manifest.horizon(p)) for p, hi in stable.items())
    if records == 0:  # the source's retention reaches the next record beyond the horizon retention.ms after it
        return RunDue(False, "nothing beyond the horizon", retention_left_ms=retention_ms)
    per_record = manifest.bytes_in / manifest.records_in if manifest.records_in else 0.0
    nbytes = beyond_bytes if beyond_bytes is not None else int(records * per_record)
    since = [
        manifest.partitions[str(p)].beyond_since
        for p, hi in stable.items()
        if str(p) in manifest.partitions and hi > manifest.horizon(p)
    ]
    age = max(0, now - min(since)) if since else 0
    left = None if retention_ms is None else retention_ms - age
    if any(str(p) not in manifest.partitions and hi > 0 for p, hi in stable.items()):
        return RunDue(True, "a partition with records has no view yet", 0, records, age, left)
    if max_lag_ms is not None and age >= max_lag_ms:
        why = f"records beyond the horizon for {age} ms ≥ max.compaction.lag.ms"
        return RunDue(True, why, nbytes, records, age, left)
    if retention_ms is not None and age >= retention_ms * RETENTION_SHARE:
        why = f"records beyond the horizon for {age} ms: retention.ms ({retention_ms}) reaches them in {left} ms"
        return RunDue(True, why, nbytes, records, age, left)
    if threshold_bytes is not None and nbytes >= threshold_bytes:
        why = f"{nbytes} bytes beyond the horizon ≥ compaction.threshold.bytes"
        return RunDue(True, why, nbytes, records, age, left)
    return RunDue(False, "below compaction.threshold.bytes", nbytes, records, age, left)
