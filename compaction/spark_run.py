"""The two phases of a compaction run on Spark.

Phase 1 reads the previous generation (view ranges) and the source delta (previous horizon → new horizon,
read_committed) and reduces each (partition, key) to the record with the largest KIP-280 order key; phase 2 writes
the winners into the view's partition of the same number, in source-offset order, and reports the contiguous view
range it wrote. Tombstones are settled there (`reduce.settle`).

The fast path runs both phases in one JVM task per group of whole partitions (`run_in_jvm`; its Java is
`streaming/jvm/java/io/compactd/compaction/`): Spark only schedules the tasks. The Python path below it
(`shuffle_phases`: reading tasks combining with the pure rules, a group-by with `max_by` in Spark's shuffle, which
spills, Python writing tasks) takes only a partition whose keys outgrow a JVM task's map. The pure rules (`strategy`,
`reduce`) are the reference both are tested against.

A retried writing task starts a new range after the failed attempt's records: those are below the published range
and are collected as garbage like an old generation. One module: both paths share the ranges, the task layout, the
write's contract and its report.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from compactd.compaction.reduce import DELETED_AT
from compactd.errors import CompactdError
from compactd.kafka.watermarks import NEWBORN_S, watermarks

if TYPE_CHECKING:
    from compactd.compaction.local_tasks import LocalTasks

log = logging.getLogger("compactd.compaction")
OFFSET_HEADER = "compactd.offset"  # a view record's source offset (decimal ASCII)
# a winner's own timestamp where the view record cannot carry it (0, or none: -1), decimal ASCII. librdkafka writes
# a timestamp of 0 as the time of writing; read back as "now", it would outrank, under `timestamp`, every newer source
# record produced before the run (ViewRun.java writes the same header)
TIMESTAMP_HEADER = "compactd.timestamp"
# compactd's own headers mean something on the view's records only: a source record's copy (a topic mirrored from a
# view by MirrorMaker 2) is dropped as it is read, or its `deleted_at` expired its tombstone at once and the key came
# back from the view's older record (issue 64)
RESERVED = frozenset({OFFSET_HEADER, TIMESTAMP_HEADER, DELETED_AT})
DROP_NULL = -2  # nk of the one group per partition that collects null keys to drop (their count is kept)
CHUNK = 1_000_000  # offsets per read task: large partitions are read in parallel
HELD_MAX = 250_000  # winners a reading task holds before it hands them to Spark (its memory bound)
MAP_BYTES = 256 << 20  # what one JVM's compaction tasks hold together, at most (`compaction_task_map_mb`)
STALL_MS = 120_000  # a range read with no progress this long fails its task (`compaction_read_stall_ms`)

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
INPUT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
        ("timestamp", pa.int64()),
        ("offset", pa.int64()),
        ("k1", pa.int64()),
        ("k2", pa.int64()),
        ("k3", pa.int64()),
        ("nk", pa.int64()),
        ("n", pa.int64()),
        ("size", pa.int64()),
        ("t_off", pa.int64()),  # `tombstone: latest`: the key's last tombstone the task read (-1: none)
    ]
)
INPUT_DDL = (
    "partition int, key binary, value binary, headers array<struct<key:string,value:binary>>, timestamp bigint, "
    "offset bigint, k1 bigint, k2 bigint, k3 bigint, nk bigint, n bigint, size bigint, t_off bigint"
)
WRITTEN_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("view_start", pa.int64()),
        ("view_end", pa.int64()),
        ("written", pa.int64()),
        ("keys", pa.int64()),
        ("tombstones", pa.int64()),
        ("expired", pa.int64()),
        ("null_keys", pa.int64()),
        ("records_in", pa.int64()),
        ("bytes_in", pa.int64()),
        ("bytes_out", pa.int64()),
    ]
)
WRITTEN_DDL = (
    "partition int, view_start bigint, view_end bigint, written bigint, keys bigint, tombstones bigint, "
    "expired bigint, null_keys bigint, records_in bigint, bytes_in bigint, bytes_out bigint"
)


class ViewCorrupt(CompactdError):
    """A view record lacks its source offset: the view was written by someone else."""


@dataclass(frozen=True)
class ReadRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int
    from_view: bool
    below: int = -1  # a view range: its records of source offsets at or past it are not read (-1: all are)


def split(
    topic: str, partition: int, start: int, end: int, from_view: bool, chunk: int = CHUNK, below: int = -1
) -> list[ReadRange]:
    return [ReadRange(topic, partition, lo, min(end, lo + chunk), from_view, below) for lo in range(start, end, chunk)]


def follows(before: ReadRange, after: ReadRange) -> bool:
    """`after` continues `before` in the order a combine needs: same partition, view before source, offsets rising."""
    if before.partition != after.partition:
        return False
    if before.from_view != after.from_view:
        return before.from_view
    return after.start >= before.end


@dataclass(frozen=True)
class ReadTask(InputPartition):
    """The ranges one reading task reads, in order: a source partition's view ranges, then its source ranges."""

    ranges: tuple[ReadRange, ...]


def pack(ranges: list[ReadRange], tasks: int, chunk: int | None = CHUNK) -> list[ReadTask]:
    """At most `tasks` reading tasks of about equal offsets (largest partitions first onto the least loaded task).
    A partition's ranges stay together and in order (view before source: a key's view record is older than any of
    its source records beyond the horizon), unless it is larger than `chunk`: then its chunks are spread too (None:
    never, as the JVM task needs). Fewer, larger tasks: each costs a consumer of its own."""
    groups: dict[tuple[int, int], list[ReadRange]] = {}
    for r in ranges:
        size = sum(x.end - x.start for x in groups.get((r.partition, 0), []))
        whole = chunk is None or size + (r.end - r.start) <= chunk
        part = 0 if whole else len(groups)  # a chunk of a large partition: a group
        groups.setdefault((r.partition, part), []).append(r)
    loads = [0] * max(1, tasks)
    out: list[list[ReadRange]] = [[] for _ in loads]
    for group in sorted(groups.values(), key=lambda g: -sum(r.end - r.start for r in g)):
        i = loads.index(min(loads))
        out[i].extend(group)
        loads[i] += sum(r.end - r.start for r in group)
    return [ReadTask(tuple(rs)) for rs in out if rs]


class CompactionInput(DataSource):
    """Options: `kafka.*` (the connection), `ranges` (JSON list of ReadRange fields), `strategy` (JSON of
    kind/header/header_format), `retain_null_key` ("true"/"false")."""

    @classmethod
    def name(cls) -> str:
        return "compactd-compaction-input"

    def schema(self) -> str:
        return INPUT_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return _InputReader(self.options)


class _InputReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)

    def partitions(self) -> list[InputPartition]:
        return [ReadTask(tuple(ReadRange(**r) for r in task)) for task in json.loads(self.options["tasks"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from compactd.compaction.strategy import Strategy
        from compactd.kafka.config import KafkaConnection
        from compactd.kafka.range_read import KafkaRange, read_messages, reader_conf

        assert isinstance(partition, ReadTask)
        conf = reader_conf(KafkaConnection.from_spark_options(self.options))
        strategy = Strategy.of(**json.loads(self.options["strategy"]))
        retain = self.options.get("retain_null_key", "false") == "true"
        stall_ms = int(self.options.get("stall_ms", STALL_MS))
        held_max = int(self.options.get("held_max", HELD_MAX))
        combiner: Combiner | None = None
        before: ReadRange | None = None
        for where in partition.ranges:
            if combiner is not None and before is not None and not follows(before, where):
                yield combiner.emit()  # a combine runs over one partition's records in log order only
                combiner = None
            before = where
            if combiner is None:
                combiner = Combiner(where.partition, strategy, retain)
            rng = KafkaRange(where.topic, where.partition, where.start, where.end)
            for msgs in read_messages(conf, rng, stall_ms, strict=True):
                if where.below >= 0:  # the view past where the source was written again (`plan_ranges`)
                    msgs = [m for m in msgs if message_fields(m, True, where)[0] < where.below]
                combiner.add(msgs, where)
                if combiner.held >= held_max:
                    yield combiner.emit()
        if combiner is not None and (combiner.held or combiner.null_n):
            yield combiner.emit()


def message_fields(m: Any, from_view: bool, where: ReadRange) -> tuple[int, int, list[tuple[str, bytes | None]]]:
    """(source offset, timestamp or -1, headers without compactd's own: RESERVED) of one consumed message; a view record
    without its source offset raises ViewCorrupt (the view was not written by compactd)."""
    headers = m.headers() or []
    offset = m.offset()
    if from_view and len(headers) == 1 and headers[0][0] == OFFSET_HEADER and (headers[0][1] or b"").isdigit():
        offset, headers = int(headers[0][1]), []  # the common view record: no headers of its own
    elif from_view:
        source = [v for k, v in headers if k == OFFSET_HEADER]
        if not source or source[-1] is None or not source[-1].isdigit():
            raise ViewCorrupt(f"{where.topic}/{where.partition}@{offset} has no {OFFSET_HEADER}")
        offset = int(source[-1])
        stamped = [v for k, v in headers if k == TIMESTAMP_HEADER]
        headers = [(k, v) for k, v in headers if k not in (OFFSET_HEADER, TIMESTAMP_HEADER)]
        if stamped and stamped[-1] is not None and stamped[-1].lstrip(b"-").isdigit() and len(stamped[-1]) < 20:
            return offset, int(stamped[-1]), headers
    else:
        headers = [(k, v) for k, v in headers if k not in RESERVED] if headers else headers
    kind, ts = m.timestamp()
    return offset, ts if kind != 0 else -1, headers


class Combiner:
    """A map-side combine in the reading task: one row per key with its winner so far under KIP-280's order key,
    and how many records (`n`) and bytes (`size`) it stands for; null keys folded into one counting row (or kept
    one by one with `compaction.retain.null.key`). Spark's shuffle then moves winners, not records: a topic whose
    keys repeat shrinks here. Memory: at most HELD_MAX winners (then they are emitted and a new combine starts;
    Spark's reduce merges the two like any others).

    A key's order key is computed only when the key repeats (with `offset` over source records in log order, not
    even then: the last record wins), so a view's records, one per key, and keys seen once are only decoded once,
    as winners.
    """

    def __init__(self, partition: int, strategy: Any, retain_null_key: bool) -> None:
        self.partition = partition
        self.strategy = strategy
        self.retain = retain_null_key
        self.best: dict[bytes, list[Any]] = {}  # key -> [rank, message, fields, n, size, where it was read]
        self.kept_null: list[tuple[Any, int, ReadRange]] = []
        self.null_n = self.null_size = 0

    @property
    def held(self) -> int:
        return len(self.best) + len(self.kept_null)

    def add(self, msgs: list[Any], where: ReadRange) -> None:
        """Records read from `where`, in its log order (a partition's view ranges come before its source ranges)."""
        from compactd.compaction.strategy import order_key, replaces

        best, strategy = self.best, self.strategy
        # offset: a later record of a key always wins (view records are older than the source beyond the horizon)
        fast = strategy.kind == "offset"
        latest = strategy.tombstone == "latest"
        for m in msgs:
            key, value = m.key(), m.value()
            size = len(key or b"") + len(value or b"")
            if key is None:
                if self.retain:
                    self.kept_null.append((m, size, where))
                else:
                    self.null_n, self.null_size = self.null_n + 1, self.null_size + size
                continue
            held = best.get(key)
            tomb_at = -1
            if latest and value is None:  # where the key's last tombstone is, for Spark's merge of combines
                tomb_at = message_fields(m, where.from_view, where)[0]
            if held is None:  # ranks are computed only when a key repeats (never in a view: one record per key)
                best[key] = [None, m, None, 1, size, where, tomb_at]
                continue
            held[3], held[4] = held[3] + 1, held[4] + size
            if tomb_at >= 0:
                held[6] = tomb_at
            if fast:
                held[1], held[2], held[5] = m, None, where
                continue
            if held[0] is None:
                held[2] = message_fields(held[1], held[5].from_view, held[5])
                held[0] = order_key(strategy, *held[2])
            fields = message_fields(m, where.from_view, where)
            rank = order_key(strategy, *fields)
            if replaces(strategy, held[0], held[1].value() is None, rank, value is None):
                held[0], held[1], held[2], held[5] = rank, m, fields, where

    def emit(self) -> pa.RecordBatch:
        """What is held, as one batch of INPUT_SCHEMA; the combine starts again empty. Columns are built flat (the
        headers as one list array over flat names and values): Arrow's conversion of nested Python objects costs
        more than everything else a reading task does."""
        from compactd.compaction.strategy import order_key

        strategy = self.strategy
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        stamps: list[int] = []
        offsets: list[int] = []
        k1s: list[int] = []
        k2s: list[int] = []
        k3s: list[int] = []
        nks: list[int] = []
        ns: list[int] = []
        sizes: list[int] = []
        t_offs: list[int] = []
        h_bounds = [0]
        h_names: list[str] = []
        h_values: list[bytes | None] = []

        def add(m: Any, fields: Any, nk: int | None, n: int, size: int, where: ReadRange, t_off: int = -1) -> None:
            offset, ts, headers = fields if fields is not None else message_fields(m, where.from_view, where)
            if strategy.kind == "offset":
                k1s.append(offset)
                k2s.append(0)
                k3s.append(0)
            else:
                k1, k2, k3 = order_key(strategy, offset, ts, headers)
                k1s.append(k1)
                k2s.append(k2)
                k3s.append(k3)
            keys.append(m.key())
            values.append(m.value())
            stamps.append(ts)
            offsets.append(offset)
            nks.append(offset if nk is None else nk)
            ns.append(n)
            sizes.append(size)
            t_offs.append(t_off)
            for name, raw in headers:
                h_names.append(name)
                h_values.append(raw)
            h_bounds.append(len(h_names))

        for _, m, fields, n, size, where, t_off in self.best.values():
            add(m, fields, -1, n, size, where, t_off)
        for m, size, where in self.kept_null:
            add(m, None, None, 1, size, where)  # nk = its offset: each kept null key is a group of its own
        if self.null_n:  # the null keys dropped: one row that counts them
            keys.append(None)
            values.append(None)
            for col, value in ((stamps, -1), (offsets, -1), (k1s, -1), (k2s, 0), (k3s, 0), (nks, DROP_NULL)):
                col.append(value)
            ns.append(self.null_n)
            sizes.append(self.null_size)
            t_offs.append(-1)
            h_bounds.append(len(h_names))
        self.best, self.kept_null, self.null_n, self.null_size = {}, [], 0, 0
        headers = pa.ListArray.from_arrays(
            pa.array(h_bounds, pa.int32()),
            pa.StructArray.from_arrays(
                [pa.array(h_names, pa.string()), pa.array(h_values, pa.binary())], fields=list(HEADER_TYPE.value_type)
            ),
        )
        rows = len(keys)
        columns = [
            pa.array(np.full(rows, self.partition, dtype=np.int32)),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            headers,
            *(pa.array(col, pa.int64()) for col in (stamps, offsets, k1s, k2s, k3s, nks, ns, sizes, t_offs)),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=INPUT_SCHEMA)


@dataclass(frozen=True)
class WriteSpec:
    """What each writing task needs: picklable, no clients."""

    producer_conf: dict[str, Any]
    consumer_conf: dict[str, Any]  # for the view's watermarks
    view: str
    now: int
    delete_retention_ms: int
    java_conf: dict[str, str] = field(default_factory=dict)  # the connection as Java client settings (the JVM task)
    record_bytes: int = 0  # the largest record batch the view takes (its max.message.bytes; 0: the clients' default)


@dataclass(frozen=True)
class RunInput:
    """What both phases of a run read and by which rules, besides the write: the ranges, the strategy's options, the
    null-key rule, the source's partition count (the shuffle path's writers) and a task's bounds."""

    ranges: list[ReadRange]
    strategy: Mapping[str, Any]
    retain_null_key: bool
    partitions: int
    held_max: int = HELD_MAX
    map_bytes: int = MAP_BYTES
    stall_ms: int = STALL_MS


def write_view(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Phase 2 in one task: write the winners (sorted by partition, source offset) into the view, one report row per
    source partition with the view range written and what was counted.

    The range of partition p is its high watermark before the first write and after the last one is acknowledged:
    only this task writes the view's partition p in this run (the topic's lease, one task per source partition), and
    the driver checks the range holds exactly the records written before it publishes. So no delivery report is
    needed per record, only for failures.
    """
    from compactd.compaction.reduce import Record, settle
    from compactd.kafka.config import new_consumer, new_producer

    errors: list[str] = []
    producer = new_producer(
        {
            **spec.producer_conf,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, _msg: errors.append(str(err)),
        }
    )
    meter = new_consumer({**spec.consumer_conf, "group.id": "compactd-view-writer"})
    ranges: dict[int, list[int]] = {}
    stats: dict[int, dict[str, int]] = {}

    def high(p: int) -> int:
        return watermarks(meter, spec.view, p, 30, newborn_s=NEWBORN_S)[1]  # the view may be a moment old

    def close(p: int) -> None:
        left = producer.flush(120)
        if left or errors:
            raise CompactdError(f"view {spec.view}/{p}: {left} records undelivered, {len(errors)} refused {errors[:1]}")
        ranges[p][1] = high(p)

    current: int | None = None
    st: dict[str, int] = {}
    produced = 0
    try:
        for batch in batches:
            cols = {name: batch.column(name).to_pylist() for name in batch.schema.names if name != "headers"}
            hcol = batch.column("headers")
            # most topics carry no headers: then no per-row header objects are built at all
            all_headers = hcol.to_pylist() if len(hcol.flatten()) else None
            rows = zip(
                cols["partition"],
                cols["key"],
                cols["value"],
                cols["nk"],
                cols["offset"],
                cols["timestamp"],
                cols["n"],
                cols["size"],
                strict=True,
            )
            for i, (p, key, value, nk, offset, ts, n, size) in enumerate(rows):
                if p != current:
                    if current is not None:
                        close(current)
                    current = p
                    ranges[p] = [high(p), -1]
                    st = stats.setdefault(p, dict.fromkeys(WRITTEN_SCHEMA.names[3:], 0))
                st["records_in"] += n
                st["bytes_in"] += size
                if key is None and nk == DROP_NULL:
                    st["null_keys"] += n
                    continue
                raw = all_headers[i] if all_headers is not None else None
                headers = [(h["key"], h["value"]) for h in raw] if raw else []
                if value is None:  # a tombstone: stamped on its first run, dropped after delete.retention.ms
                    kept, _ = settle(Record(offset, ts, key, None, tuple(headers)), spec.now, spec.delete_retention_ms)
                    if kept is None:
                        st["expired"] += 1
                        continue
                    headers = list(kept.headers)
                    st["tombstones"] += 1
                else:
                    st["keys"] += 1
                if ts <= 0:  # librdkafka writes 0 as the time of writing: the winner's own time goes in a header
                    headers.append((TIMESTAMP_HEADER, str(ts).encode()))
                headers.append((OFFSET_HEADER, str(offset).encode()))
                while True:
                    try:
                        producer.produce(
                            spec.view, key=key, value=value, headers=headers, partition=p, timestamp=max(ts, 0)
                        )
                        break
                    except BufferError:
                        producer.poll(0.1)
                produced += 1
                if produced % 1000 == 0:
                    producer.poll(0)
                st["written"] += 1
                st["bytes_out"] += len(key or b"") + len(value or b"")
        if current is not None:
            close(current)
    finally:
        meter.close()
    out: dict[str, list[int]] = {name: [] for name in WRITTEN_SCHEMA.names}
    for p, counts in sorted(stats.items()):
        out["partition"].append(p)
        out["view_start"].append(ranges[p][0])
        out["view_end"].append(ranges[p][1])
        for name, value in counts.items():
            out[name].append(value)
    yield pa.RecordBatch.from_pydict(out, schema=WRITTEN_SCHEMA)


def run_phases(
    spark: Callable[[], Any],
    spark_options: Mapping[str, str],
    job: RunInput,
    spec: WriteSpec,
    tasks: LocalTasks | None = None,
) -> list[dict[str, int]]:
    """Both phases; one report per source partition that had any input. `spark` returns the session (called only
    where a Spark job runs); `tasks`, when given, runs the JVM tasks without Spark (`local_tasks`).

    Each partition is read whole by one JVM task (`run_in_jvm`): one that has at most `held_max` records to read
    keeps each key's winner and writes them sorted; a larger one is read twice, as Kafka's cleaner does (each key's
    winning offset in a map, then the winners copied in log order). What the tasks hold comes out of one budget per
    JVM, `map_bytes` (ViewRun.Budget): a one-pass read it cannot hold reads twice; a map refused while one-pass reads
    hold part of it waits for them to give it back (up to 60 s), and a partition whose keys still outgrow it goes
    through the Python path instead (`shuffle_phases`): tasks combine what they read and Spark
    reduces what they hand over (a group-by with `max_by` over the order key, a shuffle that spills), then
    repartitions by partition for the writers.
    """
    if not job.ranges:
        return []
    reports = run_in_jvm(None if tasks is not None else spark(), spark_options, job, spec, tasks)
    over = {int(r["partition"]) for r in reports if r.get("overflow")}
    done = [r for r in reports if not r.get("overflow")]
    if over:
        log.info(
            "compaction: partitions %s hold more keys than a task's map: Spark's shuffle reduces them", sorted(over)
        )
        rest = replace(job, ranges=[r for r in job.ranges if r.partition in over])
        done += shuffle_phases(spark(), spark_options, rest, spec)
    return done


def shuffle_phases(
    spark: Any, spark_options: Mapping[str, str], job: RunInput, spec: WriteSpec
) -> list[dict[str, int]]:
    """The Python path: combine in the reading tasks, reduce in Spark's shuffle, write in Python tasks."""
    from pyspark.sql import functions as F

    parallelism = max(1, int(spark.sparkContext.defaultParallelism))
    spark.dataSource.register(CompactionInput)
    strategy = job.strategy
    df = (
        spark.read.format(CompactionInput.name())
        .options(**spark_options)
        .option("tasks", json.dumps([[r.__dict__ for r in t.ranges] for t in pack(job.ranges, 2 * parallelism)]))
        .option("strategy", json.dumps(dict(strategy)))
        .option("retain_null_key", "true" if job.retain_null_key else "false")
        .option("held_max", str(job.held_max))
        .option("stall_ms", str(job.stall_ms))
        .load()
    )
    rank = F.struct("k1", "k2", "k3")
    n, size = F.sum("n"), F.sum("size")
    if strategy.get("tombstone") == "latest":
        # each task's row of a key is its winner after the last tombstone it read (`t_off`): the key's records
        # before its last tombstone anywhere are out, and of the rest any record beats that tombstone
        from pyspark.sql import Window

        key = Window.partitionBy("partition", "key", "nk")
        df = (
            df.withColumn("t_last", F.max("t_off").over(key))
            .withColumn("n_all", F.sum("n").over(key))  # the rows dropped still count as records read
            .withColumn("size_all", F.sum("size").over(key))
            .where(F.col("offset") >= F.col("t_last"))
        )
        rank = F.struct(F.col("value").isNotNull().cast("int"), "k1", "k2", "k3")
        n, size = F.max("n_all"), F.max("size_all")
    winners = df.groupBy("partition", "key", "nk").agg(
        F.max_by(F.struct("value", "headers", "timestamp", "offset"), rank).alias("w"),
        n.alias("n"),
        size.alias("size"),
    )
    flat = winners.select("partition", "key", "nk", "w.value", "w.headers", "w.timestamp", "w.offset", "n", "size")
    writers = max(1, min(job.partitions, 2 * parallelism))  # a writing task writes its partitions one after another
    ordered = flat.repartition(writers, "partition").sortWithinPartitions("partition", "offset")
    rows = ordered.mapInArrow(lambda it: write_view(spec, it), WRITTEN_DDL).collect()
    return [r.asDict() for r in rows]


# the Java producer's settings for the view's writes, over the connection's (as `WriteSpec.producer_conf` for the
# Python writer): in order, one batch in flight, not idempotent
JAVA_PRODUCER = {
    "acks": "all",
    "max.in.flight.requests.per.connection": "1",
    "enable.idempotence": "false",
    "linger.ms": "20",
    "batch.size": "1000000",
    "max.request.size": str(16 << 20),
}
CONSUMER_ONLY = ("fetch.max.wait.ms", "max.partition.fetch.bytes", "max.poll.records", "isolation.level", "group.id")


def jvm_task(task: ReadTask, job: RunInput, spec: WriteSpec) -> str:
    """One task's JSON for `ViewRun.java` (streaming/jvm/java/io/compactd/compaction): what to read and write, by
    which rules; no credentials."""
    return json.dumps(
        {
            "ranges": [r.__dict__ for r in task.ranges],
            "strategy": dict(job.strategy),
            "retain_null_key": job.retain_null_key,
            "view": spec.view,
            "now": spec.now,
            "delete_retention_ms": spec.delete_retention_ms,
            "stall_ms": job.stall_ms,
            "hold_max": job.held_max,
            "map_bytes": job.map_bytes,
        }
    )


def clients_json(spec: WriteSpec) -> str:
    """The Java clients' settings a `ViewRun` holds (and pools its clients by)."""
    producer = {k: v for k, v in spec.java_conf.items() if k not in CONSUMER_ONLY} | JAVA_PRODUCER
    if spec.record_bytes:  # the Java producer refuses a record above 1 MiB by default (`max.request.size`)
        producer["max.request.size"] = str(spec.record_bytes)
    # one poll per fetch, not per 500 records
    return json.dumps({"consumer": {"max.poll.records": "10000", **spec.java_conf}, "producer": producer})


# The key of the compaction functions' names in this process: a name is shown in every plan (Spark's UI, event logs,
# `explain`), and a plain digest of settings holding a password could be inverted by trying passwords
_NAME_KEY = secrets.token_bytes(32)


def view_run(spark: Any, spec: WriteSpec) -> str:
    """The name of the compaction task's function for this connection, registered on the session: an instance of
    `ViewRun.java` holding the Kafka clients' settings (credentials stay out of the query's literals). Named by a
    keyed digest of them (HMAC under a key of this process, never shown), so runs of one connection share it, two
    connections never swap theirs, and the name says nothing of the settings."""
    clients = clients_json(spec)
    name = f"compactd_view_run_{hmac.new(_NAME_KEY, clients.encode(), 'sha256').hexdigest()[:16]}"
    jvm = spark.sparkContext._jvm
    function = jvm.io.compactd.compaction.ViewRun(clients)
    spark._jsparkSession.udf().register(name, function, jvm.org.apache.spark.sql.types.DataTypes.StringType)
    return name


def jvm_query(spark: Any, job: RunInput, spec: WriteSpec) -> Any:
    """The query `run_in_jvm` runs: one row per task, the task's report (column `r`). Its plan (the task JSON as
    literals, the function's name) is what Spark shows in its UI, event logs and `explain`."""
    from pyspark.sql import functions as F

    parallelism = max(1, int(spark.sparkContext.defaultParallelism))
    tasks = [jvm_task(t, job, spec) for t in pack(job.ranges, 2 * parallelism, chunk=None)]
    name = view_run(spark, spec)
    # one Spark partition per task, each of one row (its number): a local table would be one partition per core, and
    # Spark evaluates a projection over a local table while planning it, on the driver
    task = F.element_at(F.array(*map(F.lit, tasks)), (F.col("id") + 1).cast("int"))
    df = spark.range(0, len(tasks), 1, len(tasks))
    return df.select(F.call_udf(name, task).alias("r"))


def run_in_jvm(
    spark: Any, spark_options: Mapping[str, str], job: RunInput, spec: WriteSpec, tasks: LocalTasks | None = None
) -> list[dict[str, int]]:
    """Both phases in one JVM task per group of whole partitions (`ViewRun.java`): read, keep each key's winner, write
    it, report the range. Spark only schedules the tasks (one row each), or `tasks` runs them on threads of the JVM
    without Spark; no record crosses into Python. The tasks' reports are `WRITTEN_SCHEMA`'s rows, or `overflow` for a
    partition whose keys outgrew the task's map."""
    if tasks is not None:
        packed = [jvm_task(t, job, spec) for t in pack(job.ranges, 2 * tasks.threads, chunk=None)]
        results = tasks.run(clients_json(spec), packed)
    else:
        results = [row.r for row in jvm_query(spark, job, spec).collect()]
    reports = [report for result in results for report in json.loads(result)]
    log.debug(
        "compaction tasks in the JVM: %d, reading %.2f s, writing %.2f s (summed over partitions)",
        len(results),
        sum(r.pop("read_seconds", 0.0) for r in reports),
        sum(r.pop("write_seconds", 0.0) for r in reports),
    )
    return reports
