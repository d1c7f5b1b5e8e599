"""Reading a topic compacted: what Pulsar's `readCompacted` reader sees, for Kafka topics, as a library call, a
command (`compactd read TOPIC --compacted [--table]`) and a Spark data source (`compactd-view`).

A reader takes the published manifest once and reads, per partition, the generation's view range and then the
source from that generation's horizon to its end: no gap and no duplicate, whatever is published meanwhile (the
generation it read stays for `compaction.view.grace.ms`, and source retention stays below its horizon for as long).
`table` applies the topic's strategy over view and tail: one record per live key, as a table of the topic's
current state, with nothing replayed but the view and the tail.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from compactd.compaction.manifest import Manifest, source_changed
from compactd.compaction.reduce import Record
from compactd.compaction.spark_run import ReadRange, message_fields
from compactd.compaction.strategy import Strategy, order_key, replaces
from compactd.errors import CompactdError
from compactd.kafka.watermarks import watermarks

READ_TIMEOUT_MS = 120_000


class ViewGone(CompactdError):
    """What a reader needs was deleted under it (a generation collected, or the source's own retention)."""


@dataclass(frozen=True)
class ReadSplit(InputPartition):
    """One partition's part of the compacted read: its view range, then its source tail."""

    topic: str
    view: str
    partition: int
    view_start: int
    view_end: int
    tail_start: int
    tail_end: int


def plan(manifest: Manifest | None, topic: str, low: Mapping[int, int], high: Mapping[int, int]) -> list[ReadSplit]:
    """Per source partition, what a compacted read covers. Without a published generation: the whole source."""
    out = []
    for p in sorted(high):
        pv = manifest.partitions.get(str(p)) if manifest is not None and manifest.generation > 0 else None
        if pv is None:
            out.append(ReadSplit(topic, "", p, 0, 0, low.get(p, 0), high[p]))
        else:
            view = manifest.view if manifest is not None else ""
            out.append(ReadSplit(topic, view, p, pv.view_start, pv.view_end, pv.horizon, max(pv.horizon, high[p])))
    return out


def _records(conf: dict[str, Any], topic: str, p: int, start: int, end: int, from_view: bool) -> Iterator[Record]:
    from compactd.kafka.range_read import KafkaRange, read_messages

    if end <= start:
        return
    where = ReadRange(topic, p, start, end, from_view)
    for msgs in read_messages(conf, KafkaRange(topic, p, start, end), READ_TIMEOUT_MS, strict=True):
        for m in msgs:
            offset, ts, headers = message_fields(m, from_view, where)
            yield Record(offset, ts, m.key(), m.value(), tuple(headers))


def read_segment(conf: dict[str, Any], seg: ReadSplit, low: Mapping[str, int] | None = None) -> Iterator[Record]:
    """The records of one partition's compacted read, in order: view, then tail. `low`: the view's and the
    source's first offsets now ({"view": …, "source": …}), checked so nothing deleted is silently skipped."""
    if low is not None:
        if seg.view_end > seg.view_start and low.get("view", 0) > seg.view_start:
            raise ViewGone(
                f"{seg.view}/{seg.partition}: the generation was collected while being read "
                "(read again, or raise compaction.view.grace.ms)"
            )
        if seg.tail_end > seg.tail_start and low.get("source", 0) > seg.tail_start:
            raise ViewGone(
                f"{seg.topic}/{seg.partition}: source offsets [{seg.tail_start},{low['source']}) were deleted "
                "past the view's horizon (the topic's own retention): the compacted read would have a gap"
            )
    if seg.view:
        yield from _records(conf, seg.view, seg.partition, seg.view_start, seg.view_end, True)
    yield from _records(conf, seg.topic, seg.partition, seg.tail_start, seg.tail_end, False)


def first_offsets(conf: dict[str, Any], seg: ReadSplit) -> dict[str, int]:
    """The view's and the source's first offsets of the segment's partition now (what `read_segment` checks)."""
    from compactd.kafka.config import new_consumer

    consumer = new_consumer({**conf, "group.id": f"compactd-view-{uuid.uuid4()}"})
    try:
        out = {"source": watermarks(consumer, seg.topic, seg.partition, 30)[0]}
        if seg.view:
            out["view"] = watermarks(consumer, seg.view, seg.partition, 30)[0]
        return out
    finally:
        consumer.close()


def table(records: Iterable[Record], strategy: Strategy) -> list[Record]:
    """One record per live key under the strategy (winning tombstones remove their key; null keys are no key);
    `records` in log order (view, then tail)."""
    best: dict[bytes, tuple[tuple[int, int, int], Record]] = {}
    for rec in records:
        if rec.key is None:
            continue
        rank = order_key(strategy, rec.offset, rec.timestamp, rec.headers)
        held = best.get(rec.key)
        if held is None or replaces(strategy, held[0], held[1].tombstone, rank, rec.tombstone):
            best[rec.key] = (rank, rec)
    return sorted((r for _, r in best.values() if not r.tombstone), key=lambda r: r.offset)


class CompactedReader:
    """The library call: `CompactedReader(settings).records(topic, table=False)`."""

    def __init__(self, conn: Any, manifest_topic: str) -> None:
        from compactd.compaction.cluster import CompactionCluster
        from compactd.compaction.store import ManifestLog
        from compactd.kafka.range_read import reader_conf

        self.conn = conn
        self.manifests = ManifestLog(conn, manifest_topic)
        self.cluster = CompactionCluster(conn)
        self.conf = reader_conf(conn, forced={"group.id": f"compactd-view-{uuid.uuid4()}"})

    def segments(self, topic: str) -> tuple[Manifest | None, list[ReadSplit]]:
        count = self.cluster.partitions(topic)
        if count is None:
            raise CompactdError(f"topic {topic} does not exist")
        try:
            manifest = self.manifests.read(topic)
        finally:
            self.manifests.close()  # a reader reads the manifest once: nothing stays connected after it
        low = self.cluster.offsets(topic, "earliest", count)
        high = self.cluster.offsets(topic, "latest", count)
        if manifest is not None and manifest.generation > 0:
            uncommitted = self.cluster.offsets(topic, "latest", count, committed=False)
            changed = source_changed(manifest, count, low, uncommitted, self.cluster.topic_id(topic))
            if changed:
                raise ViewGone(
                    f"{topic}: its view (generation {manifest.generation}) was built from another log ({changed}): "
                    f"nothing read; `compactd compact {topic}` starts a view of this one"
                )
        return manifest, plan(manifest, topic, low, high)

    def partition_records(
        self, topic: str, table_mode: bool = False, strategy: Strategy | None = None
    ) -> Iterator[tuple[int, Record]]:
        """(partition, record) of the compacted read, partition by partition; `table_mode`: live keys only."""
        manifest, segs = self.segments(topic)
        rule = strategy or (manifest.strategy_rule if manifest is not None else Strategy())
        view_low: dict[int, int] = {}
        if manifest is not None and manifest.generation > 0:  # the view's partitions the generation names
            named = 1 + max((int(p) for p in manifest.partitions), default=-1)
            view_low = self.cluster.offsets(manifest.view, "earliest", named, committed=False)
        source_low = self.cluster.offsets(topic, "earliest", len(segs), committed=False)
        for seg in segs:
            low = {"view": view_low.get(seg.partition, 0), "source": source_low.get(seg.partition, 0)}
            recs: Iterable[Record] = read_segment(self.conf, seg, low)
            if table_mode:
                recs = table(recs, rule)
            for rec in recs:
                yield seg.partition, rec


def _text(raw: bytes | None, name: str) -> dict[str, Any]:
    if raw is None:
        return {name: None}
    try:
        return {name: raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(raw).decode()}


def _header_value(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode()}


def json_line(partition: int, rec: Record) -> str:
    """The contract's line: {"partition","offset","timestamp","key","value","headers"}."""
    out: dict[str, Any] = {"partition": partition, "offset": rec.offset, "timestamp": rec.timestamp}
    out.update(_text(rec.key, "key"))
    out.update(_text(rec.value, "value"))
    out["headers"] = [{k: _header_value(v)} for k, v in rec.headers]
    return json.dumps(out, separators=(",", ":"))


# -- the Spark data source
VIEW_DDL = (
    "partition int, offset bigint, timestamp timestamp, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>"
)
VIEW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        # Spark checks a reader's batches against its own Arrow form of the schema: timestamps in microseconds
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)


class ViewSource(DataSource):
    """`spark.read.format("compactd-view").option("topic", T).option("kafka.bootstrap.servers", …).load()`;
    option `table` = "true" for one row per live key (reduced per partition inside the task that reads it),
    `manifests` = the manifest topic (default compactd.compactions)."""

    @classmethod
    def name(cls) -> str:
        return "compactd-view"

    def schema(self) -> str:
        return VIEW_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return _ViewReader(self.options)


class _ViewReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        from compactd.kafka.config import KafkaConnection

        self.options = dict(options)
        self.conn = KafkaConnection.from_spark_options(options)
        self.topic = self.options["topic"]
        reader = CompactedReader(self.conn, self.options.get("manifests", "compactd.compactions"))
        self.manifest, self.segs = reader.segments(self.topic)

    def partitions(self) -> list[InputPartition]:
        return list(self.segs)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from compactd.kafka.range_read import reader_conf

        assert isinstance(partition, ReadSplit)
        conf = reader_conf(self.conn)
        recs: Iterable[Record] = read_segment(conf, partition, first_offsets(conf, partition))
        if self.options.get("table", "false").lower() == "true":
            rule = self.manifest.strategy_rule if self.manifest is not None else Strategy()
            recs = table(recs, rule)
        cols: dict[str, list[Any]] = {name: [] for name in VIEW_SCHEMA.names}
        for rec in recs:
            cols["partition"].append(partition.partition)
            cols["offset"].append(rec.offset)
            cols["timestamp"].append(rec.timestamp * 1000 if rec.timestamp >= 0 else None)
            cols["key"].append(rec.key)
            cols["value"].append(rec.value)
            cols["headers"].append([{"key": k, "value": v} for k, v in rec.headers])
            if len(cols["offset"]) >= 50_000:
                yield pa.RecordBatch.from_pydict(cols, schema=VIEW_SCHEMA)
                cols = {name: [] for name in VIEW_SCHEMA.names}
        if cols["offset"]:
            yield pa.RecordBatch.from_pydict(cols, schema=VIEW_SCHEMA)
