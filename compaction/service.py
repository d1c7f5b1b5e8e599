"""One compaction run, end to end: lease → claim the view → collect garbage → plan → phases 1 and 2 on Spark →
fence → publish (write the manifest) → collect garbage → status.

The order is what makes a crash harmless at any point: nothing a run writes is visible before its manifest is on
the manifest topic; the previous generation stays readable until then and for `compaction.view.grace.ms` after;
what a dead run wrote is below the next published range and is deleted with the old generations. A run publishes
only while it still holds the lease and the manifest it started from is still the published one. One module (~470
lines) because that order is the safety argument: it reads top to bottom as the steps of a run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from compactd.clock import now_ms
from compactd.compaction.cluster import CompactionCluster
from compactd.compaction.local_tasks import LocalTasks
from compactd.compaction.manifest import (
    Gap,
    Manifest,
    Previous,
    ViewPartition,
    delta_partitions,
    epoch_moved,
    find_gaps,
    garbage_below,
    plan_ranges,
    rebuild_cut,
    source_changed,
    written_again,
)
from compactd.compaction.spark_run import ReadRange, RunInput, WriteSpec, run_phases, split
from compactd.compaction.store import MANIFEST_TOPIC_CONFIG, CompactionState, Holder, Lease, ManifestLog
from compactd.compaction.strategy import Strategy
from compactd.errors import CompactdError, ConfigError
from compactd.policy.thresholds import Thresholds, resolve
from compactd.streaming.connector import java_options

log = logging.getLogger("compactd.compaction")

PHASES = ("planned", "written", "published")  # where `on_phase` is called: the boundaries a crash test kills at
CHECKED = "checked"  # also called: the run's checks passed, its manifest not written yet (where a race is tested)


class RunFailed(CompactdError):
    """A compaction run stopped before publishing; the previous generation is still the published one."""


class ViewGap(RunFailed):
    """The source lost offsets beyond the published horizon: a run would publish a view that resurrects deleted keys
    and keeps superseded values, so it does not publish unless told (`--accept-gap`, or `--rebuild`)."""

    def __init__(self, topic: str, gaps: list[Gap]) -> None:
        self.gaps = gaps
        lost = ", ".join(f"{g.partition}: [{g.start},{g.end})" for g in gaps)
        super().__init__(
            f"{topic}: the source lost offsets past the view's horizon ({lost}; its retention.ms/retention.bytes, or "
            f"a deleteRecords): not published. `compactd compact {topic} --accept-gap` publishes over the gap, "
            "`--rebuild` starts a new view from the source alone"
        )


@dataclass(frozen=True)
class RunOptions:
    """What an operator chose for one run: publish over a gap (who accepted it), or start a new lineage."""

    accept_gap: bool = False
    rebuild: bool = False


@dataclass(frozen=True)
class Overrides:
    strategy: str | None = None
    header: str | None = None


def eligible(topic: str, own_topics: frozenset[str], view_suffix: str) -> str | None:
    """Why a topic may not be compacted into a view (None: it may)."""
    if topic.startswith("__"):
        return f"{topic} is an internal topic"
    if topic in own_topics or topic.startswith("compactd."):
        return f"{topic} is one of compactd's own topics"
    if topic.endswith(view_suffix):
        return f"{topic} is a compacted view (topics.view_suffix={view_suffix})"
    return None


def cleaned_by_kafka(topic: str, policy: str) -> str | None:
    """Why a source Kafka's own cleaner compacts cannot be compacted into a view (None: it can). The cleaner keeps the
    highest offset per key and drops tombstones `delete.retention.ms` after it passed them, before a run reads them:
    a KIP-280 winner of a lower offset is gone (issue 64 reproduced a header strategy publishing v5 over v10), a
    deleted key's tombstone is gone and the view's older record brings the key back, and offsets compacted away past
    the horizon cannot be told from what was never there. Pure."""
    if "compact" not in policy.replace(" ", "").split(","):
        return None
    return (
        f"cannot compact {topic}: its cleanup.policy={policy} lets Kafka's cleaner remove records and tombstones "
        f"before compactd reads them (a KIP-280 winner lost, a deleted key back in the view); set cleanup.policy="
        f"delete on {topic}, or compaction.service=false"
    )


def strategy_for(th: Thresholds, overrides: Overrides | None = None) -> Strategy:
    o = overrides or Overrides()
    kind = o.strategy or th.compaction_strategy
    header = o.header if o.header is not None else th.compaction_strategy_header
    if kind not in ("offset", "timestamp", "header"):
        raise ConfigError(f"unknown compaction strategy {kind!r}: choose offset, timestamp or header")
    return Strategy.of(
        kind,  # type: ignore[arg-type]
        header,
        th.compaction_strategy_header_format,
        th.compaction_strategy_tombstone,
    )


@dataclass(frozen=True)
class ServiceParts:
    """What the compaction service keeps between runs: its Redis state, the manifest topic's reader and the cluster's
    Admin requests (unconnected until a run asks). The job builds them before the service: the controller's view caps
    and the retention takeovers share them, and the thresholds the service reads are wired later
    (daemon/application.py)."""

    state: CompactionState
    log: ManifestLog
    cluster: CompactionCluster

    @classmethod
    def of(cls, settings: Any, redis: Any) -> ServiceParts:
        conn = settings.kafka_connection()
        return cls(
            CompactionState(redis, settings.key_prefix),
            ManifestLog(conn, settings.topics.compactions),
            CompactionCluster(conn, replication_factor=settings.topics_replication_factor),
        )


class Compactor:
    """Runs compactions for one cluster. `spark` is a callable returning the session to run on (the job passes a
    session of its own next to the stream's; the CLI starts one on first use); `tasks`, a callable returning what
    runs the JVM tasks without Spark's scheduler (the CLI on a local master: `local_tasks`), or None (Spark does)."""

    def __init__(
        self,
        settings: Any,
        redis: Any,
        layers: Callable[[], dict[str, dict[str, Any]]],
        spark: Callable[[], Any],
        clock: Callable[[], int] = now_ms,
        parts: ServiceParts | None = None,
        tasks: Callable[[], LocalTasks] | None = None,
    ) -> None:
        """`layers()`: the threshold layers in force at a run's start; `parts`: built by the caller when others
        share them (default: its own)."""
        self.tasks = tasks
        self.settings = settings
        parts = parts or ServiceParts.of(settings, redis)
        self.state, self.log, self.cluster = parts.state, parts.log, parts.cluster
        self.layers = layers
        self.spark = spark
        self.clock = clock
        self.conn = settings.kafka_connection()
        # (topic, partition, horizon, the generation's epoch, the epoch now) -> the last record below the horizon
        self._below: dict[tuple[str, int, int, int, int], tuple[int, int] | None] = {}

    def thresholds(self, topic: str) -> Thresholds:
        return resolve(self.layers(), topic)

    def check_eligible(self, topic: str) -> None:
        why = eligible(topic, frozenset(self.settings.own_topics()), self.settings.topics.view_suffix)
        if why is not None:
            raise ConfigError(f"cannot compact {why}")

    # -- one run
    def run(
        self,
        topic: str,
        overrides: Overrides | None = None,
        on_phase: Callable[[str], None] | None = None,
        options: RunOptions | None = None,
    ) -> dict[str, Any]:
        """One two-phase run now; the summary line of the contract. Raises RunInProgress when another run holds
        the topic, RunFailed (status ERROR) when the run could not publish (ViewGap: the source lost records past
        the horizon)."""
        self.check_eligible(topic)
        th = self.thresholds(topic)
        strategy = strategy_for(th, overrides)
        lease = self.state.take_lease(topic, self.settings.compaction_lease_ms)
        started = self.clock()
        t0 = time.monotonic()
        try:
            self.state.set_status(topic, "RUNNING", started_at=started, error=None, gaps=[])
            opts = options or RunOptions()
            summary = self._run(topic, th, strategy, lease, started, on_phase or (lambda _p: None), opts)
        except Exception as exc:
            self.cluster.forget()
            if isinstance(exc, CompactdError):
                line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            else:  # a Spark failure carries the task's Python error deep inside a JVM one: that line, not the plan
                from compactd.streaming.job import root_cause

                line = root_cause(f"{type(exc).__name__}: {exc}")
            gaps = [g.__dict__ for g in exc.gaps] if isinstance(exc, ViewGap) else []
            with contextlib.suppress(Exception):  # Redis away: the run's failure is what the caller reports
                self.state.set_status(topic, "ERROR", error=line, seconds=round(time.monotonic() - t0, 3), gaps=gaps)
            with contextlib.suppress(Exception):  # the next run collects them, if the cluster is away now
                unpublished = self.log.read(topic)
                if unpublished is not None and unpublished.generation <= 0:
                    self.collect(unpublished, 0)  # what this run wrote before the first generation
            if isinstance(exc, CompactdError):
                raise
            raise RunFailed(f"compaction of {topic} failed: {line}") from None
        else:
            # SUCCESS is written while the lease is still held: `status` reads RUNNING with no lease holder as a run
            # that died, so releasing first left a window where a published run read as ERROR
            summary["seconds"] = round(time.monotonic() - t0, 3)
            fields = {k: v for k, v in summary.items() if k not in ("status", "topic")}
            self.state.set_status(topic, "SUCCESS", error=None, **fields)
        finally:
            lease.release()
        return summary

    def _run(
        self,
        topic: str,
        th: Thresholds,
        strategy: Strategy,
        lease: Lease,
        started: int,
        on_phase: Callable[[str], None],
        opts: RunOptions,
    ) -> dict[str, Any]:
        cluster = self.cluster
        cluster.ensure_topic(self.log.topic, MANIFEST_TOPIC_CONFIG)
        manifest = self.log.read(topic)
        count = cluster.partitions(topic)
        if count is None:
            raise RunFailed(f"topic {topic} does not exist")
        policy, record_bytes = cluster.source_configs(topic)
        refused = cleaned_by_kafka(topic, policy)
        if refused is not None:
            raise RunFailed(refused)
        topic_id = cluster.topic_id(topic)
        low = cluster.offsets(topic, "earliest", count)
        epochs: dict[int, int] = {}  # each partition's leader epoch now: what the records read below were written in
        high = cluster.offsets(topic, "latest", count, committed=False, epochs=epochs)
        published = manifest if manifest is not None and manifest.generation > 0 else None
        changed = source_changed(published, count, low, high, topic_id)
        lineage_why = f"the source is another log ({changed})" if changed else "--rebuild" if opts.rebuild else ""
        if changed:
            log.warning("compaction of %s: %s: a new view, the old one is garbage", topic, lineage_why)
        gaps = [] if lineage_why else find_gaps(published, low)
        if gaps and not opts.accept_gap:
            raise ViewGap(topic, gaps)
        rewritten = {} if lineage_why else self._rebuild_cuts(topic, published, epochs, low, opts.accept_gap)
        manifest = self._claim_view(topic, manifest, count, strategy, started, bool(lineage_why), record_bytes)
        self.collect(manifest, th.compaction_view_grace_ms)
        self._still_held(lease, topic)

        stable = cluster.offsets(topic, "latest", count)
        lag = th.min_compaction_lag_ms
        young = cluster.offsets(topic, started - lag + 1, count) if lag > 0 else {}
        base = None if lineage_why else published  # a new lineage reads the source alone
        view_high = cluster.offsets(manifest.view, "latest", count, committed=False) if base is not None else {}
        append = delta_partitions(
            base, strategy, view_high, started, th.delete_retention_ms, th.compaction_view_dirty_ratio
        )
        plan = plan_ranges(base, low, stable, young, append, rewritten)
        ranges: list[ReadRange] = []
        for r in plan:
            if not r.append:
                ranges += split(manifest.view, r.partition, r.view_start, r.view_end, True, below=r.view_below)
            # past an accepted gap the source is read from what it still holds; elsewhere there is no gap to skip,
            # and a record deleted under the run fails its read (never a silent jump)
            ranges += split(topic, r.partition, max(r.source_start, low.get(r.partition, 0)), r.horizon, False)
        on_phase("planned")

        spec = WriteSpec(
            # in order, one batch in flight: a batch written twice (a retry after a lost ack) either lies below the
            # range the delivery reports span (garbage, collected) or makes that range longer than the count written,
            # which fails the run before it publishes. Not idempotent: one InitProducerId per writing task costs more
            # than the whole write on some brokers.
            producer_conf=self.conn.client(
                "producer",
                {
                    "acks": "all",
                    "max.in.flight.requests.per.connection": 1,
                    "linger.ms": 20,
                    "batch.size": 1_000_000,
                    "message.max.bytes": record_bytes,
                },
            ),
            consumer_conf=self.conn.client("consumer"),
            view=manifest.view,
            now=started,
            delete_retention_ms=th.delete_retention_ms,
            java_conf=java_options(self.conn, self.settings.spark_kafka),
            record_bytes=record_bytes,
        )
        strategy_opts = {
            "kind": strategy.kind,
            "header": strategy.header,
            "header_format": strategy.header_format,
            "tombstone": strategy.tombstone,
        }
        reports = {
            int(r["partition"]): r
            for r in run_phases(
                self.spark,
                self.conn.spark_options(),
                RunInput(
                    ranges,
                    strategy_opts,
                    th.compaction_retain_null_key,
                    count,
                    self.settings.compaction_task_records,
                    self.settings.compaction_task_map_mb << 20,
                    self.settings.compaction_read_stall_ms,
                ),
                spec,
                self.tasks() if self.tasks is not None else None,
            )
        }
        on_phase("written")
        self._still_held(lease, topic)

        view_high = cluster.offsets(manifest.view, "latest", count, committed=False)
        parts: dict[str, ViewPartition] = {}
        totals = dict.fromkeys(("records_in", "bytes_in", "bytes_out", "null_keys"), 0)
        for r in plan:
            rep = reports.get(r.partition)
            written = int(rep["written"]) if rep else 0
            if written:
                vs, ve = int(rep["view_start"]), int(rep["view_end"])  # type: ignore[index]
                if ve - vs != written or (r.append and vs != r.view_end):
                    raise RunFailed(
                        f"view {manifest.view}/{r.partition}: {written} records written over [{vs},{ve}): "
                        "another writer shares the view topic"
                    )
            elif r.append:
                vs = ve = r.view_end
            else:
                vs = ve = view_high.get(r.partition, 0)
            for name in totals:
                totals[name] += int(rep[name]) if rep else 0
            counts = (written, int(rep["keys"]) if rep else 0, int(rep["tombstones"]) if rep else 0)
            nbytes = int(rep["bytes_out"]) if rep else 0
            held_back = r.horizon < stable.get(r.partition, 0)
            fields = {
                "horizon": r.horizon,
                "beyond_since": started - lag if held_back and lag > 0 else started,
                "source_low": low.get(r.partition, 0),
                "epoch": epochs.get(r.partition, -1),
            }
            if r.append:  # the previous generation's range, the delta's winners after it
                pv = published.partitions[str(r.partition)]  # type: ignore[union-attr]
                parts[str(r.partition)] = replace(
                    pv,
                    view_end=ve,
                    records=pv.records + counts[0],
                    keys=pv.keys + counts[1],
                    tombstones=pv.tombstones + counts[2],
                    bytes=pv.bytes + nbytes,
                    base_end=pv.base,
                    **fields,
                )
            else:
                parts[str(r.partition)] = ViewPartition(
                    view_start=vs,
                    view_end=ve,
                    records=counts[0],
                    keys=counts[1],
                    tombstones=counts[2],
                    bytes=nbytes,
                    base_end=ve,
                    base_at=started,
                    **fields,
                )

        current = self.log.read(topic)
        if current is None or current.generation != manifest.generation:
            seen = None if current is None else current.generation
            raise RunFailed(f"{topic}: generation {seen} was published meanwhile; this run's writes are garbage")
        if not lease.check():
            raise RunFailed(f"{topic}: the run lost its lease (Redis wiped, or stalled past it); not published")
        finished = self.clock()
        same_lineage = not lineage_why and published is not None
        if gaps:
            who = f"{lease.holder.user}@{lease.holder.host}" if lease.holder is not None else "unknown"
            gaps = [Gap(g.partition, g.start, g.end, finished, who) for g in gaps]
            log.warning("compaction of %s: publishing over a gap, accepted by %s: %s", topic, who, gaps)
        new = Manifest(
            topic=topic,
            view=manifest.view,
            generation=manifest.generation + 1,
            strategy=strategy.kind,
            strategy_header=strategy.header,
            strategy_header_format=strategy.header_format,
            strategy_tombstone=strategy.tombstone,
            partitions=parts,
            started_at=started,
            finished_at=finished,
            records_in=totals["records_in"],
            records_out=sum(int(rep["written"]) for rep in reports.values()),
            bytes_in=totals["bytes_in"],
            bytes_out=totals["bytes_out"],
            keys=sum(pv.keys for pv in parts.values()),
            tombstones=sum(pv.tombstones for pv in parts.values()),
            appended=tuple(r.partition for r in plan if r.append),
            null_keys=totals["null_keys"],
            # no grace across lineages: the old one describes another log, or one the operator chose to rebuild
            previous=None if lineage_why else self._retire(manifest, finished, th.compaction_view_grace_ms),
            run=lease.run,
            lineage=manifest.lineage + (1 if lineage_why and manifest.generation > 0 else 0),
            lineage_why=lineage_why or (manifest.lineage_why if same_lineage else ""),
            source_id=topic_id,
            gaps=(manifest.gaps if same_lineage else ()) + tuple(gaps),
        )
        on_phase(CHECKED)
        won = self.log.publish(new)
        if won is None or won.run != new.run:
            other = "another run" if won is None else f"run {won.run[:8]}"
            raise RunFailed(
                f"{topic}: {other} published generation {new.generation} first; this run's writes are garbage"
            )
        self.state.mirror(new)
        if lineage_why:
            self._drop_old_lineage(new)
        on_phase("published")
        log.info(
            "compacted %s: generation %d, %d records in, %d out, %d keys",
            topic,
            new.generation,
            new.records_in,
            new.records_out,
            new.keys,
        )
        self.collect(new, th.compaction_view_grace_ms)
        return summary(new)

    def written_again(self, topic: str, published: Manifest | None, epochs: dict[int, int]) -> dict[int, int]:
        """The partitions whose log an unclean leader election wrote again below the published horizon, each with
        the offset of the last record below it (of a later epoch than the generation read). Only partitions whose
        leader epoch moved since are read (`epoch_moved`), one read each, and a partition's answer is kept while
        its horizon and leader epoch stay: a clean election costs one read per partition until the next run."""
        out: dict[int, int] = {}
        for p in epoch_moved(published, epochs):
            pv = published.partitions[str(p)]  # type: ignore[union-attr]
            key = (topic, p, pv.horizon, pv.epoch, epochs[p])
            if key not in self._below:
                if len(self._below) > 10_000:
                    self._below.clear()
                self._below[key] = self.cluster.log.last_record_below(topic, p, pv.horizon)
            below = self._below[key]
            if written_again(pv, below):
                out[p] = below[0]  # type: ignore[index]
        return out

    def _rebuild_cuts(
        self, topic: str, published: Manifest | None, epochs: dict[int, int], low: dict[int, int], accept_gap: bool
    ) -> dict[int, int]:
        """Per partition written again under the view: the source offset below which its view records still hold
        (`rebuild_cut`); the run reads the source from its log start there. Raises RunFailed (one line) where the
        log holds no record of the epoch the view was read in, unless `--accept-gap`."""
        cuts: dict[int, int] = {}
        for p in self.written_again(topic, published, epochs):
            pv = published.partitions[str(p)]  # type: ignore[union-attr]
            first, at_start = self.cluster.log.first_record_after(topic, p, low.get(p, 0), pv.horizon, pv.epoch)
            cut = rebuild_cut(low.get(p, 0), first, at_start)
            if cut is None:
                if not accept_gap:
                    raise RunFailed(
                        f"{topic}/{p}: an unclean leader election wrote the log again below the view's horizon "
                        f"{pv.horizon} from its log start {low.get(p, 0)} or earlier, and what it cut is unknown: "
                        "`compactd compact --accept-gap` keeps the view below the log start, `--rebuild` drops it"
                    )
                cut = low.get(p, 0)
            log.warning(
                "compaction of %s: partition %d was written again from offset %d under leader epoch > %d (an "
                "unclean leader election below the horizon %d): rebuilt from the source's log start %d, the view "
                "kept below %d",
                topic, p, first, pv.epoch, pv.horizon, low.get(p, 0), cut,
            )  # fmt: skip
            cuts[p] = cut
        return cuts

    def _drop_old_lineage(self, new: Manifest) -> None:
        """A new lineage just published: the old one's records are deleted at once, in every view partition (below the
        new ranges, and whole where the new lineage has none, a source re-created with fewer partitions among them).
        A plain reader of the view (a KTable, a Connect sink) takes each key's last record, and read the old
        lineage's keys as live beside the new ones (issue 64: 120 old keys on a view of 60). No grace: `read
        --compacted` refuses another lineage, and a rebuild was asked for."""
        have = self.cluster.partitions(new.view) or 0
        ends = self.cluster.offsets(new.view, "latest", have, committed=False) if have else {}
        below = {
            p: new.partitions[str(p)].view_start if str(p) in new.partitions else ends.get(p, 0) for p in range(have)
        }
        self.cluster.delete_below(new.view, {p: off for p, off in below.items() if off > 0})

    @staticmethod
    def _still_held(lease: Lease, topic: str) -> None:
        """A run whose lease is gone (a renewal failed, or it stalled past the TTL) stops at its next step."""
        if not lease.held:
            raise RunFailed(f"{topic}: the run lost its lease (Redis away, or stalled past it); stopped, not published")

    @staticmethod
    def _retire(manifest: Manifest, now: int, grace_ms: int) -> Previous | None:
        """What the new manifest remembers of the generation it replaces: its horizons (lowered to those of an
        older generation still within its grace), so source retention stays below every readable generation."""
        if manifest.generation <= 0:
            return None
        horizons = manifest.horizons()
        old = manifest.previous
        if old is not None and now < old.retired_at + grace_ms:
            horizons = {p: min(h, old.horizons.get(p, h)) for p, h in horizons.items()}
        return Previous(manifest.generation, now, horizons)

    def _claim_view(
        self,
        topic: str,
        manifest: Manifest | None,
        count: int,
        strategy: Strategy,
        now: int,
        new_lineage: bool,
        record_bytes: int,
    ) -> Manifest:
        """The view topic, created and claimed by compactd (a claim is a generation-0 manifest written first, so a
        crash between the two is resumed, never mistaken for someone else's topic), with as many partitions as the
        source: partitions added to the source are added to the view (a reader of an older generation reads the
        partitions its manifest names). A view with more partitions serves a new lineage of a re-created source."""
        view = manifest.view if manifest is not None else f"{topic}{self.settings.topics.view_suffix}"
        have = self.cluster.partitions(view)
        if manifest is None:
            if have is not None:
                raise RunFailed(
                    f"view topic {view} exists and compactd did not create it: delete it or change topics.view_suffix"
                )
            manifest = Manifest(
                topic,
                view,
                0,
                strategy.kind,
                strategy.header,
                strategy.header_format,
                strategy.tombstone,
                started_at=now,
            )
            self.log.write(manifest)
            self.state.mirror(manifest)
        if have is None:
            if manifest.generation > 0:
                raise RunFailed(f"view topic {view} of {topic} is missing (generation {manifest.generation})")
            self.cluster.create_view(view, count, record_bytes)
            have = count
        else:
            self.cluster.ensure_view_config(view, record_bytes)
        if have < count:
            log.info("compaction of %s: %s grows from %d to %d partitions, as its source did", topic, view, have, count)
            self.cluster.add_partitions(view, count)
        elif have > count and not new_lineage and manifest.generation > 0 and self._holds_past(view, count, have):
            raise RunFailed(f"view topic {view} has {have} partitions and {topic} has {count}: nothing written")
        return manifest

    def _holds_past(self, view: str, count: int, have: int) -> bool:
        """Whether any view partition from `count` on holds records: a new lineage of a source re-created with fewer
        partitions emptied them (`_drop_old_lineage`); one that holds records is not that view."""
        low = self.cluster.offsets(view, "earliest", have, committed=False)
        high = self.cluster.offsets(view, "latest", have, committed=False)
        return any(high.get(p, 0) > low.get(p, 0) for p in range(count, have))

    # -- garbage and status
    def collect(self, manifest: Manifest, grace_ms: int) -> dict[int, int]:
        """Delete what is below the published generation once its grace is over; the view's new low watermarks.
        Before the first generation everything in the view is a failed run's writes: a plain reader of the view (a
        KTable) read them as the topic's state (issue 64: 5 of 65 live keys missing), and they were kept for ever."""
        if manifest.generation <= 0:
            count = self.cluster.partitions(manifest.view)
            if count is None:
                return {}
            ends = self.cluster.offsets(manifest.view, "latest", count, committed=False)
            return self.cluster.delete_below(manifest.view, {p: end for p, end in ends.items() if end > 0})
        below = garbage_below(manifest, self.clock(), grace_ms)
        if not below:
            return {}
        return self.cluster.delete_below(manifest.view, below)

    def close(self) -> None:
        """The manifest topic's reader, kept connected between runs, is closed (the job's stop, a command's end)."""
        self.log.close()

    def status(self, topic: str) -> dict[str, Any]:
        """The contract's status line: Redis's view of the last run, checked against the manifest topic."""
        published = self.log.read(topic)
        st, holder = self.state.status_and_holder(topic)
        out: dict[str, Any] = {
            "topic": topic,
            "status": "NOT_RUN",
            "generation": 0,
            "horizon": {},
            "keys": 0,
            "records_in": 0,
            "records_out": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "seconds": None,
            "error": None,
            "lineage": 0,
            "lineage_why": "",
            "gaps": [],
            "gap_pending": [],
            "appended": [],
            "dirty_ratio": 0.0,
        }
        if published is not None and published.generation > 0:
            out.update(summary(published))
            out["status"] = "SUCCESS"
            out["seconds"] = round((published.finished_at - published.started_at) / 1000, 3)
        if st:
            status = st.get("status", "NOT_RUN")
            if status == "RUNNING" and holder is None:
                status = "ERROR"  # the run died without a word: its lease expired
                st["error"] = st.get("error") or "the run stopped without finishing (its lease expired)"
            elif status == "RUNNING" and (run := Holder.loads(holder)) is not None:
                if published is not None and published.run == run.token:
                    status, st["error"] = "SUCCESS", None  # it published; only its garbage collection is left
                elif run.dead_here():
                    status = "ERROR"
                    st["error"] = st.get("error") or f"the run stopped without finishing ({run.who()} is gone)"
            if status in ("RUNNING", "ERROR") or published is None or published.generation == 0:
                out["status"] = status
            if status == "SUCCESS" and published is not None and st.get("generation") == published.generation:
                out["seconds"] = st.get("seconds", out["seconds"])
            out["error"] = st.get("error")
            if status == "ERROR" and st.get("gaps"):
                out["gap_pending"] = st["gaps"]  # what stopped the last run: --accept-gap or --rebuild
        out.pop("tombstones", None)
        return out


def summary(m: Manifest) -> dict[str, Any]:
    return {
        "topic": m.topic,
        "generation": m.generation,
        "status": "SUCCESS",
        "records_in": m.records_in,
        "records_out": m.records_out,
        "keys": m.keys,
        "tombstones": m.tombstones,
        "bytes_in": m.bytes_in,
        "bytes_out": m.bytes_out,
        "seconds": round((m.finished_at - m.started_at) / 1000, 3),
        "horizon": {p: pv.horizon for p, pv in sorted(m.partitions.items(), key=lambda kv: int(kv[0]))},
        "lineage": m.lineage,
        "lineage_why": m.lineage_why,
        "gaps": [g.__dict__ for g in m.gaps],  # accepted with --accept-gap: the ranges the view never saw
        "appended": list(m.appended),  # partitions whose delta was appended to the view, not rewritten with it
        # the largest share of a partition's range that delta runs appended (what readers read beyond one record per
        # key); a run rewrites a partition once it reaches compaction.view.dirty.ratio
        "dirty_ratio": round(max((pv.dirty for pv in m.partitions.values()), default=0.0), 4),
    }
