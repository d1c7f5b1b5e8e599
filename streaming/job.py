"""The Structured Streaming query: source → decode → reduce, one handler call per micro-batch.

What happens to a batch's rows on the driver (DLQ, merge, decide, act) is the handler's business: the
application layer wires it to the controller. This module only builds, runs and stops the query.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from compactd.gc_pause import gc_paused
from compactd.model import SourceOffsets
from compactd.streaming import columns
from compactd.streaming.aggregate import (
    KEYED_DDL,
    PER_TOPIC_RECORD_KINDS,
    Collected,
    collect_changes,
    keyed,
    reduce_keyed,
    reduce_on_driver,
    reducing,
)
from compactd.streaming.checkpoint import batch_end_offsets
from compactd.streaming.connector import GROUP_ID_PREFIX
from compactd.streaming.decode import DECODED_DDL, KAFKA_COLUMNS, Decoder, reduce_table

# a micro-batch of at most this many records is reduced on the driver alone (`StreamingJob._fast`)
# Runs a mapInArrow function over the batch's per-topic rows, hash-partitioned by topic into the configured number of
# tasks, and returns what the tasks yield: (function, its output DDL) -> Arrow table.
PerTopic = Callable[[Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], str], pa.Table]


@dataclass
class Batch:
    """One micro-batch as the driver sees it, reduced."""

    batch_id: int
    collected: Collected
    spark_seconds: float
    checkpoint: Path
    # with evaluation slices: the per-topic rows, left in the executors (`collected` holds the rest)
    per_topic: PerTopic | None = None

    def end_offsets(self) -> SourceOffsets:
        """Source offsets this batch ends at (Spark's offset log; read only when needed)."""
        return batch_end_offsets(self.checkpoint, self.batch_id)


# What takes each micro-batch on the driver: the job's `RunLoop.on_batch` (daemon/run_loop.py: DLQ, metrics, merge →
# decide → act, the delete gate), or a test's own.
BatchHandler = Callable[[Batch], None]


@dataclass(frozen=True)
class StreamSpec:
    """Everything the query needs to know, with no knowledge of settings files."""

    kafka_options: Mapping[str, str]  # the Java client's settings (`connector.java_options`), without `kafka.`
    topics: Sequence[str]
    decoder: Decoder
    checkpoint: Path
    trigger_interval_ms: int = 1000
    max_rows_per_trigger: int = 500_000
    starting_offsets: str = "earliest"
    name: str = "compactd"
    slices: int = 0  # > 0: per-topic rows stay in the executors, in this many tasks (Batch.per_topic)
    reference: bool = False  # True: decode record by record (the reference path), for the equivalence tests
    # called with the batch id before the batch's records are read (the source-loss check: daemon/source_loss.py)
    before_read: Callable[[int], None] | None = None


class StreamingJob:
    def __init__(self, spec: StreamSpec, spark: SparkSession, handler: BatchHandler) -> None:
        self.spec = spec
        self.spark = spark
        self.handler = handler
        self.query: StreamingQuery | None = None
        self.batch_error: BaseException | None = None
        self._slice_keys: list[int] | None = None
        self._fast_path: columns.FastPath | None = None

    def _read(self) -> DataFrame:
        """Spark's Kafka connector over compactd's sources. `failOnDataLoss` is off for every source: records deleted
        before they were read (the topic's retention, a deleteRecords) cannot be read by failing, and what they said
        only ever holds deletes back (a lost commit leaves an older, lower position; a lost segment event leaves a
        segment unknown; a lost group deletion leaves the group holding). The job says so in one line instead
        (`before_read`). Transactions count once committed (`read_committed`)."""
        s = self.spec
        reader = (
            self.spark.readStream.format("kafka")
            .option("subscribe", ",".join(s.topics))
            .option("startingOffsets", s.starting_offsets)
            .option("maxOffsetsPerTrigger", str(s.max_rows_per_trigger))
            .option("failOnDataLoss", "false")
            .option("groupIdPrefix", GROUP_ID_PREFIX)
            .option("kafka.isolation.level", "read_committed")
            # a source not created yet is picked up once it exists; a read must never create it with broker defaults
            .option("kafka.allow.auto.create.topics", "false")
            # a node that stopped answering is given up on after 10 s, not the Java client's 30 (kafka/config.py
            # REQUEST_TIMEOUT_MS); the user's `spark_kafka:` settings below may say otherwise
            .option("kafka.request.timeout.ms", "10000")
        )
        for key, value in s.kafka_options.items():
            reader = reader.option(f"kafka.{key}", value)
        return reader.load()  # the fast path reads the connector's rows as they are (no copy into five columns)

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        """foreachBatch: the batch's rows to changes, then the handler (merge, decide, act), with the garbage collector
        held off (compactd/gc_pause.py)."""
        with gc_paused():
            self._process_batch(df, batch_id)

    def _process_batch(self, df: DataFrame, batch_id: int) -> None:
        if self.spec.slices:
            self._process_in_slices(df, batch_id)
            return
        started = time.monotonic()
        if self.spec.before_read is not None:
            self.spec.before_read(batch_id)
        collected = collect_changes(self._collected(df))
        try:
            self.handler(Batch(batch_id, collected, time.monotonic() - started, self.spec.checkpoint))
        except BaseException as exc:
            self.batch_error = exc  # reported as it is, not through Spark's wrapping of it
            raise

    def _collected(self, df: DataFrame) -> pa.Table:
        """The batch's rows, reduced (`reduce_on_driver`'s keyed rows). On the fast path (`columns`) the Java decoders
        and reduction in the reading tasks leave one row per state key and task, plus the records the decoders
        refused, with their bytes; those come to the driver with the rest (Spark's own Arrow collect, no
        Python stage in the tasks) and the reference decides them here (`Decoder.complete`), where their DLQ records
        are written anyway. A Python stage in the tasks cost every batch its fixed price (0.4-0.7 s for a 16-record
        batch, measured) and every fast row a round trip through Python, to decode rows a healthy source rarely has."""
        if self.spec.reference:
            return reduce_on_driver(self._decoded(df))
        return keyed(reduce_table(self.spec.decoder.complete(self._fast(df).toArrow())))

    def _decoded(self, df: DataFrame) -> DataFrame:
        """The batch's decoded rows (`DECODED_DDL`), left in the executors (evaluation slices reduce them there by
        topic): the fast path's rows, the refused ones decided by the reference in the tasks (`Decoder.completing`).
        `reference`: record by record in the reading tasks, for the equivalence tests."""
        decoder = self.spec.decoder
        if self.spec.reference:
            return df.select(*KAFKA_COLUMNS).mapInArrow(reducing(decoder.reference), DECODED_DDL)
        return self._fast(df).mapInArrow(decoder.completing, DECODED_DDL)

    def _fast(self, df: DataFrame) -> DataFrame:
        """The fast path's rows (`columns.FastPath.reduced`'s columns): decoded and reduced in the reading tasks, one
        pass over Spark's internal rows (no shuffle: a 10-record batch costs what its read costs)."""
        decoder = self.spec.decoder
        if self._fast_path is None or self._fast_path.decoder is not decoder:
            self._fast_path = columns.FastPath(decoder)
        return self._fast_path.reduced(df)

    def _process_in_slices(self, df: DataFrame, batch_id: int) -> None:
        """Bring to the driver only the rows that are not per topic (rejected records, config events, group deletions
        and memberships), reduced there, and the per-topic rows' counts; the per-topic rows are reduced in the slices'
        tasks, hash-partitioned by topic, and stay there (persisted for the batch) for the handler's `per_topic`
        tasks. The decoded rows are persisted too: the source is read once."""
        started = time.monotonic()
        if self.spec.before_read is not None:
            self.spec.before_read(batch_id)
        rows = self._decoded(df).persist()
        per_topic = F.col("error").isNull() & F.col("kind").isin(*PER_TOPIC_RECORD_KINDS)
        reduced = (
            rows.filter(per_topic)
            .repartition(self.spec.slices, self._slice_key())
            .mapInArrow(reduce_keyed, KEYED_DDL)
            .persist()
        )
        try:
            collected = collect_changes(reduce_on_driver(rows.filter(~per_topic)))
            counted = reduced.groupBy("stream", "kind").agg(F.sum("n").alias("n")).toArrow()
            for row in counted.to_pylist():
                collected.counts[(row["stream"], row["kind"])] += row["n"]

            def run(fn: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], ddl: str) -> pa.Table:
                return reduced.mapInArrow(fn, ddl).toArrow()

            batch = Batch(batch_id, collected, time.monotonic() - started, self.spec.checkpoint, per_topic=run)
            try:
                self.handler(batch)
            except BaseException as exc:
                self.batch_error = exc
                raise
        finally:
            reduced.unpersist()
            rows.unpersist()

    def _slice_key(self) -> Column:
        """A column Spark's hash partitioning sends to task `slice_of(topic)` (control/slices.py), so a topic's slice is
        the same in Spark tasks as on the driver, and topics spread over the tasks as crc32 spreads them rather than
        as Spark's hash of a few names happens to."""
        slices = self.spec.slices
        if self._slice_keys is None:  # for each slice s, the smallest int Spark's repartition sends to task s
            ids = self.spark.range(0, 64 * slices).select(
                F.col("id").cast("int").alias("k"), F.pmod(F.hash(F.col("id").cast("int")), F.lit(slices)).alias("s")
            )
            first = {row["s"]: row["k"] for row in ids.groupBy("s").agg(F.min("k").alias("k")).collect()}
            self._slice_keys = [first[s] for s in range(slices)]
        of_topic = F.pmod(F.crc32(F.col("topic").cast("binary")), F.lit(slices))  # = zlib.crc32(topic) % slices
        return F.element_at(F.array(*(F.lit(k) for k in self._slice_keys)), (of_topic + 1).cast("int"))

    def start(self, once: bool = False) -> StreamingQuery:
        writer = (
            self._read()
            .writeStream.foreachBatch(self.process_batch)
            .option("checkpointLocation", str(self.spec.checkpoint))
            .queryName(self.spec.name)
        )
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.spec.trigger_interval_ms} milliseconds")
        self.query = writer.start()
        return self.query

    def failure(self) -> str | None:
        """Why the query stopped, on one line; None if it did not fail."""
        if self.batch_error is not None:
            return describe(self.batch_error)
        exc = self.query.exception() if self.query is not None else None
        return None if exc is None else root_cause(str(exc))

    def stop(self, timeout_s: float = 120.0, forced: Callable[[], BaseException | None] | None = None) -> bool:
        """Stop between batches (stopping inside foreachBatch has crashed Spark's stream thread).

        Returns False, leaving the query running, if the running batch did not finish within `timeout_s`. `forced`
        is asked between polls, and what it returns is raised: a second signal that met a Py4J call here is lost to
        it (Py4J retries a command its socket read was interrupted in), so the wait asks the stop event itself.
        """
        query = self.query
        if query is None or not query.isActive:
            return True
        deadline = time.monotonic() + timeout_s
        while query.status.get("isTriggerActive"):
            if forced is not None and (exc := forced()) is not None:
                raise exc
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        query.stop()
        return True


def describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


_PY_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Timeout|Failed|Unavailable)): (.+)$")


def root_cause(message: str) -> str:
    """The innermost Python error line of a Spark failure (tasks report Python tracebacks inside JVM errors), or a
    JVM task's own exception; else the innermost JVM cause (a Kafka client's refusal says more than Py4J's "An error
    occurred while calling o115.collectToPython"); else the first line."""
    found = cause = None
    for line in message.splitlines():
        text = line.strip()
        if text.startswith("Caused by: "):
            text = cause = text.removeprefix("Caused by: ")
        m = _PY_ERROR.match(text)
        if m and not m.group(1).lower().startswith(("org.apache", "py4j", "java.")):  # Py4JJavaError wraps, never says
            found = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"
    if found:
        return found
    if cause:
        name, _, detail = cause.partition(": ")
        return f"{name.rsplit('.', 1)[-1]}: {detail}"[:300].rstrip(": ")
    first = next((ln.strip() for ln in message.splitlines() if ln.strip()), "unknown error")
    return first[:300]
