"""The two phases of a compaction run on Spark.

Phase 1 reads the previous generation (view ranges) and the source delta (previous horizon → new horizon,
read_committed) as one DataFrame, each task computing KIP-280's order key of its records with the pure rule
(`strategy.order_key`), and reduces each (partition, key) to the record with the largest order key: a group-by with
`max_by`, i.e. a shuffle that spills to disk, so memory is bounded by Spark, not by a heap map of every key.
Phase 2 repartitions the winners by source partition, sorts each by source offset and writes them into the view's
partition of the same number; each writing task reports the contiguous view range it wrote. Tombstones are settled
there with the pure rule (`reduce.settle`).

A retried writing task starts a new range after the failed attempt's records: those are below the published range
and are collected as garbage like an old generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from compactd.errors import CompactdError

OFFSET_HEADER = "compactd.offset"  # a view record's source offset (decimal ASCII)
DROP_NULL = -2  # nk of the one group per partition that collects null keys to drop (their count is kept)
CHUNK = 1_000_000  # offsets per read task: large partitions are read in parallel

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
        ("size", pa.int64()),
    ]
)
INPUT_DDL = (
    "partition int, key binary, value binary, headers array<struct<key:string,value:binary>>, timestamp bigint, "
    "offset bigint, k1 bigint, k2 bigint, k3 bigint, nk bigint, size bigint"
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


def split(topic: str, partition: int, start: int, end: int, from_view: bool, chunk: int = CHUNK) -> list[ReadRange]:
    return [ReadRange(topic, partition, lo, min(end, lo + chunk), from_view) for lo in range(start, end, chunk)]


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
        return [ReadRange(**r) for r in json.loads(self.options["ranges"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from compactd.compaction.strategy import Strategy, order_key
        from compactd.kafka.config import KafkaConnection
        from compactd.streaming.kafka_source import READER_DEFAULTS, KafkaRange, read_messages

        assert isinstance(partition, ReadRange)
        conf = KafkaConnection.from_spark_options(self.options).client("consumer", READER_DEFAULTS)
        strategy = Strategy.of(**json.loads(self.options["strategy"]))
        retain = self.options.get("retain_null_key", "false") == "true"
        rng = KafkaRange(partition.topic, partition.partition, partition.start, partition.end)
        timeout_ms = int(self.options.get("readtimeoutms", "120000"))
        for msgs in read_messages(conf, rng, timeout_ms):
            cols: dict[str, list[Any]] = {name: [] for name in INPUT_SCHEMA.names}
            for m in msgs:
                headers = [(k, v) for k, v in (m.headers() or [])]
                offset = m.offset()
                if partition.from_view:
                    source = [v for k, v in headers if k == OFFSET_HEADER]
                    if not source or source[-1] is None or not source[-1].isdigit():
                        raise ViewCorrupt(f"{partition.topic}/{partition.partition}@{offset} has no {OFFSET_HEADER}")
                    offset = int(source[-1])
                    headers = [(k, v) for k, v in headers if k != OFFSET_HEADER]
                kind, ts = m.timestamp()
                ts = ts if kind != 0 else -1
                key, value = m.key(), m.value()
                k1, k2, k3 = order_key(strategy, offset, ts, headers)
                cols["partition"].append(partition.partition)
                cols["key"].append(key)
                cols["value"].append(value)
                cols["headers"].append([{"key": k, "value": v} for k, v in headers])
                cols["timestamp"].append(ts)
                cols["offset"].append(offset)
                cols["k1"].append(k1)
                cols["k2"].append(k2)
                cols["k3"].append(k3)
                cols["nk"].append(-1 if key is not None else offset if retain else DROP_NULL)
                cols["size"].append(len(key or b"") + len(value or b""))
            yield pa.RecordBatch.from_pydict(cols, schema=INPUT_SCHEMA)


@dataclass(frozen=True)
class WriteSpec:
    """What each writing task needs: picklable, no clients."""

    producer_conf: dict[str, Any]
    view: str
    now: int
    delete_retention_ms: int


def write_view(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Phase 2 in one task: write the winners (sorted by partition, source offset) into the view, one report row per
    source partition with the view range written and what was counted."""
    from confluent_kafka import Producer

    from compactd.compaction.reduce import Record, settle

    producer = Producer(spec.producer_conf)
    ranges: dict[int, list[int]] = {}
    errors: list[str] = []
    stats: dict[int, dict[str, int]] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        lo_hi = ranges.setdefault(msg.partition(), [msg.offset(), msg.offset()])
        lo_hi[0] = min(lo_hi[0], msg.offset())
        lo_hi[1] = max(lo_hi[1], msg.offset())

    for batch in batches:
        rows = batch.to_pydict()
        for i in range(batch.num_rows):
            p = rows["partition"][i]
            st = stats.setdefault(p, dict.fromkeys(WRITTEN_SCHEMA.names[3:], 0))
            st["records_in"] += rows["n"][i]
            st["bytes_in"] += rows["size"][i]
            key = rows["key"][i]
            if key is None and rows["nk"][i] == DROP_NULL:
                st["null_keys"] += rows["n"][i]
                continue
            headers = tuple((h["key"], h["value"]) for h in rows["headers"][i] or [])
            rec = Record(rows["offset"][i], rows["timestamp"][i], key, rows["value"][i], headers)
            kept, what = settle(rec, spec.now, spec.delete_retention_ms)
            if kept is None:
                st["expired"] += 1
                continue
            st["keys" if what == "key" else "tombstones"] += 1
            out_headers = [*kept.headers, (OFFSET_HEADER, str(kept.offset).encode())]
            while True:
                try:
                    producer.produce(
                        spec.view,
                        key=kept.key,
                        value=kept.value,
                        headers=out_headers,
                        partition=p,
                        timestamp=max(kept.timestamp, 0),
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
            st["written"] += 1
            st["bytes_out"] += len(kept.key or b"") + len(kept.value or b"")
    left = producer.flush(120)
    if left or errors:
        raise CompactdError(f"view {spec.view}: {left} records undelivered, {len(errors)} refused {errors[:1]}")
    out: dict[str, list[int]] = {name: [] for name in WRITTEN_SCHEMA.names}
    for p, st in sorted(stats.items()):
        lo, hi = ranges.get(p, [-1, -2])
        out["partition"].append(p)
        out["view_start"].append(lo)
        out["view_end"].append(hi + 1)
        for name, value in st.items():
            out[name].append(value)
    yield pa.RecordBatch.from_pydict(out, schema=WRITTEN_SCHEMA)


def run_phases(
    spark: Any,
    spark_options: Mapping[str, str],
    ranges: list[ReadRange],
    strategy: Mapping[str, Any],
    retain_null_key: bool,
    spec: WriteSpec,
    partitions: int,
) -> list[dict[str, int]]:
    """Both phases as one Spark job; one report per source partition that had any input."""
    from pyspark.sql import functions as F

    if not ranges:
        return []
    spark.dataSource.register(CompactionInput)
    df = (
        spark.read.format(CompactionInput.name())
        .options(**spark_options)
        .option("ranges", json.dumps([r.__dict__ for r in ranges]))
        .option("strategy", json.dumps(dict(strategy)))
        .option("retain_null_key", "true" if retain_null_key else "false")
        .load()
    )
    winners = df.groupBy("partition", "key", "nk").agg(
        F.max_by(F.struct("value", "headers", "timestamp", "offset"), F.struct("k1", "k2", "k3")).alias("w"),
        F.count(F.lit(1)).alias("n"),
        F.sum("size").alias("size"),
    )
    flat = winners.select("partition", "key", "nk", "w.value", "w.headers", "w.timestamp", "w.offset", "n", "size")
    ordered = flat.repartition(max(1, partitions), "partition").sortWithinPartitions("partition", "offset")
    rows = ordered.mapInArrow(lambda it: write_view(spec, it), WRITTEN_DDL).collect()
    return [r.asDict() for r in rows]
