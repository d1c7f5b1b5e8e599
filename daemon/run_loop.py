"""The running job: the stream started (or started again), each micro-batch merged and decided, the deadline
ticker between batches, and the stops (graceful, forced, `run --once`). A mixin of `Application`
(daemon/application.py), which builds what it uses; the class declares each."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

import compactd
from compactd.clock import now_ms
from compactd.control.controller import RunSlices
from compactd.control.evaluation import BatchThresholds
from compactd.control.runtime_config import ConfigOutcome
from compactd.control.slices import SliceResult
from compactd.daemon import slice_task
from compactd.daemon.parts import JobParts
from compactd.daemon.source_loss import SourceLoss
from compactd.errors import DeliveryTimeout, DependencyUnavailable, ForcedStop, QueryFailed, StopTimeout, forced_by
from compactd.kafka.admin import admin_client, list_end_offsets, retire
from compactd.state.outage import REDIS_DOWN
from compactd.streaming.checkpoint import adopt_source, batch_end_offsets, completed_end_offsets
from compactd.streaming.job import Batch, StreamingJob, StreamSpec, root_cause

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

    from compactd.compaction.trigger import CompactionTrigger
    from compactd.sinks.dlq import DeadLetters
    from compactd.state.outage import Outage, RedisOutage

log = logging.getLogger("compactd.job")

IDLE_LOG_EVERY_S = 60.0
ONCE_DRAIN_S = 300.0  # `run --once` sends what the rate cap held back for at most this long
SPARK_EXIT_S = 10.0  # after its session stopped, Spark's JVM gets this long to exit before it is killed
MAX_REBUILDS_PER_RUN = 3  # `run --once`: a state lost again and again while rebuilding ends the run
# Kafka I/O of a batch that did not go through (not delivered in time, refused, unreadable: a follower stopped under
# `min.insync.replicas`, an ACL taken away): the batch waits and is done again, as after a Redis error, never ending
# `compactd run` (issue 64: the DLQ's flush, the nudge ledger's writes and reads, the manifest topic's read). Done
# again is safe: it is what a crash and Spark's replay of the same batch id do.
KAFKA_DOWN: tuple[type[BaseException], ...] = (DeliveryTimeout, KafkaException, DependencyUnavailable)
KAFKA_RETRY_MAX_S = 30.0


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


class RunLoop(JobParts):
    """The stream, its batches, the ticker and the stops."""

    # what only it borrows from `Application`
    compaction: CompactionTrigger
    dlq: DeadLetters
    outage: RedisOutage
    kafka_outage: Outage
    spark: SparkSession | None
    verbose: bool
    _closers: list[Callable[[], None]]
    # what the delete gate does (daemon/gate.py `DeleteGate`), and the start (`Application.start`)
    start: Callable[[bool], None]
    _arm_readiness: Callable[[], None]
    _begin_rebuild: Callable[[str], None]
    _check_sources: Callable[[], None]
    _gate_changed: Callable[[], None]
    _state_lost: Callable[[str], None]
    _supersede: Callable[[], None]
    _watch_agent: Callable[[], None]
    # the run loop's own state: set by `Application.__init__`, changed only here
    job: StreamingJob | None
    forced: bool  # a second signal: leave without waiting for the running batch
    _stop: object  # the event `run` stops on (the CLI's StopEvent records a second signal)
    _kafka_options: dict[str, str] | None
    _last_log: float
    _idle_batches: int
    _sampled_at: float
    _topics_checked_at: float

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
        if self._kafka_options is None:  # translated once: it says once what it leaves out
            from compactd.streaming.connector import java_options

            self._kafka_options = java_options(self.conn, s.spark_kafka, source=True)
        spec = StreamSpec(
            kafka_options=self._kafka_options,
            topics=s.source_topics(),
            decoder=self.decoder,
            checkpoint=self.spark_checkpoint,
            trigger_interval_ms=s.trigger_interval_ms,
            max_rows_per_trigger=s.max_rows_per_trigger,
            starting_offsets=starting_offsets or s.starting_offsets,
            name=f"compactd-{self.stream_id[:8]}",
            slices=s.evaluation_slices,
            before_read=SourceLoss(self.conn, self.spark_checkpoint, self.metrics),
        )
        if adopt_source(self.spark_checkpoint):
            log.info(
                "checkpoint %s was read by compactd's former Kafka source: Spark's Kafka connector resumes from its "
                "offsets",
                self.spark_checkpoint,
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
        waits, forced = f"batch {batch.batch_id} waits", lambda: self.forced
        done = self.kafka_outage.retry(
            lambda: self.outage.retry(lambda: self._merge_and_decide(batch, opened), waits, give_up=forced),
            waits,
            give_up=forced,
        )
        if done is None:
            return  # the state was lost: nothing merged, the run loop rebuilds
        config, touched = done
        rejected = collected.rejected + config.rejected
        self.kafka_outage.retry(lambda: self.dlq.publish(rejected, now_ms()), waits, give_up=forced)
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
            self.stream_id, batch.batch_id, batch.collected.changes, self._slices_of(batch)
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

    def _slices_of(self, batch: Batch) -> RunSlices | None:
        """With `evaluation_slices`, the batch's per-topic work as Spark tasks (daemon/slice_task.py), one per slice."""
        if batch.per_topic is None:
            return None
        per_topic = batch.per_topic

        def run(layers: BatchThresholds, now: int) -> list[SliceResult]:
            fn = slice_task.task(
                self.settings, layers.layers, layers.own_topics, self.stream_id, batch.batch_id, now,
                batch.collected.deleted, layers.holds,
            )  # fmt: skip
            slices, workers = slice_task.results(per_topic(fn, slice_task.SLICE_DDL))
            if slices:
                log.info(
                    "batch %d: per-topic work in %d tasks: %s",
                    batch.batch_id,
                    len(slices),
                    ", ".join(f"{w} merged {s.touched} in {t:.2f}s" for (w, t), s in zip(workers, slices, strict=True)),
                )
            return slices

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
        self._stop = stop
        interval = self.settings.trigger_interval_ms / 1000
        last_error, said_at = "", 0.0
        warming = True
        try:
            while query.isActive and not stop.is_set():
                if self.lost is not None:
                    query = self._rebuild_stream(once=False)
                    continue
                started = time.monotonic()
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
                    self.outage.answered(started)
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
            self._raise_if_failed()
            if stop.is_set():
                self._stop_gracefully()
        except ForcedStop:
            self.forced = True
            raise
        except Exception:
            if (forced := forced_by(stop)) is not None:  # the second signal, wrapped by the Py4J call it met
                self.forced = True
                raise forced from None
            raise
        return self.summary.line(self.controller.outcomes)

    def _compact_once(self) -> None:
        """`run --once`: the compaction runs due now, carried out before the run ends."""
        self.compaction.tick(now=True)
        if not self.compaction.wait(ONCE_DRAIN_S):
            log.warning("compaction runs still in progress after %.0fs: left unpublished", ONCE_DRAIN_S)

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
        if not self.job.stop(timeout_s=budget, forced=lambda: forced_by(self._stop)):
            self.forced = True
            raise StopTimeout(
                f"the running batch did not finish within stop_timeout_ms={self.settings.stop_timeout_ms}; "
                "the checkpoint replays it on the next start"
            )
        self.controller.tick()  # decisions due now go out before we leave
        self._drain(until)

    def _forced(self) -> bool:
        """A second signal came: nothing waits for the running batch any more."""
        self.forced = self.forced or forced_by(self._stop) is not None
        return self.forced

    def _stop_job(self) -> None:
        """Closer for the query: between batches, unless a forced stop left it to die with the process."""
        if self.job is not None and not self._forced():
            self.job.stop(timeout_s=self.settings.stop_timeout_ms / 1000)

    def _stop_spark(self) -> None:
        """Closer for the session this application started: its JVM and Python workers end before compactd does
        (killed at once after a forced stop)."""
        from compactd.streaming.session import stop_spark

        if self.spark is not None:
            stop_spark(self.spark, timeout_s=SPARK_EXIT_S, graceful=not self._forced())

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
        try:
            latest = list_end_offsets(self._admin, topics, "high")
        except Exception:
            # its requests may sit on a node that stopped answering (a stalled broker still counted among the
            # cluster's): the next sample asks with a new client, as the topic check's clients do
            retire(self._admin)
            self._admin = None
            raise
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
