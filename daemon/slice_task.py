"""The Spark task side of evaluation slices: a slice of a batch's per-topic rows merged and planned in an executor.

`task(...)` builds the `mapInArrow` function the streaming job runs over the per-topic rows, hash-partitioned by topic
(one task per slice): it turns its rows into changes, connects to Redis, runs `evaluate_slice` (control/slices.py) and
yields, as rows, the partitions left for the driver's full plan and the quiet partitions' metrics. `results` reads
them back on the driver. What the driver keeps, and why, is in control/slices.py.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from compactd.control.evaluation import BatchThresholds
from compactd.control.slices import SliceResult, evaluate_slice
from compactd.policy.arrays import NONE
from compactd.policy.forecast import PartitionStats
from compactd.policy.readers import Holds
from compactd.settings import Settings
from compactd.streaming.aggregate import collect_changes

# what: "full" (plan on the driver), "stats" (a quiet partition's metrics), "slice" (the task: touched, replayed)
SLICE_DDL = (
    "what string, topic string, partition bigint, touched bigint, replayed boolean, worker string, seconds double, "
    "earliest bigint, lag bigint, min_committed bigint, log_start bigint, "
    "next_lag bigint, next_consumed bigint, next_forced bigint, erasure bigint"
)
_RULES = ("max_compaction_lag", "consumed_retention", "forced_retention")
NEXT = ("lag", "consumed", "forced")


def task(
    settings: Settings,
    layers: Mapping[str, Mapping[str, Any]],
    own_topics: frozenset[str],
    stream_id: str,
    batch_id: int,
    now: int,
    deleted: dict[str, tuple[int, int]],
    holds: Holds | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function one slice runs. `deleted`: the batch's group deletions (on the driver), which void older offset
    events of the slice's rows; `holds`: the readers the driver read for the batch (control/readers.py), counted in
    the slice's plans as they are in the driver's."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        started = time.monotonic()
        received = list(batches)
        worker = f"{socket.gethostname()}:{os.getpid()}"
        result = SliceResult()
        rows = pa.Table.from_batches(received) if received else None
        if rows is not None and rows.num_rows:  # a slice without rows still reports (merged 0): the log names each task
            changes = collect_changes(rows, deleted_elsewhere=deleted).changes
            state = settings.redis_state()
            try:
                result = evaluate_slice(
                    state, BatchThresholds(layers, own_topics, holds), stream_id, batch_id, changes, now
                )
            finally:
                state.close()
        out: list[dict[str, Any]] = [
            {"what": "slice", "touched": result.touched, "replayed": result.replayed, "worker": worker,
             "seconds": time.monotonic() - started}
        ]  # fmt: skip
        out.extend({"what": "full", "topic": t, "partition": p} for t, p in result.full)
        out.extend(stats_row(key, st) for key, st in result.stats)
        yield pa.RecordBatch.from_pylist(out, schema=_schema())

    return run


def stats_row(key: tuple[str, int], st: PartitionStats) -> dict[str, Any]:
    """A quiet partition's metrics as a row of `SLICE_DDL` (a quiet row frees nothing: its deletable figures are 0,
    and `results` reads them back so)."""
    nxt = dict(st.next_at)
    return {
        "what": "stats", "topic": key[0], "partition": key[1], "earliest": st.earliest_ts, "lag": st.lag_ms,
        "min_committed": st.min_committed, "log_start": st.log_start, "erasure": st.erasure_at,
        **{f"next_{k}": nxt.get(rule) for k, rule in zip(NEXT, _RULES, strict=True)},
    }  # fmt: skip


def _schema() -> pa.Schema:
    types = {"string": pa.string(), "bigint": pa.int64(), "boolean": pa.bool_(), "double": pa.float64()}
    return pa.schema([(name, types[kind]) for name, kind in (f.split() for f in SLICE_DDL.split(", "))])


def results(table: pa.Table) -> tuple[list[SliceResult], list[tuple[str, float]]]:
    """The tasks' rows as one `SliceResult` per task, and each task's worker ("host:pid") and seconds."""
    slices: list[SliceResult] = []
    workers: list[tuple[str, float]] = []
    full: list[tuple[str, int]] = []
    stats: list[tuple[tuple[str, int], PartitionStats]] = []
    for row in table.to_pylist():
        if row["what"] == "slice":
            slices.append(SliceResult(touched=row["touched"], replayed=row["replayed"]))
            workers.append((row["worker"], row["seconds"]))
        elif row["what"] == "full":
            full.append((row["topic"], row["partition"]))
        else:
            nxt = tuple(
                (rule, row[f"next_{k}"])
                for k, rule in zip(NEXT, _RULES, strict=True)
                if row[f"next_{k}"] is not None and row[f"next_{k}"] != NONE
            )
            st = PartitionStats(
                row["earliest"], row["lag"], row["min_committed"], row["log_start"], 0, 0, 0, 0, nxt, row["erasure"]
            )
            stats.append(((row["topic"], row["partition"]), st))
    if not slices:
        return [], []
    # rows of one task are not kept apart in the table: the driver needs the totals, not who planned what
    slices[0].full, slices[0].stats = full, stats
    return slices, workers
