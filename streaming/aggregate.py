"""Reduce a micro-batch in Spark to one row per distinct state key, then turn those rows into BatchChanges.

Redis work then grows with distinct keys (partitions, segments, (group, partition) pairs), not with events:
a group committing 10,000 times in a batch costs one merge entry.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from compactd.model import Segment
from compactd.state.changes import BatchChanges
from compactd.streaming.decode import reduce_table


def aggregate(decoded: DataFrame) -> DataFrame:
    """One row per key: the latest event (commits, in log order) or the furthest one (cleaner, log start); `n` sums
    the input records each row stands for (the source may have pre-aggregated them: see decode.reduce_table)."""
    err = F.col("error").isNotNull()
    kind = F.col("kind")
    key_kind = (
        F.when(err, F.lit("error")).when(kind.isin("offset_commit", "offset_delete"), F.lit("offset")).otherwise(kind)
    )
    # rejected records and config events are kept one by one (keyed by their source position)
    single = err | (kind == "config")
    # Order of events for one key: cleaner checkpoints and log starts only move forward, so the largest
    # wins; offset events follow the log order of the commits topic (keyed by group: one partition).
    order = F.when(
        kind.isin("compacted", "log_start"),
        F.struct(F.col("value_offset").alias("a"), F.lit(0).cast("bigint").alias("b")),
    ).otherwise(F.struct(F.col("src_partition").cast("bigint").alias("a"), F.col("src_offset").alias("b")))
    record = F.struct(*[F.col(c) for c in decoded.columns if c != "n"], order.alias("ord"))
    return (
        decoded.withColumn("k", key_kind)
        .withColumn("e_topic", F.when(single, F.col("src_topic")))
        .withColumn("e_partition", F.when(single, F.col("src_partition")))
        .withColumn("e_offset", F.when(single, F.col("src_offset")))
        .groupBy("k", "topic", "partition", "grp", "base_offset", "e_topic", "e_partition", "e_offset")
        .agg(F.max_by(record, order).alias("r"), F.sum("n").alias("n"))
        .select("k", "n", "r.*")
        .withColumn("ord_a", F.col("ord.a"))
        .withColumn("ord_b", F.col("ord.b"))
        .drop("ord")
    )


def collect_rows(aggregated: DataFrame) -> pa.Table:
    """Bring the (small) aggregate to the driver through Arrow: far cheaper than building Row objects."""
    return aggregated.toArrow()


def reduce_on_driver(pre_aggregated: DataFrame) -> pa.Table:
    """The source's tasks already reduced their records to one row per key (decode.reduce_table): what is left is the
    same reduction over the tasks' rows, done here instead of in a shuffle stage (a micro-batch then runs one Spark
    stage, not two). Returns a table shaped like `aggregate()`'s."""
    return keyed(reduce_table(pre_aggregated.toArrow()))


def keyed(reduced: pa.Table) -> pa.Table:
    """`aggregate()`'s `k`, `ord_a` and `ord_b` columns, in Arrow kernels, for rows reduced by `reduce_table`."""
    kind = reduced.column("kind")
    k = pc.if_else(
        pc.is_valid(reduced.column("error")),
        pa.scalar("error"),
        pc.if_else(pc.fill_null(pc.is_in(kind, _OFFSET_KINDS), False), pa.scalar("offset"), kind),
    )
    forward = pc.fill_null(pc.is_in(kind, _FORWARD_KINDS), False)
    ord_a = pc.if_else(forward, reduced.column("value_offset"), pc.cast(reduced.column("src_partition"), pa.int64()))
    ord_b = pc.if_else(forward, pa.scalar(0, pa.int64()), reduced.column("src_offset"))
    return reduced.append_column("k", k).append_column("ord_a", ord_a).append_column("ord_b", ord_b)


_OFFSET_KINDS = pa.array(["offset_commit", "offset_delete"])
_FORWARD_KINDS = pa.array(["compacted", "log_start"])


@dataclass
class Collected:
    changes: BatchChanges = field(default_factory=BatchChanges)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    config: list[dict[str, Any]] = field(default_factory=list)  # config topic records, in log order
    counts: Counter = field(default_factory=Counter)  # (stream, kind) -> input records
    deleted: dict[str, tuple[int, int]] = field(default_factory=dict)  # group -> log position of its deletion


# the kinds of aggregated rows that belong to one topic: with evaluation shares, they stay in the executors
PER_TOPIC_KINDS = ("segment_rolled", "compacted", "log_start", "offset")


def collect_changes(
    table: pa.Table | list[dict[str, Any]], deleted_elsewhere: dict[str, tuple[int, int]] | None = None
) -> Collected:
    """Aggregated rows (an Arrow table shaped like `aggregate()`'s, or its rows) → typed changes, DLQ rows, and input
    counts. `deleted_elsewhere`: group deletions of the same batch held by another share of its rows (they void this
    share's older offset events). Per-topic rows are read column by column: a batch at a million partitions has
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
    group_deleted: dict[str, tuple[int, int]] = dict(deleted_elsewhere or {})
    memberships: dict[str, tuple[tuple[int, int], str]] = {}
    for r in table.filter(pc.invert(pc.is_in(k, _PER_TOPIC))).to_pylist():  # few: rejected, config, groups
        if r["k"] == "error":
            out.rejected.append(r)
        elif r["k"] == "config":
            out.config.append(r)
        elif r["k"] == "group_delete":
            group_deleted[r["grp"]] = (r["ord_a"], r["ord_b"])
        elif r["k"] == "group_metadata":
            memberships[r["grp"]] = ((r["ord_a"], r["ord_b"]), r["assigned"] or "{}")
    changes = out.changes
    segments = _columns(table.filter(pc.equal(k, "segment_rolled")), *_SEGMENT_COLUMNS)
    for topic, partition, base, end, first_ts, size, ts in zip(*segments, strict=True):
        changes.topic(topic).segments.append((partition, Segment(base, end, first_ts, size, ts)))
    for kind in ("compacted", "log_start"):
        for topic, partition, value in zip(*_columns(table.filter(pc.equal(k, kind)), *_FORWARD_COLUMNS), strict=True):
            getattr(changes.topic(topic), kind).append((partition, value))
    offsets = _columns(table.filter(pc.equal(k, "offset")), *_OFFSET_COLUMNS)
    for group, topic, partition, kind, value, ord_a, ord_b, ts in zip(*offsets, strict=True):
        # an offset event older than its group's deletion in the same batch is void
        if group_deleted and group in group_deleted and (ord_a, ord_b) < group_deleted[group]:
            continue
        tc = changes.topic(topic)
        committed = value if kind == "offset_commit" else None
        tc.offsets.append((group, partition, committed))
        if committed is not None and ts is not None:  # the commit's own time (event `ts`, or the commit timestamp)
            tc.commit_ts[group] = max(ts, tc.commit_ts.get(group, ts))
    changes.group_deletes = sorted(g for g in group_deleted if not deleted_elsewhere or g not in deleted_elsewhere)
    for group, (order, assigned) in sorted(memberships.items()):
        if group in group_deleted and order < group_deleted[group]:
            continue  # the group was deleted after this membership
        changes.assignments[group] = json.loads(assigned)
    out.config.sort(key=lambda r: (r["src_partition"], r["src_offset"]))
    out.deleted = group_deleted
    return out


_PER_TOPIC = pa.array(PER_TOPIC_KINDS)
_SEGMENT_COLUMNS = ("topic", "partition", "base_offset", "end_offset", "first_batch_max_ts", "size_bytes", "ts")
_FORWARD_COLUMNS = ("topic", "partition", "value_offset")
_OFFSET_COLUMNS = ("grp", "topic", "partition", "kind", "value_offset", "ord_a", "ord_b", "ts")


def _columns(table: pa.Table, *names: str) -> list[list[Any]]:
    """The named columns as Python lists (a column the rows do not have reads as nulls)."""
    return [table.column(n).to_pylist() if n in table.column_names else [None] * table.num_rows for n in names]
