"""Decode Kafka rows (Spark's Kafka source shape) into flat, typed event rows inside Spark executors.

Used with `DataFrame.mapInArrow`: Arrow in, Arrow out, pydantic-core validation per record. Invalid
records become rows with `error` set and the original bytes kept for the DLQ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from compactd.codec.events import (
    MAX_INT,
    OFFSET_EVENTS,
    SEGMENT_EVENTS,
    Compacted,
    GroupDelete,
    LogStart,
    OffsetCommit,
    OffsetDelete,
    Rejected,
    SegmentRolled,
    parse,
)
from compactd.codec.offsets import (
    DecodeError,
    GroupKey,
    GroupValue,
    OffsetKey,
    OtherKey,
    decode_group_value,
    decode_key,
    decode_offset_value,
)

DECODED_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("grp", pa.string()),
        ("base_offset", pa.int64()),
        ("end_offset", pa.int64()),
        ("first_batch_max_ts", pa.int64()),
        ("size_bytes", pa.int64()),
        ("value_offset", pa.int64()),  # cleaned_up_to / log_start_offset / committed offset
        ("ts", pa.int64()),
        ("error", pa.string()),
        ("message", pa.string()),
        ("src_topic", pa.string()),
        ("src_partition", pa.int32()),
        ("src_offset", pa.int64()),
        ("raw_key", pa.binary()),
        ("raw_value", pa.binary()),
        ("assigned", pa.string()),  # group metadata: JSON {topic: [partition, ...]} of the members' assignments
    ]
)
DECODED_DDL = (
    "stream string, kind string, topic string, partition int, grp string, base_offset bigint, "
    "end_offset bigint, first_batch_max_ts bigint, size_bytes bigint, value_offset bigint, ts bigint, "
    "error string, message string, src_topic string, src_partition int, src_offset bigint, "
    "raw_key binary, raw_value binary, assigned string"
)
_FIELDS = [f.name for f in DECODED_SCHEMA]


def assigned_json(group: GroupValue) -> str:
    """What the members of a consumer group are assigned, merged over members, as compact JSON.

    Only the `consumer` protocol carries topic/partition assignments; other groups (Connect, ...) assign nothing.
    """
    out: dict[str, set[int]] = {}
    if group.protocol_type == "consumer":
        for member in group.members:
            for topic, parts in member.assigned_partitions().items():
                out.setdefault(topic, set()).update(parts)
    return json.dumps({t: sorted(p) for t, p in sorted(out.items()) if p}, separators=(",", ":"))


@dataclass(frozen=True)
class Decoder:
    """Picklable decoder: maps each source topic to the stream it carries."""

    segments_topic: str
    commits_topic: str
    max_event_bytes: int = 64 * 1024
    offsets_topic: str = "__consumer_offsets"
    # Config events are rare and validated on the driver (signatures need the secrets, which stay there):
    # here they only pass through with their bytes.
    config_topic: str = "compactd.config"

    def binary_row(self, key: bytes | None, value: bytes | None) -> dict:
        """A `__consumer_offsets` record → the same rows as the JSON offset events."""
        out: dict = {"stream": "consumer_offsets"}
        try:
            if key is None:
                raise DecodeError("record has no key")
            k = decode_key(key)
            if isinstance(k, OtherKey):
                return {**out, "kind": f"skipped_key_v{k.version}"}
            if isinstance(k, GroupKey):
                if value is None:
                    return {**out, "kind": "group_delete", "grp": k.group}
                g = decode_group_value(value)
                return {**out, "kind": "group_metadata", "grp": k.group, "assigned": assigned_json(g)}
            assert isinstance(k, OffsetKey)
            out.update(grp=k.group, topic=k.topic, partition=k.partition)
            if value is None:
                return {**out, "kind": "offset_delete"}
            v = decode_offset_value(value)
        except DecodeError as exc:
            return {**out, "error": "undecodable", "message": str(exc)}
        if not 0 <= v.offset <= MAX_INT or not 0 <= k.partition < 2**31:
            return {**out, "error": "invalid_field", "message": f"absurd offset {v.offset} or partition"}
        return {**out, "kind": "offset_commit", "value_offset": v.offset, "ts": v.commit_timestamp}

    def row(self, src_topic: str, value: bytes | None, key: bytes | None = None) -> dict:
        if src_topic == self.offsets_topic:
            return self.binary_row(key, value)
        if src_topic == self.config_topic:
            return {"stream": "config", "kind": "config"}
        if src_topic == self.segments_topic:
            stream, adapter = "segments", SEGMENT_EVENTS
        elif src_topic == self.commits_topic:
            stream, adapter = "commits", OFFSET_EVENTS
        else:
            return {"stream": "unknown", "error": "unknown_topic", "message": f"unexpected topic {src_topic}"}
        try:
            ev = parse(adapter, value, self.max_event_bytes)
        except Rejected as exc:
            return {"stream": stream, "error": exc.reason, "message": exc.message}
        out: dict = {"stream": stream, "kind": ev.type, "ts": ev.ts}
        if isinstance(ev, SegmentRolled):
            out.update(
                topic=ev.topic,
                partition=ev.partition,
                base_offset=ev.base_offset,
                end_offset=ev.end_offset,
                first_batch_max_ts=ev.first_batch_max_ts,
                size_bytes=ev.size_bytes,
            )
        elif isinstance(ev, Compacted):
            out.update(topic=ev.topic, partition=ev.partition, value_offset=ev.cleaned_up_to)
        elif isinstance(ev, LogStart):
            out.update(topic=ev.topic, partition=ev.partition, value_offset=ev.log_start_offset)
        elif isinstance(ev, OffsetCommit):
            out.update(grp=ev.group, topic=ev.topic, partition=ev.partition, value_offset=ev.offset)
        elif isinstance(ev, OffsetDelete):
            out.update(grp=ev.group, topic=ev.topic, partition=ev.partition)
        elif isinstance(ev, GroupDelete):
            out.update(grp=ev.group)
        return out

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            cols = {name: [] for name in _FIELDS}
            keys = batch.column("key").to_pylist()
            values = batch.column("value").to_pylist()
            topics = batch.column("topic").to_pylist()
            parts = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            for key, value, src_topic, src_part, src_off in zip(keys, values, topics, parts, offsets, strict=True):
                out = self.row(src_topic, value, key)
                out.update(src_topic=src_topic, src_partition=src_part, src_offset=src_off)
                if out.get("error") or out["stream"] == "config":
                    out.update(raw_key=key, raw_value=value)
                for name in _FIELDS:
                    cols[name].append(out.get(name))
            yield pa.RecordBatch.from_pydict(cols, schema=DECODED_SCHEMA)
