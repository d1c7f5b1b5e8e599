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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

import compactd
from compactd.app.settings import Settings
from compactd.clock import now_ms
from compactd.control.controller import Controller, Probe, _no_probe
from compactd.control.runtime_config import RuntimeConfig
from compactd.errors import ConfigError, DependencyUnavailable, ForcedStop, QueryFailed, StopTimeout
from compactd.kafka.admin import admin_client, check_reachable, ensure_topics, high_watermarks, list_end_offsets
from compactd.metrics import Metrics, default_metrics
from compactd.policy.readiness import Readiness
from compactd.sinks.audit import AuditLog
from compactd.sinks.base import ActionSink
from compactd.sinks.dlq import DeadLetters
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.streaming.checkpoint import batch_end_offsets, completed_end_offsets, stream_id_for
from compactd.streaming.decode import Decoder
from compactd.streaming.job import Batch, StreamingJob, StreamSpec, root_cause

log = logging.getLogger("compactd.job")

CHECK_TIMEOUT_S = 5.0
IDLE_LOG_EVERY_S = 60.0
ONCE_DRAIN_S = 300.0  # `run --once` sends what the rate cap held back for at most this long


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
        self.sink: ActionSink = sink or KafkaAdminSink(conn, self.state)
        self.readiness = Readiness(settings.topics.consumer_offsets, None)
        self.controller = Controller(
            self.state,
            settings.thresholds,
            self.sink,
            self.audit,
            self.metrics,
            clock=clock,
            deletes_allowed=lambda: self.readiness.ready(),
            probe=probe,
            own_topics=frozenset(settings.own_topics()),
        )
        self.config = RuntimeConfig(self.state, settings.thresholds, settings.secrets(), self.controller, self.metrics)
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
        self._sampled_at = 0.0

    @property
    def spark_checkpoint(self) -> Path:
        return Path(self.settings.checkpoint_dir) / "spark"

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
        try:
            self.check_dependencies()
            self._closers.append(self.state.close)
            self.config.load()  # config events applied by earlier runs override the file's thresholds
            # only now, with both dependencies answering, does anything touch the checkpoint directory
            self.stream_id = stream_id_for(self.settings.checkpoint_dir)
            self._serve_metrics()
            self.metrics.trigger_interval.set(self.settings.trigger_interval_ms / 1000)
            if self.settings.create_topics:
                ensure_topics(self.conn, self.settings.own_topics(), configs=self.settings.own_topic_configs())
            for component in (self.dlq, self.audit, self.sink):
                component.start()
                self._closers.append(component.close)
            self._arm_readiness()
            if once and self._nothing_to_read():
                log.info(
                    "nothing new on %s since the last run: Spark not started", ", ".join(self.settings.source_topics())
                )
                return
            self._start_stream(once)
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
        """Snapshot the offsets topic's high watermarks; deletes wait until the stream has read that far."""
        if self.settings.offsets_source != "consumer_offsets":
            self.metrics.offsets_caught_up.set(1)  # offsets come from the commits topic: no gate to wait for
            return
        topic = self.settings.topics.consumer_offsets
        targets = high_watermarks(self.conn, topic)
        self.readiness = Readiness(topic, targets)
        self.readiness.observe(batch_end_offsets(self.spark_checkpoint))
        self.metrics.offsets_caught_up.set(int(self.readiness.ready()))
        log.info("readiness gate on %s: targets %s, ready=%s", topic, targets, self.readiness.ready())

    def _start_stream(self, once: bool) -> None:
        if self.spark is None:
            from compactd.streaming.session import check_executors, spark_session

            self.spark = spark_session(self.settings.spark_master, verbose=self.verbose)
            if not self.spark.sparkContext.master.startswith("local"):
                where = check_executors(self.spark, self.settings.executor_check_timeout_ms / 1000)
                log.info("executors import compactd %s from %s", compactd.__version__, ", ".join(where))
        s = self.settings
        spec = StreamSpec(
            conn=self.conn,
            topics=s.source_topics(),
            decoder=self.decoder,
            checkpoint=self.spark_checkpoint,
            trigger_interval_ms=s.trigger_interval_ms,
            max_rows_per_trigger=s.max_rows_per_trigger,
            starting_offsets=s.starting_offsets,
            source_format=s.spark_source,
            name=f"compactd-{self.stream_id[:8]}",
        )
        self.job = StreamingJob(spec, self.spark, self.on_batch)
        self.job.start(once)
        self._closers.append(self._stop_job)

    # ---- per batch ----

    def on_batch(self, batch: Batch) -> None:
        """Driver side of a micro-batch: DLQ, metrics, merge → decide → act, and the readiness gate."""
        started = time.monotonic()
        # the offset log is only read while the gate is closed
        opened = not self.readiness.ready() and self.readiness.observe(batch.end_offsets())
        collected = batch.collected
        # config first: the batch's own partitions are decided under the thresholds it brings
        config = self.config.apply(collected.config)
        rejected = collected.rejected + config.rejected
        self.dlq.publish(rejected, now_ms())
        for row in rejected:
            self.metrics.dlq_records.labels(row["stream"], row["error"]).inc()
        for (stream, kind), n in collected.counts.items():
            self.metrics.input_records.labels(stream, kind).inc(n)
        before = sum(self.controller.outcomes.values())
        touched = self.controller.on_batch(self.stream_id, batch.batch_id, collected.changes)
        if opened:  # deletes held back while catching up are decided now, everywhere
            log.info("offsets caught up at batch %d: deletes enabled", batch.batch_id)
            self.metrics.offsets_caught_up.set(1)
        if opened or config.evaluate_all:
            touched += self.controller.evaluate_all()
        elif config.evaluate:
            touched += self.controller.evaluate(config.evaluate, "config")
        records = sum(collected.counts.values())
        self.metrics.batch_records.observe(records)
        self.metrics.last_batch.set(time.time())
        actions = sum(self.controller.outcomes.values()) - before
        self.summary.batches += 1
        self.summary.events += records
        self.summary.rejected += len(rejected)
        self.summary.partitions += touched
        self._log_batch(batch, records, len(rejected), touched, actions, time.monotonic() - started)

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
            self._drain(time.monotonic() + ONCE_DRAIN_S)
            return self.summary.line(self.controller.outcomes)
        assert self.job is not None and self.job.query is not None
        query = self.job.query
        if once:
            try:
                query.awaitTermination()
            except ForcedStop:
                self.forced = True
                raise
            except Exception as exc:  # reported once, on one line
                self._raise_if_failed()
                raise QueryFailed(f"streaming query failed: {root_cause(str(exc))}") from None
            self._raise_if_failed()
            self.summary.partitions += self.controller.evaluate_all()
            self._drain(time.monotonic() + ONCE_DRAIN_S)
            return self.summary.line(self.controller.outcomes)
        stop = stop or threading.Event()
        interval = self.settings.trigger_interval_ms / 1000
        last_error, said_at = "", 0.0
        warming = True
        try:
            while query.isActive and not stop.is_set():
                try:
                    self.metrics.last_tick.set(time.time())
                    self.controller.tick()
                    if warming:  # metrics of partitions no batch touched yet, one chunk per tick
                        warming = self.controller.warm_metrics() > 0
                    self._sample()
                    if last_error:
                        log.info("deadline ticks work again")
                    last_error = ""
                except ForcedStop:
                    raise
                except Exception as exc:  # a Redis or Kafka hiccup: say so once, keep the stream, retry next tick
                    error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                    if error != last_error or time.monotonic() - said_at >= IDLE_LOG_EVERY_S:
                        log.warning("deadline tick failed (retrying every trigger): %s", error)
                        said_at = time.monotonic()
                    last_error = error
                stop.wait(interval)
            self._raise_if_failed()
            if stop.is_set():
                self._stop_gracefully()
        except ForcedStop:
            self.forced = True
            raise
        return self.summary.line(self.controller.outcomes)

    def _stop_gracefully(self) -> None:
        """SIGTERM: let the running batch finish, stop the query between batches, send what the outbox holds."""
        assert self.job is not None
        budget = self.settings.stop_timeout_ms / 1000
        until = time.monotonic() + budget
        log.info("stopping: finishing the running batch, then draining the outbox (at most %.0fs)", budget)
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
        errors: list[str] = []
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as exc:  # keep closing the rest; report the first problem
                errors.append(f"{type(exc).__name__}: {exc}")
        if errors:
            log.warning("while stopping: %s", "; ".join(errors))

    def __enter__(self) -> Application:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
