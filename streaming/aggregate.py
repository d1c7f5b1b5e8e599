"""A micro-batch's rows, reduced to one row per distinct state key, and those rows turned into BatchChanges.

The reduction's rule is written once (`decode.key_and_order`) and run wherever the rows are: in the tasks that read
them, as a group-by (`columns.FastPath.reduced`, the fast path), then on the driver (`decode.reduce_table`, over the
tasks' rows and the reference's) or, with evaluation slices, in the slices' tasks (`reduce_keyed`). The reference
decoder's own tasks (`reducing`, the equivalence tests) run `reduce_table` too. Redis work then grows with distinct keys
(partitions, segments, (group, partition) pairs), not with events: a group committing 10,000 times in a batch costs one
merge entry.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from compactd.clock import now_ms
from compactd.model import ReplicaReport, Segment
from compactd.state.changes import BatchChanges
from compactd.streaming.decode import DECODED_DDL, key_and_order, reduce_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# reduced rows with their key kind and order (`keyed`): what `collect_changes` and the slices' tasks read
KEYED_DDL = f"{DECODED_DDL}, k string, ord_a bigint, ord_b bigint"


def keyed(reduced: pa.Table) -> pa.Table:
    """Reduced rows with the key kind `k` and the order (`ord_a`, `ord_b`) the reduction used."""
    k, ord_a, ord_b = key_and_order(reduced)
    return reduced.append_column("k", k).append_column("ord_a", ord_a).append_column("ord_b", ord_b)


def reduce_on_driver(rows: DataFrame) -> pa.Table:
    """The tasks already reduced their records to one row per key: what is left is the same reduction over the tasks'
    rows, on the driver (one Spark stage a micro-batch, no shuffle). Returns the keyed rows (`KEYED_DDL`)."""
    return keyed(reduce_table(rows.toArrow()))


def reduce_keyed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` (→ `KEYED_DDL`) in an evaluation slice's task: the same reduction over the rows of its topics."""
    received = list(batches)
    if received:
        yield from keyed(reduce_table(pa.Table.from_batches(received))).to_batches()


def reducing(
    decode: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A `mapInArrow` decode whose rows are reduced in its task: each decoded batch as it comes (what is kept between
    batches is one row per key), then all of them, so the task yields one row per state key."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reduced = [reduce_table(pa.Table.from_batches([batch])) for batch in decode(batches)]
        if reduced:
            yield from (reduce_table(pa.concat_tables(reduced)) if len(reduced) > 1 else reduced[0]).to_batches()

    return run


@dataclass
class Collected:
    changes: BatchChanges = field(default_factory=BatchChanges)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    config: list[dict[str, Any]] = field(default_factory=list)  # config topic records, in log order
    counts: Counter = field(default_factory=Counter)  # (stream, kind) -> input records
    deleted: dict[str, tuple[int, int]] = field(default_factory=dict)  # group -> log position of its deletion


# the key kinds of reduced rows that belong to one topic (with evaluation slices, they stay in the executors), and the
# kinds of the records they reduce
PER_TOPIC_KINDS = ("segment_rolled", "compacted", "replica_log", "log_start", "offset")
PER_TOPIC_RECORD_KINDS = ("segment_rolled", "compacted", "replica_log", "log_start", "offset_commit",
                          "offset_delete")  # fmt: skip


def collect_changes(
    table: pa.Table | list[dict[str, Any]], deleted_elsewhere: dict[str, tuple[int, int]] | None = None
) -> Collected:
    """Reduced, keyed rows (`keyed`: an Arrow table, or its rows) → typed changes, DLQ rows, and input
    counts. `deleted_elsewhere`: group deletions of the same batch held by another slice of its rows (they void this
    slice's older offset events). Per-topic rows are read column by column: a batch at a million partitions has
    hundreds of thousands of them, and a dict per row cost more than the rest of the conversion."""
    if isinstance(table, list):
        table = pa.Table.from_pylist(table)
    out = Collected()
    if table.num_rows == 0:
        return out
    k = table.column("k")
    kinds = pc.if_else(pc.equal(k, "error"), pa.scalar("rejected"), table.column("kind"))
    counted = pa.table({"s": table.column("stream"), "c": kinds, "n": table.column("n")})
    counted = counted.group_by(["s", "c"], use_threads=False).aggregate([("n", "sum")])
    for stream, kind, n in zip(*_columns(counted, "s", "c", "n_sum"), strict=True):
        out.counts[(stream, kind)] += n
    # group -> (ord_a, ord_b, event time or None): where its deletion sits in the log, and, from the JSON commits
    # topic, when it happened (lists, not tuples, once they crossed to a slice's task)
    group_deleted: dict[str, Any] = {g: tuple(d) for g, d in (deleted_elsewhere or {}).items()}
    memberships: dict[str, tuple[tuple[int, int], str]] = {}
    for r in table.filter(pc.invert(pc.is_in(k, _PER_TOPIC))).to_pylist():  # few: rejected, config, groups
        if r["k"] == "error":
            out.rejected.append(r)
        elif r["k"] == "config":
            out.config.append(r)
        elif r["k"] == "group_delete":
            # a deletion stamped after it was read (a producer's clock ahead) counts as of its reading, as the merge
            # counts it (state/merge_store.py): at its own time it would void the group's later commits
            ts = min(r["ts"], now_ms()) if r["stream"] == "commits" and r["ts"] is not None else None
            group_deleted[r["grp"]] = (r["ord_a"], r["ord_b"], ts)
        elif r["k"] == "group_metadata":
            memberships[r["grp"]] = ((r["ord_a"], r["ord_b"]), r["assigned"] or "{}")
    changes = out.changes
    segments = _columns(table.filter(pc.equal(k, "segment_rolled")), *_SEGMENT_COLUMNS)
    for topic, partition, base, end, first_ts, size, ts, epoch in zip(*segments, strict=True):
        tc = changes.topic(topic)
        tc.segments.append((partition, Segment(base, end, first_ts, size, ts)))
        if epoch is not None:  # the segment's last leader epoch (the agent's; value_offset carries it)
            tc.segment_epochs[(partition, base)] = epoch
    compacted = _columns(table.filter(pc.equal(k, "compacted")), *_FORWARD_COLUMNS, "ts")
    for topic, partition, value, ts in zip(*compacted, strict=True):  # with the clean's time (lua/merge.lua keeps it)
        changes.topic(topic).compacted.append((partition, value, ts))
    reports = _columns(table.filter(pc.equal(k, "replica_log")), *_FORWARD_COLUMNS, "base_offset", "grp", "assigned",
                       "ts")  # fmt: skip
    for topic, partition, cleaned, local, replica, assigned, ts in zip(*reports, strict=True):
        changes.topic(topic).replicas.append(ReplicaReport(partition, int(replica), cleaned, local, ts,
                                                           json.loads(assigned)))  # fmt: skip
    log_starts = _columns(table.filter(pc.equal(k, "log_start")), *_FORWARD_COLUMNS)
    for topic, partition, value in zip(*log_starts, strict=True):
        changes.topic(topic).log_start.append((partition, value))
    offsets = _columns(table.filter(pc.equal(k, "offset")), *_OFFSET_COLUMNS)
    for group, topic, partition, kind, value, ord_a, ord_b, ts, topic_id, stream in zip(*offsets, strict=True):
        # an offset event older than its group's deletion in the same batch is void
        if group_deleted and group in group_deleted and before_deletion((ord_a, ord_b), ts, group_deleted[group]):
            continue
        tc = changes.topic(topic)
        committed = value if kind == "offset_commit" else None
        tc.offsets.append((group, partition, committed))
        if committed is not None and topic_id:
            tc.offset_ids[(group, partition)] = topic_id
        if committed is not None and stream == "commits" and ts is not None:
            tc.offset_ts[(group, partition)] = ts
        if committed is not None and ts is not None:  # the commit's own time (event `ts`, or the commit timestamp)
            tc.commit_ts[group] = max(ts, tc.commit_ts.get(group, ts))
    changes.group_deletes = sorted(g for g in group_deleted if not deleted_elsewhere or g not in deleted_elsewhere)
    changes.group_delete_ts = {g: d[2] for g in changes.group_deletes if (d := group_deleted[g])[2] is not None}
    for group, (order, assigned) in sorted(memberships.items()):
        if group in group_deleted and order < group_deleted[group][:2]:
            continue  # the group was deleted after this membership
        changes.assignments[group] = json.loads(assigned)
    out.config.sort(key=lambda r: (r["src_partition"], r["src_offset"]))
    out.deleted = group_deleted
    return out


_PER_TOPIC = pa.array(PER_TOPIC_KINDS)
_SEGMENT_COLUMNS = (
    "topic", "partition", "base_offset", "end_offset", "first_batch_max_ts", "size_bytes", "ts", "value_offset",
)  # fmt: skip
_FORWARD_COLUMNS = ("topic", "partition", "value_offset")
_OFFSET_COLUMNS = ("grp", "topic", "partition", "kind", "value_offset", "ord_a", "ord_b", "ts", "topic_id", "stream")


def before_deletion(order: tuple[int, int], ts: int | None, deletion: tuple[Any, ...]) -> bool:
    """Whether an offset event came before its group's deletion. On the JSON commits topic a group's deletion
    (keyed by group) and its commits (keyed by group, topic and partition) sit in different partitions, whose order
    says nothing: their event times do (a tie counts the commit as after: the group keeps holding, the safe side). A
    group's `__consumer_offsets` records all sit in one partition: there the log order is the order."""
    d_order, d_ts = (deletion[0], deletion[1]), deletion[2] if len(deletion) > 2 else None
    if d_ts is not None and ts is not None:
        return ts < d_ts
    return order < d_order


def _columns(table: pa.Table, *names: str) -> list[list[Any]]:
    """The named columns as Python lists (a column the rows do not have reads as nulls)."""
    return [table.column(n).to_pylist() if n in table.column_names else [None] * table.num_rows for n in names]
