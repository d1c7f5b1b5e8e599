"""Reduce a micro-batch in Spark to one row per distinct state key, then turn those rows into BatchChanges.

Redis work then grows with distinct keys (partitions, segments, (group, partition) pairs), not with events:
a group committing 10,000 times in a batch costs one merge entry.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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


def collect_rows(aggregated: DataFrame) -> list[dict[str, Any]]:
    """Bring the (small) aggregate to the driver through Arrow: far cheaper than building Row objects."""
    return aggregated.toArrow().to_pylist()


def reduce_on_driver(pre_aggregated: DataFrame) -> list[dict[str, Any]]:
    """The source's tasks already reduced their records to one row per key (decode.reduce_table): what is left is the
    same reduction over the tasks' rows, done here instead of in a shuffle stage (a micro-batch then runs one Spark
    stage, not two). Returns rows shaped like `aggregate()`'s."""
    out = []
    for row in reduce_table(pre_aggregated.toArrow()).to_pylist():
        kind = row.get("kind")
        if row.get("error") is not None:
            k = "error"
        elif kind in ("offset_commit", "offset_delete"):
            k = "offset"
        else:
            k = kind
        forward = kind in ("compacted", "log_start")
        ord_a, ord_b = (row["value_offset"], 0) if forward else (row["src_partition"], row["src_offset"])
        out.append({**row, "k": k, "ord_a": ord_a, "ord_b": ord_b})
    return out


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
    rows: Iterable[dict[str, Any]], deleted_elsewhere: dict[str, tuple[int, int]] | None = None
) -> Collected:
    """Aggregated rows (flat dicts) → typed changes, DLQ rows, and input counts. `deleted_elsewhere`: group deletions
    of the same batch held by another share of its rows (they void this share's older offset events)."""
    out = Collected()
    offsets: list[tuple[str, str, int, int | None, tuple[int, int], int | None]] = []
    group_deleted: dict[str, tuple[int, int]] = dict(deleted_elsewhere or {})
    memberships: dict[str, tuple[tuple[int, int], str]] = {}
    for row in rows:
        k, r, n = row["k"], row, row["n"]
        out.counts[(r["stream"], r["kind"] if k != "error" else "rejected")] += n
        if k == "error":
            out.rejected.append(r)
        elif k == "config":
            out.config.append(r)
        elif k == "segment_rolled":
            seg = Segment(r["base_offset"], r["end_offset"], r["first_batch_max_ts"], r["size_bytes"], r["ts"])
            out.changes.topic(r["topic"]).segments.append((r["partition"], seg))
        elif k == "compacted":
            out.changes.topic(r["topic"]).compacted.append((r["partition"], r["value_offset"]))
        elif k == "log_start":
            out.changes.topic(r["topic"]).log_start.append((r["partition"], r["value_offset"]))
        elif k == "offset":
            value = r["value_offset"] if r["kind"] == "offset_commit" else None
            ts = r.get("ts") if value is not None else None
            offsets.append((r["grp"], r["topic"], r["partition"], value, (r["ord_a"], r["ord_b"]), ts))
        elif k == "group_delete":
            group_deleted[r["grp"]] = (r["ord_a"], r["ord_b"])
        elif k == "group_metadata":
            memberships[r["grp"]] = ((r["ord_a"], r["ord_b"]), r["assigned"] or "{}")
    for group, topic, partition, value, order, ts in offsets:
        # an offset event older than its group's deletion in the same batch is void
        if group in group_deleted and order < group_deleted[group]:
            continue
        tc = out.changes.topic(topic)
        tc.offsets.append((group, partition, value))
        if ts is not None:  # the commit's own time (event `ts`, or __consumer_offsets' commit timestamp)
            tc.commit_ts[group] = max(ts, tc.commit_ts.get(group, ts))
    out.changes.group_deletes = sorted(g for g in group_deleted if not deleted_elsewhere or g not in deleted_elsewhere)
    for group, (order, assigned) in sorted(memberships.items()):
        if group in group_deleted and order < group_deleted[group]:
            continue  # the group was deleted after this membership
        out.changes.assignments[group] = json.loads(assigned)
    out.config.sort(key=lambda r: (r["src_partition"], r["src_offset"]))
    out.deleted = group_deleted
    return out
