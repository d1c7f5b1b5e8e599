"""The reference decoder: Kafka records into flat, typed event rows, record by record, and the one reduction's rule.

Two paths per input format, nothing in between. The fast one runs in the JVM, as Column expressions over Spark's
Kafka rows (`streaming/columns.py`); the reference is here (`Decoder.row`: the pydantic models of `codec/events.py`,
the binary codec of `codec/offsets.py`), and names every DLQ reason. Whatever the fast path does not accept reaches
the driver with its bytes and is decided here (`Decoder.complete`). Invalid records become rows with `error` set and
the original bytes kept for the DLQ. `Decoder.reference` runs the reference over whole batches in `mapInArrow` (the
equivalence tests).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import TypeAdapter

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
    ReplicaLog,
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
from compactd.labels import INVALID_FIELD, UNDECODABLE, UNKNOWN_TOPIC

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
        # group metadata: JSON {topic: [partition, ...]} of the members' assignments; a `replica_log` event: JSON
        # [replica, ...] of the partition's replica assignment (its `grp` is the reporting replica's broker id, its
        # `value_offset` the replica's cleaned_up_to, its `base_offset` the replica's oldest local segment's base); a
        # `segment_rolled` event's `value_offset` is its `last_epoch`
        ("assigned", pa.string()),
        ("topic_id", pa.string()),  # an offset commit's topic ID (OffsetCommitValue v4), as a UUID string
        ("n", pa.int64()),  # input records this row stands for (pre-aggregated in the source: many)
    ]
)
DECODED_DDL = (
    "stream string, kind string, topic string, partition int, grp string, base_offset bigint, "
    "end_offset bigint, first_batch_max_ts bigint, size_bytes bigint, value_offset bigint, ts bigint, "
    "error string, message string, src_topic string, src_partition int, src_offset bigint, "
    "raw_key binary, raw_value binary, assigned string, topic_id string, n bigint"
)


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
    # Events a topic's reset superseded (a re-created topic, control/identity.py): topic -> source topic -> source
    # partition -> the source offset the reset happened at. A rebuild reading the sources again drops the topic's
    # events below it, as the running job's reset dropped what they had built: they describe the old log.
    superseded: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict, hash=False)

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
                    # A group-metadata tombstone ends the classic group's membership, not its offsets: Kafka deletes
                    # a group's offsets with offset tombstones first (DeleteGroups, expiry), and the online migration
                    # of a classic group to the consumer protocol writes this tombstone alone, its offsets kept
                    # (both seen on Kafka 4.4). Read as a deletion, the migrated group's positions were wiped.
                    return {**out, "kind": "group_metadata", "grp": k.group, "assigned": "{}"}
                g = decode_group_value(value)
                return {**out, "kind": "group_metadata", "grp": k.group, "assigned": assigned_json(g)}
            assert isinstance(k, OffsetKey)
            out.update(grp=k.group, topic=k.topic, partition=k.partition)
            if value is None:
                return {**out, "kind": "offset_delete"}
            v = decode_offset_value(value)
        except DecodeError as exc:
            return {**out, "error": UNDECODABLE, "message": str(exc)}
        if not 0 <= v.offset <= MAX_INT or not 0 <= k.partition < 2**31:
            return {**out, "error": INVALID_FIELD, "message": f"absurd offset {v.offset} or partition"}
        out.update(kind="offset_commit", value_offset=v.offset, ts=v.commit_timestamp)
        if v.topic_id is not None:  # v4: the incarnation the commit was made on
            out["topic_id"] = v.topic_id
        return out

    def row(self, src_topic: str, value: bytes | None, key: bytes | None = None) -> dict:
        """One record's row on the reference path."""
        if src_topic == self.offsets_topic:
            return self.binary_row(key, value)
        if src_topic == self.config_topic:
            return {"stream": "config", "kind": "config"}
        if src_topic == self.segments_topic:
            return self.reference_row("segments", SEGMENT_EVENTS, value)
        if src_topic == self.commits_topic:
            return self.reference_row("commits", OFFSET_EVENTS, value)
        return {"stream": "unknown", "error": UNKNOWN_TOPIC, "message": f"unexpected topic {src_topic}"}

    def reference_row(self, stream: str, adapter: TypeAdapter, value: bytes | None) -> dict:
        """The pydantic models decide, and name the DLQ reason (every record the fast path does not accept)."""
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
                value_offset=ev.last_epoch,  # the segment's last leader epoch: no segment carries an offset value
            )
        elif isinstance(ev, Compacted):
            out.update(topic=ev.topic, partition=ev.partition, value_offset=ev.cleaned_up_to)
        elif isinstance(ev, ReplicaLog):  # keyed by replica, in log order: a replica's log can be replaced
            assignment = json.dumps(sorted(ev.replicas), separators=(",", ":"))
            out.update(topic=ev.topic, partition=ev.partition, grp=str(ev.replica), value_offset=ev.cleaned_up_to,
                       base_offset=ev.local_log_start, assigned=assignment)  # fmt: skip
        elif isinstance(ev, LogStart):
            out.update(topic=ev.topic, partition=ev.partition, value_offset=ev.log_start_offset)
        elif isinstance(ev, OffsetCommit):
            out.update(grp=ev.group, topic=ev.topic, partition=ev.partition, value_offset=ev.offset)
        elif isinstance(ev, OffsetDelete):
            out.update(grp=ev.group, topic=ev.topic, partition=ev.partition)
        elif isinstance(ev, GroupDelete):
            out.update(grp=ev.group)
        return out

    def record_row(self, src_topic: str, src_partition: int, src_offset: int, key: bytes | None,
                   value: bytes | None) -> dict:  # fmt: skip
        """One record's decoded row (`n` = 1), its bytes kept when it goes to the DLQ or is a config event."""
        out = self.row(src_topic, value, key)
        out.update(src_topic=src_topic, src_partition=src_partition, src_offset=src_offset, n=1)
        if out.get("error") or out["stream"] == "config":
            out.update(raw_key=key, raw_value=value)
        return out

    def rows(self, batch: pa.RecordBatch) -> list[dict]:
        """Kafka-shaped Arrow batch → one decoded row per record (the reference path; `n` = 1)."""
        cols = [batch.column(c).to_pylist() for c in ("topic", "partition", "offset", "key", "value")]
        return self._kept([self.record_row(*rec) for rec in zip(*cols, strict=True)])

    def _kept(self, rows: list[dict]) -> list[dict]:
        """The rows a topic's reset did not supersede (`superseded`)."""
        if not self.superseded:
            return rows
        return [r for r in rows if r.get("src_offset", 0) >= self._cuts(r["src_topic"], r["src_partition"]).get(
            r.get("topic"), -1)]  # fmt: skip

    def _cuts(self, src_topic: str, src_partition: int) -> dict[str, int]:
        """topic -> the source offset below which its events on this source partition are superseded."""
        p = str(src_partition)
        return {t: b[src_topic][p] for t, b in self.superseded.items() if p in b.get(src_topic, {})}

    def complete(self, table: pa.Table) -> pa.Table:
        """What the fast path's tasks left (`streaming/columns.py` `FastPath.reduced`) → decoded rows
        (`DECODED_SCHEMA`): the rows its expressions refused (`slow`, with their bytes) decided here by the reference,
        record by record (it names the DLQ reason), and dropped where a reset superseded them, as the fast path drops
        its own."""
        slow = pc.fill_null(table.column("slow"), True)
        refused = table.filter(slow)
        names = ("src_topic", "src_partition", "src_offset", "raw_key", "raw_value")
        rows = [self.record_row(*rec) for rec in zip(*(refused.column(c).to_pylist() for c in names), strict=True)]
        fast = table.filter(pc.invert(slow))
        arrays = [
            fast.column(f.name).cast(f.type)
            if f.name in _FAST_COLUMNS and f.name in fast.column_names
            else pa.nulls(fast.num_rows, f.type)
            for f in DECODED_SCHEMA
        ]
        decided = pa.Table.from_pylist(self._kept(rows), schema=DECODED_SCHEMA)
        return pa.concat_tables([pa.Table.from_arrays(arrays, schema=DECODED_SCHEMA), decided])

    def completing(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """`mapInArrow` (→ `DECODED_DDL`) over the fast path's reduced rows (`columns.FastPath.reduced`): `complete`
        in the tasks (the evaluation slices leave the decoded rows in the executors)."""
        for batch in batches:
            yield from self.complete(pa.Table.from_batches([batch])).to_batches()

    def reference(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """`mapInArrow` over Spark's Kafka rows, record by record: the reference path."""
        for batch in batches:
            yield to_arrow(self.rows(batch))


# the columns the fast path fills (the others — error, message, raw bytes, assigned — come from the reference only)
_FAST_COLUMNS = frozenset(("stream", "kind", "topic", "partition", "grp", "base_offset", "end_offset",
                           "first_batch_max_ts", "size_bytes", "value_offset", "ts", "src_topic", "src_partition",
                           "src_offset", "topic_id", "n"))  # fmt: skip


# the columns of Spark's Kafka rows the decoders read, and their Arrow types as a decode task gets them
KAFKA_COLUMNS = ("topic", "partition", "offset", "key", "value")
KAFKA_SCHEMA = pa.schema(
    [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()),
     ("value", pa.binary())]
)  # fmt: skip


def to_arrow(rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=DECODED_SCHEMA)


def key_and_order(table: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The reduction's rule, written once: each row's key kind — `error` for a rejected record, `offset` for a (group,
    partition)'s commits and deletions, else its kind — and its order within its key: cleaner checkpoints and log
    starts only move forward (the largest value wins), every other key follows the log order of its source (source
    partition, then offset; a group's records are keyed by group: one partition). A key is the key kind with the
    topic, partition, group and base offset; rejected records and config events are each a key of their own."""
    kind = table.column("kind")
    k = pc.if_else(
        pc.is_valid(table.column("error")),
        pa.scalar("error"),
        pc.if_else(pc.fill_null(pc.is_in(kind, _OFFSET_KINDS), False), pa.scalar("offset"), kind),
    )
    forward = pc.fill_null(pc.is_in(kind, _FORWARD_KINDS), False)
    a = pc.if_else(forward, table.column("value_offset"), pc.cast(table.column("src_partition"), pa.int64()))
    b = pc.if_else(forward, pa.scalar(0, pa.int64()), table.column("src_offset"))
    return k, a, b


def reduce_table(table: pa.Table) -> pa.Table:
    """One row per key (`key_and_order`): its last by order (ties: the last by source position), with `n` summing the
    records the key's rows stand for. The fast path's tasks run the same rule as a group-by
    (`columns.FastPath.reduced`); this one runs on the driver over the tasks' rows and the reference's, or in the
    evaluation slices' tasks."""
    if table.num_rows == 0:
        return table
    kind = table.column("kind")
    single = pc.fill_null(pc.or_kleene(pc.is_valid(table.column("error")), pc.equal(kind, "config")), False)
    kept, rest = table.filter(single), table.filter(pc.invert(single))
    if rest.num_rows == 0:
        return kept
    k, a, b = key_and_order(rest)
    keyed = rest.append_column("_k", k).append_column("_a", a).append_column("_b", b)
    # sort by order, then source position; the last row of each key wins
    order = ("_a", "_b", "src_partition", "src_offset")
    keyed = keyed.take(pc.sort_indices(keyed, [(c, "ascending") for c in order]))
    keyed = keyed.append_column("_i", pa.array(range(keyed.num_rows), pa.int64()))
    winners = keyed.group_by(["_k", "topic", "partition", "grp", "base_offset"], use_threads=False).aggregate(
        [("_i", "last"), ("n", "sum")]
    )
    picked = keyed.take(winners.column("_i_last")).select(table.column_names)
    picked = picked.set_column(picked.schema.get_field_index("n"), "n", winners.column("n_sum"))
    return pa.concat_tables([kept, picked.cast(kept.schema)])


_OFFSET_KINDS = pa.array(["offset_commit", "offset_delete"])
_FORWARD_KINDS = pa.array(["compacted", "log_start"])
