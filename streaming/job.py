"""The Structured Streaming job: source → decode → aggregate (Spark) → controller (merge, decide, act)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from sinks.audit import AuditLog
from sinks.base import ActionSink
from sinks.kafka_admin import KafkaAdminSink
from state.store import RedisState
from streaming.aggregate import aggregate, collect_changes, collect_rows
from streaming.controller import Controller, now_ms
from streaming.decode import DECODED_DDL, Decoder
from streaming.dlq import DeadLetters
from streaming.kafka_source import KafkaSource
from streaming.metrics import Metrics, default_metrics
from streaming.readiness import Readiness, batch_end_offsets
from streaming.settings import Settings
from streaming.topics import ensure_topics, high_watermarks

log = logging.getLogger("compactd.job")


def spark_session(master: str = "local[2]") -> SparkSession:
    """A local session whose Python workers use this interpreter (and so this virtualenv)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    spark = (
        SparkSession.builder.master(master)
        .appName("compactd")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(KafkaSource)
    return spark


def stream_id_for(checkpoint_dir: str) -> str:
    """Identity of the stream that owns a checkpoint: batch ids are only comparable within it."""
    path = Path(checkpoint_dir)
    path.mkdir(parents=True, exist_ok=True)
    marker = path / "compactd-stream-id"
    if not marker.exists():
        tmp = path / f".stream-id.{uuid.uuid4()}"
        tmp.write_text(str(uuid.uuid4()))
        os.replace(tmp, marker)
    return marker.read_text().strip()


class Job:
    def __init__(
        self,
        settings: Settings,
        spark: SparkSession | None = None,
        metrics: Metrics | None = None,
        sink: ActionSink | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.metrics = metrics or default_metrics()
        self.state = RedisState.from_url(settings.redis_url, settings.redis_prefix)
        self.audit = AuditLog(settings.bootstrap_servers, settings.topics.actions, settings.kafka)
        self.dlq = DeadLetters(settings.bootstrap_servers, settings.topics.dlq, settings.kafka)
        self.readiness = Readiness(settings.topics.consumer_offsets, None)
        self.controller = Controller(
            self.state,
            settings.thresholds,
            sink or KafkaAdminSink(settings.bootstrap_servers, self.state, settings.kafka),
            self.audit,
            self.metrics,
            clock=clock,
            deletes_allowed=lambda: self.readiness.ready(),
        )
        self.decoder = Decoder(
            settings.topics.segments,
            settings.topics.commits,
            settings.max_event_bytes,
            settings.topics.consumer_offsets,
        )
        self.stream_id = stream_id_for(settings.checkpoint_dir)
        self.query: StreamingQuery | None = None

    def source_topics(self) -> list[str]:
        t = self.settings.topics
        offsets = t.consumer_offsets if self.settings.offsets_source == "consumer_offsets" else t.commits
        return [t.segments, offsets]

    @property
    def spark_checkpoint(self) -> Path:
        return Path(self.settings.checkpoint_dir) / "spark"

    def _arm_readiness(self) -> None:
        """Snapshot the offsets topic's high watermarks; deletes wait until the stream has read that far."""
        if self.settings.offsets_source != "consumer_offsets":
            return
        topic = self.settings.topics.consumer_offsets
        targets = high_watermarks(self.settings, topic)
        self.readiness = Readiness(topic, targets)
        self.readiness.observe(batch_end_offsets(self.spark_checkpoint))
        log.info("readiness gate on %s: targets %s, ready=%s", topic, targets, self.readiness.ready())

    def _read(self) -> DataFrame:
        assert self.spark is not None
        reader = (
            self.spark.readStream.format(self.settings.spark_source)
            .option("kafka.bootstrap.servers", self.settings.bootstrap_servers)
            .option("subscribe", ",".join(self.source_topics()))
            .option("startingOffsets", self.settings.starting_offsets)
            .option("maxOffsetsPerTrigger", str(self.settings.max_rows_per_trigger))
        )
        for key, value in self.settings.kafka.items():
            reader = reader.option(f"kafka.{key}", value)
        return reader.load()

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        # the offset log is only read while the gate is closed
        opened = not self.readiness.ready() and self.readiness.observe(
            batch_end_offsets(self.spark_checkpoint, batch_id)
        )
        decoded = df.mapInArrow(self.decoder, DECODED_DDL)
        collected = collect_changes(collect_rows(aggregate(decoded)))
        spark_s = time.monotonic() - started
        now = now_ms()
        self.dlq.publish(collected.rejected, now)
        for row in collected.rejected:
            self.metrics.dlq_records.labels(row["stream"], row["error"]).inc()
        for (stream, kind), n in collected.counts.items():
            self.metrics.input_records.labels(stream, kind).inc(n)
        self.controller.on_batch(self.stream_id, batch_id, collected.changes)
        if opened:  # deletes held back while catching up are decided now, everywhere
            log.info("offsets caught up at batch %d: deletes enabled", batch_id)
            self.controller.evaluate_all()
        log.info(
            "batch %d: %d records, %d rejected; spark %.2fs, merge+decide+act %.2fs",
            batch_id,
            sum(collected.counts.values()),
            len(collected.rejected),
            spark_s,
            time.monotonic() - started - spark_s,
        )

    def start(self, once: bool = False) -> StreamingQuery:
        if self.spark is None:
            self.spark = spark_session(self.settings.spark_master)
        if self.settings.create_topics:
            ensure_topics(self.settings)
        self._arm_readiness()
        writer = (
            self._read()
            .writeStream.foreachBatch(self.process_batch)
            .option("checkpointLocation", str(self.spark_checkpoint))
            .queryName(f"compactd-{self.stream_id[:8]}")
        )
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.settings.trigger_interval_ms} milliseconds")
        self.query = writer.start()
        return self.query

    def run(self, once: bool = False, stop: threading.Event | None = None) -> None:
        """`once`: consume what is there, evaluate every deadline, return. Else tick until `stop` or failure."""
        self.metrics.serve(self.settings.metrics_port)
        query = self.start(once)
        if once:
            query.awaitTermination()
            self.controller.evaluate_all()
            return
        stop = stop or threading.Event()
        interval = self.settings.trigger_interval_ms / 1000
        try:
            while query.isActive and not stop.is_set():
                try:
                    self.controller.tick()
                except Exception:  # Redis or Kafka hiccup: log, keep the stream alive, retry next tick
                    log.exception("deadline tick failed")
                stop.wait(interval)
        finally:
            self.stop()
        exc = query.exception()
        if exc is not None:
            raise RuntimeError(f"streaming query failed: {exc}")

    def stop(self) -> None:
        """Stop between batches: stopping inside foreachBatch has crashed Spark's stream thread."""
        query = self.query
        if query is None or not query.isActive:
            return
        deadline = time.monotonic() + 120
        while query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.1)
        query.stop()

    def close(self) -> None:
        self.audit.close()
        self.dlq.close()
        self.controller.sink.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.close()
