"""What an evaluation slice's task hands the driver (daemon/slice_task.py): its quiet partitions' metrics cross Spark as
rows of `SLICE_DDL` and come back as the same `PartitionStats`, the tombstones' erasure deadline included."""

from __future__ import annotations

import pyarrow as pa

from compactd.daemon.slice_task import _schema, results, stats_row
from compactd.model import PartitionView, Segment
from compactd.policy.forecast import partition_stats
from compactd.policy.thresholds import Thresholds

T0 = 1_800_000_000_000


def test_a_quiet_partitions_metrics_cross_the_share_rows_unchanged() -> None:
    th = Thresholds.model_validate({"max.compaction.lag.ms": 60_000, "forced.retention.ms": 3_600_000})
    seen = PartitionView("t", 3, (Segment(0, 10, T0 - 1000, 5, T0 - 500),), 10, 0, None, 0, T0 - 2000)
    dirty = PartitionView("t", 4, (Segment(0, 10, T0 - 1000, 5, T0 - 500),), None, 0, None, 0)
    quiet = [
        partition_stats(seen, th, T0),
        partition_stats(dirty, th, T0),
        partition_stats(PartitionView("t", 5), th, T0),
    ]
    assert [st.erasure_at is None for st in quiet] == [False, False, True]  # each case of the deadline crosses
    task = {"what": "slice", "touched": 3, "replayed": False, "worker": "w:1", "seconds": 0.1}
    rows = [task, *(stats_row(("t", n), st) for n, st in zip((3, 4, 5), quiet, strict=True))]
    [got], _ = results(pa.Table.from_pylist(rows, schema=_schema()))
    assert got.stats == [(("t", 3), quiet[0]), (("t", 4), quiet[1]), (("t", 5), quiet[2])]
