"""The compaction service inside the running job: decide when a topic's view needs a run, start it next to the
stream (its own Spark session, its own thread), report it as an action record, and collect old generations.

A run is decided like every other action: by a pure rule (`compaction.manifest.run_due`) over what compactd knows —
the published manifest (mirrored in Redis, refreshed from the manifest topic when the mirror is missing) and the
source's last stable offsets — under the topic's thresholds: `compaction.threshold.bytes`, `max.compaction.lag.ms`,
`dry.run` (a dry-run topic gets a `dry_run` record, once, and no run). At most one run per topic (the Redis lease,
also taken by `compactd compact`), at most `compaction.max.concurrent` at once.

What it learns of the views — a generation published, a grace over, a source that is another log — goes to
`caps` (compaction/view_caps.py), which the controller reads for the delete path's cap: a delete on the source never
passes the published horizon (nor, during the grace, the previous generation's), so view + tail always hold every
live key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from compactd.compaction.manifest import (
    Manifest,
    RunDue,
    find_gaps,
    garbage_below,
    run_due,
    source_changed,
    written_again_line,
)
from compactd.compaction.service import Compactor, ViewGap, eligible
from compactd.compaction.store import RunInProgress
from compactd.compaction.takeover import Takeover, Takeovers, wanted
from compactd.compaction.view_caps import ViewCaps
from compactd.model import ActionRecord
from compactd.policy.thresholds import Thresholds, parse_scope, resolve, resolve_global
from compactd.policy.throttle import backoff_ms

# the compactd_compaction_last figures, from the run's summary line
FIGURES = ("keys", "records_in", "records_out", "bytes_in", "bytes_out", "seconds", "generation", "dirty_ratio")
log = logging.getLogger("compactd.compaction")

CHECK_EVERY_S = 5.0  # how often topics are checked for a run (one ListOffsets per topic with the service on)
RETENTION_TTL_S = 60.0  # how long a source's retention.ms is reused
# after a failed run, the next of the topic waits CHECK_EVERY_S, then twice as long after each failure in a row, up to
# RETRY_CAP_S: a run that cannot succeed (a record the view refuses, a source refused) was started every 5 s for good,
# each attempt's writes kept (issue 64)
RETRY_CAP_S = 600.0
POOL = "compactd-compaction"  # Spark fair-scheduler pool of the runs: the stream's batches keep their share


class CompactionMetrics(Protocol):
    """The series a trigger keeps (control/metrics.py `Metrics`, the job's one registry)."""

    actions: Counter
    compaction_runs: Counter
    compaction_running: Gauge
    compaction_backoff: Gauge
    compaction_last: Gauge
    compaction_beyond_records: Gauge
    compaction_beyond_age: Gauge
    compaction_gap_records: Gauge
    compaction_retention_left: Gauge
    compaction_max_lag: Gauge

    def compaction_topics(self, topics: Iterable[str]) -> None: ...


class CompactionTrigger:
    def __init__(
        self,
        compactor: Compactor,
        metrics: CompactionMetrics,
        layers: Callable[[], dict[str, dict[str, Any]]],
        known_topics: Callable[[], Iterable[str]],
        publish: Callable[[ActionRecord], None],
        clock: Callable[[], int],
        check_every_s: float = CHECK_EVERY_S,
        takeovers: Takeovers | None = None,
        takeover_moved: Callable[[str], None] = lambda _topic: None,
        segments_known: Callable[[str], bool] | None = None,
        caps: ViewCaps | None = None,
    ) -> None:
        """`takeovers`: the retention takeovers
        (None: none are made); `takeover_moved(topic)`: one began or ended, the thresholds (`overlay`) changed;
        `segments_known(topic)`: compactd has segment events of the topic (default: it knows the topic at all);
        `caps`: where what it learns of the views goes, for the controller (default: its own)."""
        self.compactor = compactor
        self.metrics = metrics
        self.layers = layers
        self.known_topics = known_topics
        self.publish = publish
        self.clock = clock
        self.check_every_s = check_every_s
        self.caps = caps or ViewCaps(compactor.state, compactor.log)
        self.takeovers = takeovers
        self.takeover_moved = takeover_moved
        self.segments_known = segments_known or (lambda topic: topic in set(known_topics()))
        self.running: dict[str, threading.Thread] = {}
        self.said_dry: set[str] = set()
        self.said_gap: set[str] = set()
        self.said_again: set[str] = set()  # topics whose source was said to be written again under the view
        self.failing: dict[str, tuple[int, float]] = {}  # topic -> (failed runs in a row, monotonic time of the next)
        self._retentions: dict[str, tuple[float, tuple[str | None, int | None, str] | None]] = {}
        self._checked_at = 0.0
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    # -- which topics
    def topics(self) -> list[str]:
        """Topics with the service on: those named in a topic scope, and every known topic when it is on globally."""
        layers = self.layers()
        named = {t for scope in layers for kind, t, _ in [parse_scope(scope)] if kind != "global" and t is not None}
        candidates = set(named)
        if resolve_global(layers).compaction_service:
            candidates |= set(self.known_topics())
        settings = self.compactor.settings
        own = frozenset(settings.own_topics())
        out = []
        for topic in sorted(candidates):
            if eligible(topic, own, settings.topics.view_suffix) is None and resolve(layers, topic).compaction_service:
                out.append(topic)
        return out

    def manifest(self, topic: str) -> Manifest | None:
        return self.caps.manifest(topic)

    # -- the tick
    def tick(self, now: bool = False) -> None:
        """Every `check_every_s` (`now`: at once): start the runs that are due, collect what the grace released,
        refresh the gauges."""
        if self.stopping.is_set() or (not now and time.monotonic() - self._checked_at < self.check_every_s):
            return
        self._checked_at = time.monotonic()
        with self._lock:
            self.running = {t: th for t, th in self.running.items() if th.is_alive()}
        layers = self.layers()
        limit = resolve_global(layers).max_concurrent_nudges
        topics = self.topics()
        self.metrics.compaction_topics(topics)
        for topic in topics:
            th = resolve(layers, topic)
            try:
                self._check(topic, th, limit)
            except Exception as exc:  # one topic's trouble never stops the others, nor the stream
                log.warning("compaction check of %s failed: %s", topic, (str(exc).splitlines() or [""])[0])
        if self.takeovers is not None:
            try:
                for topic in sorted(set(self.takeovers.current()) - set(topics)):
                    self._give_back(topic, "compaction.service is off")
            except Exception as exc:
                log.warning("retention takeovers not checked: %s", (str(exc).splitlines() or [""])[0])

    # -- the retention takeover (compaction/takeover.py)
    def _takeover(self, topic: str, th: Thresholds, manifest: Manifest | None) -> None:
        if self.takeovers is None:
            return
        read = self._topic_config(topic)
        if read is None:
            return
        # the segments are read (Redis) only where the takeover is asked for: every other topic is "off" already
        known = th.compaction_retention_takeover and self.segments_known(topic)
        why_not = wanted(th, manifest, topic in self.caps.changed, read[2], known)
        held = topic in self.takeovers.current()
        if why_not is None and not held:
            tk = self.takeovers.take(topic)
            if tk is not None:
                self._retentions.pop(topic, None)
                self._mirror_retention(topic, None, tk)
                self._finish(self._takeover_record(topic, "take_retention", "retention_takeover", tk))
                self.takeover_moved(topic)
        elif why_not is not None and held:
            self._give_back(topic, why_not)

    def _give_back(self, topic: str, why: str) -> None:
        assert self.takeovers is not None
        tk = self.takeovers.current()[topic]
        if self.compactor.cluster.partitions(topic) is None:
            self.takeovers.forget(topic)  # the topic is gone: nothing to put back
            done = "the topic is gone: nothing to put back"
        else:
            done = self.takeovers.give_back(topic, why)
        self._retentions.pop(topic, None)
        self._mirror_retention(topic, None, None)
        self._finish(self._takeover_record(topic, "restore_config", "takeover_ended", tk).with_status(
            "sent", why=why, restored=done))  # fmt: skip
        self.takeover_moved(topic)

    def _takeover_record(self, topic: str, action: str, reason: str, tk: Takeover) -> ActionRecord:
        now = self.clock()
        return ActionRecord(
            id=f"{action}-{topic}-{now}",
            action=action,  # type: ignore[arg-type]
            topic=topic,
            partition=-1,
            reason=reason,  # type: ignore[arg-type]
            dry_run=False,
            decided_at=now,
            status="sent",
            detail={"key": "retention.ms", "original": tk.original, "applies_ms": tk.applies_ms},
        )

    def _mirror_retention(self, topic: str, retention_ms: int | None, tk: Takeover | None) -> None:
        try:  # what `explain` shows
            self.compactor.state.set_retention(topic, retention_ms, self.clock(), None if tk is None else tk.to_json())
        except Exception as exc:  # Redis away: the gauge and the run's trigger still have it
            log.debug("retention of %s not mirrored: %s", topic, exc)

    def _check(self, topic: str, th: Thresholds, limit: int) -> None:
        cluster = self.compactor.cluster
        count = cluster.partitions(topic)
        if count is None:
            return
        manifest = self.manifest(topic)
        now = self.clock()
        if manifest is not None and manifest.generation > 0 and topic not in self.running:
            below = garbage_below(manifest, now, th.compaction_view_grace_ms)
            low = cluster.offsets(manifest.view, "earliest", count, committed=False) if below else {}
            if any(off > low.get(p, 0) for p, off in below.items()):
                self.compactor.collect(manifest, th.compaction_view_grace_ms)
                self.caps.moved(topic)  # the previous generation's grace is over: its horizon no longer caps
        stable = cluster.offsets(topic, "latest", count)
        read = self._topic_config(topic)
        retention = None if read is None else read[1]
        due = run_due(manifest, stable, now, th.compaction_threshold_bytes, th.max_compaction_lag_ms, None, retention)
        if due.retention_left_ms is not None:
            self.metrics.compaction_retention_left.labels(topic).set(due.retention_left_ms / 1000)
        if manifest is not None and manifest.generation > 0:
            low = cluster.offsets(topic, "earliest", count)
            epochs: dict[int, int] = {}
            high = cluster.offsets(topic, "latest", count, committed=False, epochs=epochs)
            changed = source_changed(manifest, count, low, high, cluster.topic_id(topic))
            # an unclean leader election that truncated the log below the horizon and had it written again: the
            # view holds records no reader of the source will see and lacks the new ones. Deletes wait (capped at
            # 0) for the run that rebuilds those partitions from the source
            again = {} if changed else self.compactor.written_again(topic, manifest, epochs)
            gaps = [] if changed or again else find_gaps(manifest, low)
            self.metrics.compaction_gap_records.labels(topic).set(sum(g.end - g.start for g in gaps))
            # a new view published (here or by `compactd compact`) caps again
            if self.caps.another_log(topic, bool(changed or again)) and changed:
                log.warning("compaction of %s: the source is another log (%s): deletes wait for a new view",
                            topic, changed)  # fmt: skip
            elif again and topic not in self.said_again:
                self.said_again.add(topic)
                log.warning("compaction of %s: %s: deletes wait for the run that rebuilds them",
                            topic, written_again_line(manifest, again))  # fmt: skip
            if not again:
                self.said_again.discard(topic)
            if changed:
                due = RunDue(True, f"the source is another log than the view's ({changed})")
            elif again:
                due = RunDue(True, written_again_line(manifest, again))
            self._takeover(topic, th, manifest)
            if gaps:
                if topic not in self.said_gap and topic not in self.running:
                    self.said_gap.add(topic)
                    why = str(ViewGap(topic, gaps))
                    log.warning("compaction of %s: %s", topic, why)
                    self._finish(self._record(topic, th, now, "compaction_threshold", why, due).with_status(
                        "skipped", why=why, gaps=[g.__dict__ for g in gaps]))  # fmt: skip
                return
            self.said_gap.discard(topic)
        self.metrics.compaction_beyond_records.labels(topic).set(due.beyond_records)
        self.metrics.compaction_beyond_age.labels(topic).set(due.beyond_age_ms / 1000)
        self.metrics.compaction_max_lag.labels(topic).set((th.max_compaction_lag_ms or 0) / 1000)
        if not due.due or topic in self.running:
            return
        reason = (
            "first_generation"
            if manifest is None or manifest.generation <= 0 or topic in self.caps.changed
            else "max_compaction_lag"
            if "max.compaction.lag.ms" in due.why
            else "compaction_threshold"
        )
        rec = self._record(topic, th, now, reason, due.why, due)
        if th.dry_run:
            if topic not in self.said_dry:
                self.said_dry.add(topic)
                self._finish(rec.with_status("dry_run"))
            return
        self.said_dry.discard(topic)
        failed = self.failing.get(topic)
        if failed is not None and time.monotonic() < failed[1]:
            return  # backing off after failed runs (one line said why at each failure)
        if len(self.running) >= limit:
            return  # compaction.max.concurrent: waits for a run to end
        thread = threading.Thread(target=self._run, args=(rec,), name=f"compactd-compact-{topic}", daemon=True)
        with self._lock:
            self.running[topic] = thread
        self.metrics.compaction_running.labels(topic).set(1)
        thread.start()

    def _topic_config(self, topic: str) -> tuple[str | None, int | None, str] | None:
        """The source's own retention.ms, its effective value in ms and its cleanup.policy, read every
        RETENTION_TTL_S (one DescribeConfigs; None: not readable, no DescribeConfigs permission or the broker away)."""
        held = self._retentions.get(topic)
        if held is None or time.monotonic() - held[0] >= RETENTION_TTL_S:
            try:
                read: tuple[str | None, int | None, str] | None = self.compactor.cluster.topic_config(topic)
            except Exception as exc:
                log.debug("retention.ms of %s not read: %s", topic, exc)
                read = None
            held = self._retentions[topic] = (time.monotonic(), read)
            tk = None if self.takeovers is None else (self.takeovers.held or {}).get(topic)
            self._mirror_retention(topic, None if read is None else read[1], tk)
        return held[1]

    @staticmethod
    def _record(topic: str, th: Thresholds, now: int, reason: str, why: str, due: RunDue) -> ActionRecord:
        return ActionRecord(
            id=f"compact-view-{topic}-{now}",
            action="compact_view",
            topic=topic,
            partition=-1,
            reason=reason,  # type: ignore[arg-type]
            dry_run=th.dry_run,
            decided_at=now,
            status="pending",
            detail={"why": why, "beyond_records": due.beyond_records, "beyond_bytes": due.beyond_bytes},
        )

    def _run(self, rec: ActionRecord) -> None:
        topic = rec.topic
        log.info("compaction of %s started (%s)", topic, rec.detail.get("why"))
        try:
            out = self.compactor.run(topic)
        except RunInProgress as exc:
            self._finish(rec.with_status("skipped", why=str(exc)))
        except Exception as exc:
            line = (str(exc).splitlines() or [type(exc).__name__])[0]
            if self.stopping.is_set():
                log.info("compaction of %s interrupted by the stop: the published generation stays", topic)
                return
            tries = self.failing.get(topic, (0, 0.0))[0] + 1
            wait_s = backoff_ms(tries, int(self.check_every_s * 1000), int(RETRY_CAP_S * 1000)) / 1000
            self.failing[topic] = (tries, time.monotonic() + wait_s)
            self.metrics.compaction_backoff.labels(topic).set(wait_s)
            log.warning("compaction of %s failed (%d in a row, next try in %.0f s): %s", topic, tries, wait_s, line)
            self._finish(rec.with_status("failed", error=line, tries=tries, retry_in_s=wait_s))
        else:
            figures = (
                "keys",
                "records_in",
                "records_out",
                "bytes_in",
                "bytes_out",
                "seconds",
                "generation",
                "dirty_ratio",
            )
            for figure in figures:
                self.metrics.compaction_last.labels(topic, figure).set(out[figure])
            if self.failing.pop(topic, None) is not None:
                self.metrics.compaction_backoff.labels(topic).set(0)
            self.caps.another_log(topic, False)  # a new view of the new log: its horizon caps from now
            self.caps.moved(topic)
            self._finish(
                rec.with_status(
                    "sent",
                    generation=out["generation"],
                    keys=out["keys"],
                    tombstones=out["tombstones"],
                    records_in=out["records_in"],
                    records_out=out["records_out"],
                    bytes_in=out["bytes_in"],
                    bytes_out=out["bytes_out"],
                    seconds=out["seconds"],
                    horizon=out["horizon"],
                    appended=out["appended"],
                    dirty_ratio=out["dirty_ratio"],
                )
            )
        finally:
            self.metrics.compaction_running.labels(topic).set(0)

    def _finish(self, rec: ActionRecord) -> None:
        self.metrics.compaction_runs.labels(rec.topic, rec.status).inc()
        self.metrics.actions.labels(rec.action, rec.reason, rec.status).inc()
        try:
            self.publish(rec)
        except Exception as exc:
            log.warning("compaction record of %s not audited: %s", rec.topic, exc)

    def wait(self, timeout_s: float) -> bool:
        """Wait for the runs in progress (a graceful stop); True when none is left."""
        until = time.monotonic() + timeout_s
        for thread in list(self.running.values()):
            thread.join(max(0.0, until - time.monotonic()))
        return not any(t.is_alive() for t in self.running.values())
