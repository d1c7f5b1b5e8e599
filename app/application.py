"""The application: wires Redis, Kafka clients, sinks, the controller and the Spark job.

Constructors only configure; `start()` checks Redis and Kafka (bounded, a few seconds each), then starts each
component in order, and on a failed start closes the ones already started, in reverse. `close()` stops the query
between batches and closes everything in reverse order; it is safe to call more than once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

import compactd
from compactd.app import share_task
from compactd.app.settings import Settings
from compactd.clock import now_ms
from compactd.compaction.service import Compactor
from compactd.compaction.takeover import Takeovers
from compactd.control.agent_watch import AGENT_WAIT, NO_AGENT, AgentWatch
from compactd.control.compaction_trigger import POOL, CompactionTrigger
from compactd.control.controller import Controller, Probe, RunShares, _no_probe
from compactd.control.runtime_config import ConfigOutcome, RuntimeConfig
from compactd.control.share import Layers, ShareResult
from compactd.control.state_guard import REBUILDING, StateGuard
from compactd.errors import ConfigError, DependencyUnavailable, ForcedStop, QueryFailed, StopTimeout
from compactd.kafka.admin import admin_client, check_reachable, ensure_topics, high_watermarks, list_end_offsets
from compactd.kafka.groups import ClusterGroupOffsets
from compactd.kafka.topics import ClusterTopics
from compactd.metrics import Metrics, default_metrics
from compactd.model import ActionRecord
from compactd.policy.plan import NOT_CAUGHT_UP
from compactd.policy.readiness import Readiness
from compactd.policy.thresholds import without_nudges
from compactd.sinks.audit import AuditLog
from compactd.sinks.base import ActionSink
from compactd.sinks.dlq import DeadLetters
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.sinks.nudge_ledger import LifecycleRecords, NudgeLedger
from compactd.state.outage import REDIS_DOWN, RedisOutage
from compactd.streaming.checkpoint import batch_end_offsets, completed_end_offsets, stream_id_for
from compactd.streaming.decode import Decoder
from compactd.streaming.job import Batch, StreamingJob, StreamSpec, root_cause

log = logging.getLogger("compactd.job")

CHECK_TIMEOUT_S = 5.0
IDLE_LOG_EVERY_S = 60.0
ONCE_DRAIN_S = 300.0  # `run --once` sends what the rate cap held back for at most this long
SPARK_EXIT_S = 10.0  # after its session stopped, Spark's JVM gets this long to exit before it is killed
MAX_REBUILDS_PER_RUN = 3  # `run --once`: a state lost again and again while rebuilding ends the run
# Spark gives the Python process behind a Python streaming source 10 s to connect back (hard-coded in its
# PythonWorkerFactory); on an overloaded machine a query fails at its start with this, before reading anything.
SLOW_WORKER = "Python worker failed to connect back"
MAX_SLOW_WORKER_RESTARTS = 3  # per run: a machine that slow for longer is reported, not retried forever
NO_SOURCE_S = 60.0  # a job whose sources nothing has written to this long after its start says so, once
AGENT_WAIT_CHECK_S = 5.0  # offsets_source admin: how often the agent topic is read until its first mark
AGENT_CHECK_S = 30.0  # and after it: is the agent still polling?
NO_SEGMENTS = (
    "no segment events on {topic} in {s:.0f} s: nothing tells compactd what is old, so no retention or compaction "
    "rule can fire; is an agent running? (`compactd agent --log-dir` beside each broker, or `compactd agent --admin` "
    'once per cluster where compactd is only a client: see docs/contract.md, "Real inputs")'
)


@dataclass
class RunSummary:
    """What one `run` did, for its closing line."""

    batches: int = 0
    events: int = 0
    rejected: int = 0
    partitions: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self, outcomes: dict[str, int]) -> str:
        acts = ", ".join(f"{n} {status}" for status, n in sorted(outcomes.items())) or "none"
        return (
            f"{self.events} events ({self.rejected} rejected) in {self.batches} batches, "
            f"{self.partitions} partitions evaluated, actions: {acts}; {time.monotonic() - self.started:.1f}s"
        )


class Application:
    def __init__(
        self,
        settings: Settings,
        spark: SparkSession | None = None,
        metrics: Metrics | None = None,
        sink: ActionSink | None = None,
        clock: Callable[[], int] = now_ms,
        probe: Probe = _no_probe,
        verbose: bool = False,
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.verbose = verbose
        self.metrics = metrics or default_metrics(settings.cluster)
        self.metrics.partitions.top_n = settings.metrics.top_n
        conn = settings.kafka_connection()
        self.conn = conn
        self.state = settings.redis_state(timeout_s=CHECK_TIMEOUT_S)
        self.audit = AuditLog(conn, settings.topics.actions, cluster=settings.cluster)
        self.dlq = DeadLetters(conn, settings.topics.dlq, cluster=settings.cluster)
        self.ledger = NudgeLedger(conn, settings.topics.nudges)
        self.sink: ActionSink = sink or KafkaAdminSink(conn, self.state, ledger=self.ledger, clock=clock)
        self.readiness = Readiness(None)
        self.guard = StateGuard(self.state, settings.checkpoint_dir, self.spark_checkpoint)
        self.outage = RedisOutage(settings.redis_retry_max_ms / 1000, self._redis_down)
        self.lost: str | None = None  # why Redis is not the state the checkpoint assumes, until the rebuild starts
        self.rebuilding = False
        ttl_s = settings.cluster_offsets_ttl_ms / 1000
        checking = settings.cluster_offsets_check and settings.cluster_check != "off"
        self.group_offsets = ClusterGroupOffsets(conn, ttl_s, holders=self.state.groups) if checking else None
        self.cluster_topics = ClusterTopics(conn)
        self.controller = Controller(
            self.state,
            settings.thresholds,
            self.sink,
            self.audit,
            self.metrics,
            clock=clock,
            deletes_allowed=self.deletes_allowed,
            probe=probe,
            own_topics=frozenset(settings.own_topics()),
            cluster_offsets=None if self.group_offsets is None else self.group_offsets.check,
            view_cap=lambda *args: self.compaction.view_cap(*args),
            topics=self.cluster_topics,
            strict_groups=settings.strict_groups,
            records=LifecycleRecords(self.ledger, lambda: batch_end_offsets(self.spark_checkpoint)),
        )
        self.config = RuntimeConfig(self.state, settings.thresholds, settings.secrets(), self.controller, self.metrics)
        self.compaction = CompactionTrigger(
            Compactor(settings, self.state.r, self.config.effective, self._compaction_spark, clock),
            self.metrics,
            self.config.effective,
            self.state.topics,
            self._audit_run,
            clock,
            check_every_s=settings.compaction_check_interval_ms / 1000,
            cap_moved=lambda topic: self.controller.evaluate(
                [(topic, p) for p in self.state.partitions(topic)], "compaction"
            ),
            takeover_moved=self._takeover_moved,
            segments_known=lambda topic: any(  # a few partitions tell: segment events come for all or none
                v.segments for v in self.state.views([(topic, p) for p in self.state.partitions(topic)[:8]])
            ),
        )
        self.compaction.takeovers = Takeovers(lambda: self.compaction.compactor.cluster, self.ledger, clock)
        # offsets_source admin: the Admin API cannot see the broker's cleaner, so no nudge is ever decided there
        self.agent_watch = (
            AgentWatch(conn, settings.topics.agent, settings.cluster) if settings.offsets_source == "admin" else None
        )
        self.config.overlay = self._overlay
        self.decoder = Decoder(
            settings.topics.segments,
            settings.topics.commits,
            settings.max_event_bytes,
            settings.topics.consumer_offsets,
            settings.topics.config,
        )
        self.stream_id = ""
        self.job: StreamingJob | None = None
        self.summary = RunSummary()
        self._closers: list[Callable[[], None]] = []
        self._last_log = time.monotonic()
        self._idle_batches = 0
        self._admin: Any = None
        self.forced = False  # a second signal: leave without waiting for the running batch
        self._slow_worker_restarts = 0  # queries restarted because Spark's Python worker started too slowly
        self._sampled_at = 0.0
        self._topics_checked_at = 0.0
        self._agent_checked_at = 0.0
        self._segments_seen = False  # a segment event merged into this state (health `segments_at`)
        self._sources_said = False

    def _overlay(self, layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """What the job applies over the configured thresholds: retention takeovers; no nudges where the cleaner
        cannot be seen (`compactd explain` shows `cleaner_not_visible`)."""
        layers = self.compaction.overlay(layers)
        return layers if self.agent_watch is None else without_nudges(layers)

    def _takeover_moved(self, topic: str) -> None:
        """A retention takeover began or ended: the topic's forced retention changed (`RuntimeConfig.overlay`)."""
        self.controller.set_layers(self.config.effective())
        self.controller.evaluate([(topic, p) for p in self.state.partitions(topic)], "compaction")

    def _compaction_spark(self) -> SparkSession:
        """A session of its own for a compaction run, next to the stream's, in a fair-scheduler pool of its own:
        the stream's micro-batches keep their share of the executors while a run works (called in the run's
        thread: the pool is a thread-local property)."""
        if self.spark is None:
            from compactd.streaming.session import spark_session

            self.spark = spark_session(self.settings.spark_master, verbose=self.verbose)
            self._closers.append(self._stop_spark)
        session = self.spark.newSession()
        session.sparkContext.setLocalProperty("spark.scheduler.pool", POOL)
        return session

    def _audit_run(self, rec: ActionRecord) -> None:
        """A compaction run's action record, audited like the outbox's (under the controller's lock: one writer)."""
        with self.controller.lock:
            self.audit.publish(rec)
            self.audit.flush()

    @property
    def spark_checkpoint(self) -> Path:
        return Path(self.settings.checkpoint_dir) / "spark"

    def deletes_allowed(self) -> bool:
        """The delete gate: sources read far enough, no loss pending, and Redis still holds our epoch (one read,
        made when a delete is decided and again right before one is sent)."""
        return self.readiness.ready() and self.lost is None and self.guard.intact()

    # ---- start, in order ----

    def check_dependencies(self) -> None:
        """Redis and Kafka answer, within a few seconds each; both are checked so both problems show at once."""
        problems: list[DependencyUnavailable] = []
        try:
            self.state.start()
        except DependencyUnavailable as exc:
            problems.append(exc)
        try:
            check_reachable(self.conn, CHECK_TIMEOUT_S)
        except DependencyUnavailable as exc:
            problems.append(exc)
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise DependencyUnavailable(
                " and ".join(p.component for p in problems),
                ", ".join(p.address for p in problems),
                " and ".join(p.setting for p in problems),
                "; ".join(f"{p.component}: {p.cause}" for p in problems),
            )

    def start(self, once: bool = False) -> None:
        if once:  # the run ends by evaluating what its batches did not (`Controller.evaluate_rest`)
            self.controller.track_evaluated()
        try:
            self.check_dependencies()
            self._closers.append(self.state.close)
            self._closers.append(self.controller.io.close)  # its Redis thread, before the client closes
            # only now, with both dependencies answering, does anything touch the checkpoint directory
            self.stream_id = stream_id_for(self.settings.checkpoint_dir)
            lost = self.guard.loss_at_start(self.stream_id)
            if lost is not None:
                self._begin_rebuild(lost)  # loads the config layers that are left: none
            else:
                self.config.load()  # config events applied by earlier runs override the file's thresholds
            self._serve_metrics()
            self.metrics.init_source_topics(self.settings.source_topics())  # lag series scraped from the start
            self.metrics.redis_up.set(1)
            self.metrics.trigger_interval.set(self.settings.trigger_interval_ms / 1000)
            if self.settings.create_topics:
                ensure_topics(
                    self.conn,
                    self.settings.own_topics(),
                    configs=self.settings.own_topic_configs(),
                    replication_factor=self.settings.topics_replication_factor,
                )
            for component in (self.dlq, self.audit, self.sink):
                component.start()
                self._closers.append(component.close)
            if self.group_offsets is not None:
                self._closers.append(self.group_offsets.close)
            self._closers.append(self.cluster_topics.close)
            self._recover_nudges()
            self._arm_readiness()
            if once and self._nothing_to_read():
                log.info(
                    "nothing new on %s since the last run: Spark not started", ", ".join(self.settings.source_topics())
                )
                return
            self._start_stream(once, starting_offsets="earliest" if self.rebuilding else None)
        except BaseException:
            self.close()
            raise

    def _serve_metrics(self) -> None:
        try:
            self.metrics.serve(self.settings.metrics_port)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on port {self.settings.metrics_port} ({exc.strerror}); "
                "check --metrics-port / metrics_port"
            ) from None

    def _arm_readiness(self) -> None:
        """Deletes wait until the stream has read the offsets topic (`__consumer_offsets`, or the commits topic the
        admin agent writes, once it marked a complete poll) up to its high watermarks now, and, while a rebuild of a
        lost state is unfinished (also one a crashed job began), every source up to where it stood."""
        targets: dict[str, dict[str, int]] = {}
        why = NOT_CAUGHT_UP
        rebuild = self.guard.rebuild_targets()
        if rebuild:
            targets.update(rebuild)
            why = REBUILDING
        self.rebuilding = bool(rebuild)
        watch = self.agent_watch
        if watch is not None and watch.mark is None:
            self._read_agent()
        if watch is not None and watch.mark is None:
            self.readiness = Readiness.waiting(AGENT_WAIT)
            self._gate_changed()
            log.info("delete gate closed: %s (%s)", AGENT_WAIT, self.settings.topics.agent)
            return
        if self.settings.offsets_source in ("consumer_offsets", "admin"):
            topic = self.settings.offsets_topic
            for p, hw in high_watermarks(self.conn, topic).items():
                targets.setdefault(topic, {})[p] = max(hw, targets.get(topic, {}).get(p, 0))
        self.readiness = Readiness(targets or None, why)
        self.readiness.observe(batch_end_offsets(self.spark_checkpoint))
        self._gate_changed()
        if targets:
            log.info("delete gate (%s): targets %s, open=%s", why, targets, self.readiness.ready())

    def _read_agent(self) -> bool:
        """The agent's newest mark; True at the first."""
        assert self.agent_watch is not None
        self._agent_checked_at = time.monotonic()
        return self.agent_watch.refresh()

    def _watch_agent(self) -> None:
        """offsets_source admin: the gate is armed at the agent's first complete poll (and the deletes it held are
        decided afresh at once if the stream has read that far); a silent agent is said once."""
        watch = self.agent_watch
        if watch is None:
            return
        every = AGENT_WAIT_CHECK_S if watch.mark is None else AGENT_CHECK_S
        if time.monotonic() - self._agent_checked_at < every:
            return
        if self._read_agent():
            assert watch.mark is not None
            log.info("admin agent: complete poll %s seen: the delete gate is armed", watch.mark.get("poll"))
            self._arm_readiness()
            if self.readiness.ready():
                self.summary.partitions += self.controller.evaluate_all()
        watch.check_silence()

    def _check_sources(self) -> None:
        """Once, NO_SOURCE_S after the start: a source nothing writes is said in one line, not left silent."""
        if self._sources_said or time.monotonic() - self.summary.started < NO_SOURCE_S:
            return
        self._sources_said = True
        if not self._segments_seen and self.state.health().get("segments_at") is None:
            log.warning(NO_SEGMENTS.format(topic=self.settings.topics.segments, s=NO_SOURCE_S))
        if self.agent_watch is not None and self.agent_watch.mark is None:
            log.warning(NO_AGENT.format(s=NO_SOURCE_S, cluster=self.settings.cluster))

    def _gate_changed(self) -> None:
        """The gate opened or closed: metrics, the state hash for explain, and the end of a rebuild."""
        is_open = self.readiness.ready() and self.lost is None
        if is_open and self.rebuilding:
            self.guard.rebuild_done()
            self.rebuilding = False
            log.info("state rebuilt from the sources: deletes enabled")
        self.metrics.offsets_caught_up.set(int(is_open))
        self.metrics.state_rebuilding.set(int(self.rebuilding or self.lost is not None))
        self.guard.show_gate(is_open, REBUILDING if self.lost is not None else self.readiness.why)

    def _redis_down(self, down: bool) -> None:
        self.metrics.redis_up.set(0 if down else 1)
        if down:
            self.metrics.redis_outages.inc()

    # ---- a lost state ----

    def _state_lost(self, why: str) -> None:
        """Redis no longer holds the state the checkpoint assumes: hold every delete from now on; the run loop
        rebuilds (a batch cannot restart the query it runs in)."""
        if self.lost is not None:
            return
        self.lost = why
        self.metrics.state_losses.inc()
        log.error("state lost: %s; deletes held, rebuilding from the sources", why)
        self._gate_changed()

    def _begin_rebuild(self, why: str) -> None:
        """Wipe, new epoch, read every source again from its start; the gate opens once they are read up to where
        they stand now (a job that dies in here, or before that, resumes the rebuild at its next start)."""
        if self.lost is None:
            self.lost = why
            self.metrics.state_losses.inc()
            log.error("state lost: %s; deletes held, rebuilding from the sources", why)
        if self._admin is None:
            self._admin = admin_client(self.conn)
        targets = list_end_offsets(self._admin, self.settings.source_topics(), "high")
        self.guard.begin_rebuild(targets)
        self.controller.forget_scheduled()  # the wipe took the deadlines it stored
        self._segments_seen = False
        self._recover_nudges()  # the wipe took the nudges' originals too: the ledger has them
        self.stream_id = stream_id_for(self.settings.checkpoint_dir)
        self.lost = None
        self.config.load()  # the layers went with the state: the config topic brings them back

    def _start_stream(self, once: bool, starting_offsets: str | None = None) -> None:
        if self.spark is None:
            from compactd.streaming.session import check_executors, spark_session

            self.spark = spark_session(self.settings.spark_master, verbose=self.verbose)
            self._closers.append(self._stop_spark)  # a session this application started, it stops
            if not self.spark.sparkContext.master.startswith("local"):
                where = check_executors(self.spark, self.settings.executor_check_timeout_ms / 1000)
                log.info("executors import compactd %s from %s", compactd.__version__, ", ".join(where))
        s = self.settings
        if starting_offsets == "earliest" and self.rebuilding:
            self._supersede()
        spec = StreamSpec(
            conn=self.conn,
            topics=s.source_topics(),
            decoder=self.decoder,
            checkpoint=self.spark_checkpoint,
            trigger_interval_ms=s.trigger_interval_ms,
            max_rows_per_trigger=s.max_rows_per_trigger,
            starting_offsets=starting_offsets or s.starting_offsets,
            source_format=s.spark_source,
            name=f"compactd-{self.stream_id[:8]}",
            shares=s.evaluation_shares,
        )
        self.job = StreamingJob(spec, self.spark, self.on_batch)
        self.job.start(once)
        if self._stop_job not in self._closers:
            self._closers.append(self._stop_job)

    # ---- per batch ----

    def on_batch(self, batch: Batch) -> None:
        """Driver side of a micro-batch: DLQ, metrics, merge → decide → act, and the readiness gate."""
        started = time.monotonic()
        if self.lost is not None:
            return  # the rebuild reads this batch again, from the sources' start
        # the offset log is only read while the gate is closed
        opened = not self.readiness.ready() and self.readiness.observe(batch.end_offsets())
        collected = batch.collected
        before = sum(self.controller.outcomes.values())
        done = self.outage.retry(
            lambda: self._merge_and_decide(batch, opened), f"batch {batch.batch_id} waits", give_up=lambda: self.forced
        )
        if done is None:
            return  # the state was lost: nothing merged, the run loop rebuilds
        config, touched = done
        rejected = collected.rejected + config.rejected
        self.dlq.publish(rejected, now_ms())
        for row in rejected:
            self.metrics.dlq_records.labels(row["stream"], row["error"]).inc()
        for (stream, kind), n in collected.counts.items():
            self.metrics.input_records.labels(stream, kind).inc(n)
        records = sum(collected.counts.values())
        self.metrics.batch_records.observe(records)
        self.metrics.last_batch.set(time.time())
        actions = sum(self.controller.outcomes.values()) - before
        self.summary.batches += 1
        self.summary.events += records
        self.summary.rejected += len(rejected)
        self.summary.partitions += touched
        self._log_batch(batch, records, len(rejected), touched, actions, time.monotonic() - started)

    def _merge_and_decide(self, batch: Batch, opened: bool) -> tuple[ConfigOutcome, int] | None:
        """Check the state is still ours, apply config, merge, decide, act. Safe to repeat after a Redis error:
        merges are idempotent per batch id, decisions have deterministic ids, config versions only move forward."""
        lost = self.guard.loss_now(self.stream_id)
        if lost is not None:
            self._state_lost(lost)
            return None
        # config first: the batch's own partitions are decided under the thresholds it brings
        config = self.config.apply(batch.collected.config)
        touched = self.controller.on_batch(
            self.stream_id, batch.batch_id, batch.collected.changes, self._shares_of(batch)
        )
        self.guard.merged_batch(self.stream_id, batch.batch_id)
        if not self._segments_seen and any(s == "segments" and k != "rejected" for s, k in batch.collected.counts):
            self.state.set_health(segments_at=str(now_ms()))  # `explain`: a segment source exists
            self._segments_seen = True
        if opened:  # deletes held back while catching up are decided now, everywhere
            log.info("sources caught up at batch %d (%s): gate open", batch.batch_id, self.readiness.why)
            self._gate_changed()
        if opened or config.evaluate_all:
            touched += self.controller.evaluate_all()
        elif config.evaluate:
            touched += self.controller.evaluate(config.evaluate, "config")
        return config, touched

    def _shares_of(self, batch: Batch) -> RunShares | None:
        """With `evaluation_shares`, the batch's per-topic work as Spark tasks (app/share_task.py), one per share."""
        if batch.per_topic is None:
            return None
        per_topic = batch.per_topic

        def run(layers: Layers, now: int) -> list[ShareResult]:
            fn = share_task.task(
                self.settings, layers.layers, layers.own_topics, self.stream_id, batch.batch_id, now,
                batch.collected.deleted,
            )  # fmt: skip
            shares, workers = share_task.results(per_topic(fn, share_task.SHARE_DDL))
            if shares:
                log.info(
                    "batch %d: per-topic work in %d tasks: %s",
                    batch.batch_id,
                    len(shares),
                    ", ".join(f"{w} merged {s.touched} in {t:.2f}s" for (w, t), s in zip(workers, shares, strict=True)),
                )
            return shares

        return run

    def _log_batch(self, batch: Batch, records: int, rejected: int, touched: int, actions: int, act_s: float) -> None:
        """One line per batch that did something; an idle stream says so once a minute."""
        now = time.monotonic()
        if records or actions:
            log.info(
                "batch %d: %d records (%d rejected), %d partitions, %d actions; spark %.2fs, merge+decide+act %.2fs",
                batch.batch_id,
                records,
                rejected,
                touched,
                actions,
                batch.spark_seconds,
                act_s,
            )
            self._last_log, self._idle_batches = now, 0
            return
        self._idle_batches += 1
        if now - self._last_log >= IDLE_LOG_EVERY_S:
            log.info("idle: %d empty batches in the last %.0fs", self._idle_batches, now - self._last_log)
            self._last_log, self._idle_batches = now, 0

    # ---- run ----

    def run(self, once: bool = False, stop: threading.Event | None = None) -> str:
        """`once`: consume what is there, evaluate every partition, return. Else tick until `stop` or failure.

        Returns the one-line summary of what was done; raises QueryFailed with the root cause on one line.
        """
        if self.job is None:
            self.start(once)
        if once and self.job is None:  # every source partition was read to its end already
            self.summary.partitions += self.controller.evaluate_all()
            self._compact_once()
            self._drain(time.monotonic() + ONCE_DRAIN_S)
            return self.summary.line(self.controller.outcomes)
        assert self.job is not None and self.job.query is not None
        query = self.job.query
        if once:
            rebuilds = 0
            while True:
                try:
                    query.awaitTermination()
                except ForcedStop:
                    self.forced = True
                    raise
                except Exception as exc:  # reported once, on one line
                    if (restarted := self._restart_slow_worker(once=True)) is not None:
                        query = restarted
                        continue
                    self._raise_if_failed()
                    raise QueryFailed(f"streaming query failed: {root_cause(str(exc))}") from None
                self._raise_if_failed()
                if self.lost is None or rebuilds == MAX_REBUILDS_PER_RUN:
                    break
                rebuilds += 1
                query = self._rebuild_stream(once=True)  # lost during this run: read everything again
            self.summary.partitions += self.controller.evaluate_rest()
            self.controller.restore_nudges()
            self._compact_once()
            self._drain(time.monotonic() + ONCE_DRAIN_S)
            return self.summary.line(self.controller.outcomes)
        stop = stop or threading.Event()
        interval = self.settings.trigger_interval_ms / 1000
        last_error, said_at = "", 0.0
        warming = True
        try:
            while query.isActive and not stop.is_set():
                if self.lost is not None:
                    query = self._rebuild_stream(once=False)
                    continue
                try:
                    self.metrics.last_tick.set(time.time())
                    lost = self.guard.loss_now(self.stream_id)
                    if lost is not None:
                        self._state_lost(lost)
                        continue
                    self.controller.tick()
                    self.controller.restore_nudges()
                    self._check_topics()
                    self._watch_agent()
                    self._check_sources()
                    self.compaction.tick()
                    if warming:  # metrics of partitions no batch touched yet, one chunk per tick
                        warming = self.controller.warm_metrics() > 0
                    self._sample()
                    if last_error:
                        log.info("deadline ticks work again")
                    last_error = ""
                    self.outage.answered()
                except ForcedStop:
                    raise
                except REDIS_DOWN as exc:  # said once per outage, by whichever of batch and tick meets it first
                    self.outage.failed(exc, "deadline ticks wait")
                except Exception as exc:  # a Redis or Kafka hiccup: say so once, keep the stream, retry next tick
                    error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                    if error != last_error or time.monotonic() - said_at >= IDLE_LOG_EVERY_S:
                        log.warning("deadline tick failed (retrying every trigger): %s", error)
                        said_at = time.monotonic()
                    last_error = error
                stop.wait(interval)
                if not query.isActive and (restarted := self._restart_slow_worker(once=False)) is not None:
                    query = restarted
            self._raise_if_failed()
            if stop.is_set():
                self._stop_gracefully()
        except ForcedStop:
            self.forced = True
            raise
        return self.summary.line(self.controller.outcomes)

    def _compact_once(self) -> None:
        """`run --once`: the compaction runs due now, carried out before the run ends."""
        self.compaction.tick(now=True)
        if not self.compaction.wait(ONCE_DRAIN_S):
            log.warning("compaction runs still in progress after %.0fs: left unpublished", ONCE_DRAIN_S)

    def _restart_slow_worker(self, once: bool) -> Any | None:
        """The query started again from its checkpoint if it failed only because Spark's Python worker started too
        slowly (nothing was read or merged; a restart of the process would do the same), else None."""
        assert self.job is not None
        cause = self.job.failure() or ""
        if SLOW_WORKER not in cause or self._slow_worker_restarts >= MAX_SLOW_WORKER_RESTARTS:
            return None
        self._slow_worker_restarts += 1
        log.warning(
            "Spark's Python worker did not connect back within Spark's 10 s (an overloaded machine?): "
            "query started again from its checkpoint (%d of %d)",
            self._slow_worker_restarts,
            MAX_SLOW_WORKER_RESTARTS,
        )
        self._start_stream(once, starting_offsets="earliest" if self.rebuilding else None)
        assert self.job is not None and self.job.query is not None
        return self.job.query

    def _rebuild_stream(self, once: bool) -> Any:
        """Stop the query between batches, rebuild the state from the sources' start, run a new query."""
        assert self.job is not None and self.lost is not None
        self.job.stop(timeout_s=self.settings.stop_timeout_ms / 1000)
        if once:  # what was evaluated before the loss was evaluated on the lost state
            self.controller.track_evaluated()
        self.outage.retry(
            lambda: self._begin_rebuild(self.lost or ""), "the rebuild waits", give_up=lambda: self.forced
        )
        self._arm_readiness()
        self._start_stream(once, starting_offsets="earliest")
        assert self.job is not None and self.job.query is not None
        return self.job.query

    def _stop_gracefully(self) -> None:
        """SIGTERM: let the running batch finish, stop the query between batches, send what the outbox holds."""
        assert self.job is not None
        budget = self.settings.stop_timeout_ms / 1000
        until = time.monotonic() + budget
        log.info("stopping: finishing the running batch, then draining the outbox (at most %.0fs)", budget)
        self.compaction.stopping.set()  # a run in progress is left unpublished: its writes are garbage, never seen
        if not self.job.stop(timeout_s=budget):
            self.forced = True
            raise StopTimeout(
                f"the running batch did not finish within stop_timeout_ms={self.settings.stop_timeout_ms}; "
                "the checkpoint replays it on the next start"
            )
        self.controller.tick()  # decisions due now go out before we leave
        self._drain(until)

    def _stop_job(self) -> None:
        """Closer for the query: between batches, unless a forced stop left it to die with the process."""
        if self.job is not None and not self.forced:
            self.job.stop(timeout_s=self.settings.stop_timeout_ms / 1000)

    def _stop_spark(self) -> None:
        """Closer for the session this application started: its JVM and Python workers end before compactd does
        (killed at once after a forced stop)."""
        from compactd.streaming.session import stop_spark

        if self.spark is not None:
            stop_spark(self.spark, timeout_s=SPARK_EXIT_S, graceful=not self.forced)

    def _nothing_to_read(self) -> bool:
        """True when the last batch Spark planned is complete and ends at the last stable offset of every source
        partition: `run --once` would start Spark (most of its 10 s) to plan an empty batch. A planned but unfinished
        batch (a crash inside it) is never skipped: Spark must replay it."""
        planned, done = batch_end_offsets(self.spark_checkpoint), completed_end_offsets(self.spark_checkpoint)
        if planned != done:
            return False
        if self._admin is None:
            self._admin = admin_client(self.conn)
        latest = list_end_offsets(self._admin, self.settings.source_topics(), "high")
        return all(end <= done.get(topic, {}).get(p, 0) for topic, parts in latest.items() for p, end in parts.items())

    def _supersede(self) -> None:
        """A rebuild reads the sources from their start: the events each recorded reset dropped are dropped again
        (the decoder filters them where it reads), the state is bound again to the topic IDs it described, and the
        resets' causes are back for `explain`."""
        resets, ids = self.ledger.load_resets(), self.ledger.load_ids()
        self.controller.lifecycle.restore(ids)
        self.decoder = replace(self.decoder, superseded={t: r["positions"] for t, r in resets.items()})
        for topic, r in resets.items():
            self.state.restore_reset(topic, {"at": r["at"], "why": r["why"], "partitions": 0})
        if resets:
            log.info("rebuild: events of %d re-created topics from before their reset are dropped", len(resets))

    def _recover_nudges(self) -> None:
        """Nudges left on the cluster that Redis no longer knows (a state loss) come back from the ledger, to be put
        back by `Controller.restore_nudges`."""
        if isinstance(self.sink, KafkaAdminSink):
            on = self.sink.recover_nudges()
            if on:
                log.info("%d compaction nudges are on: each is put back once its topic has no compaction pending", on)

    def _check_topics(self) -> None:
        """Re-created and deleted topics (Controller.sweep_topics), every topic_check_interval_ms."""
        if time.monotonic() - self._topics_checked_at < self.settings.topic_check_interval_ms / 1000:
            return
        self._topics_checked_at = time.monotonic()
        self.controller.sweep_topics()

    def _sample(self) -> None:
        """Gauges that need a round trip (source lag: one ListOffsets; Redis size), every metrics.sample_interval_ms."""
        if time.monotonic() - self._sampled_at < self.settings.metrics.sample_interval_ms / 1000:
            return
        self._sampled_at = time.monotonic()
        if self._admin is None:
            self._admin = admin_client(self.conn)
        topics = self.settings.source_topics()
        latest = list_end_offsets(self._admin, topics, "high")
        done = completed_end_offsets(self.spark_checkpoint)
        for topic in topics:
            ends, read = latest.get(topic, {}), done.get(topic, {})
            self.metrics.source_lag.labels(topic).set(sum(max(e - read.get(p, 0), 0) for p, e in ends.items()))
        keys, used = self.state.size()
        self.metrics.state_keys.set(keys)
        self.metrics.state_bytes.set(used)

    def _drain(self, until: float) -> None:
        """Send what actions.per.second held back, pacing with the cap, until nothing waits or time is up."""
        held = self.controller.held_back
        while held and time.monotonic() < until:
            time.sleep(min(1.0, max(0.05, self.controller.bucket.wait_s())))
            held = self.controller.drain()
        if held:
            log.warning("%d actions still wait for actions.per.second; the next run sends them", held)

    def _raise_if_failed(self) -> None:
        assert self.job is not None
        cause = self.job.failure()
        if cause is not None:
            raise QueryFailed(f"streaming query failed: {cause}")

    # ---- stop, in reverse ----

    def close(self) -> None:
        self.compaction.stopping.set()
        errors: list[str] = []
        forced: ForcedStop | None = None
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except ForcedStop as exc:  # a second signal while closing: close the rest at once, then leave with it
                self.forced = True
                forced = exc
            except Exception as exc:  # keep closing the rest; report the first problem
                errors.append(f"{type(exc).__name__}: {exc}")
        if errors:
            log.warning("while stopping: %s", "; ".join(errors))
        if forced is not None:
            raise forced

    def __enter__(self) -> Application:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
