"""`run --once` with nothing new on the source topics skips Spark (most of its start-up time) and still evaluates
every partition and sends what is due; anything unread, or a batch planned but not finished, starts Spark."""

from __future__ import annotations

import json
from pathlib import Path

from compactd.daemon.application import Application
from compactd.model import Segment
from compactd.state.changes import BatchChanges


def spark_log(checkpoint: Path, batch: int, ends: dict, committed: bool) -> None:
    """Spark's offset log layout (v1, batch metadata, one line per source) and its commit marker."""
    spark = checkpoint / "spark"
    (spark / "offsets").mkdir(parents=True, exist_ok=True)
    (spark / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(ends)}\n')
    if committed:
        (spark / "commits").mkdir(parents=True, exist_ok=True)
        (spark / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_nothing_to_read_evaluates_everything_without_spark(job_settings, cluster) -> None:
    s = job_settings(thresholds={"global": {"max.compaction.lag.ms": 1000}})
    overdue = BatchChanges()
    overdue.topic("orders").segments.append((0, Segment(0, 100, 0, 1, 0)))  # first record at ts 0: long overdue
    s.redis_state().merge("earlier-run", 0, overdue, lambda g, t: True)

    with Application(s) as app:
        app.run(once=True)
        assert app.job is None and app.spark is None  # Spark never started
    actions = cluster.read_all(s.topics.actions)
    assert [(a["topic"], a["action"], a["status"]) for a in actions] == [("orders", "compact", "dry_run")]


def test_unread_records_or_an_unfinished_batch_need_spark(job_settings, cluster) -> None:
    s = job_settings()
    with Application(s) as app:  # creates the topics, nothing to read yet
        app.run(once=True)
        assert app.job is None
    cluster.send_raw(s.topics.segments, b"{}", b"k", 0)
    cluster.flush()
    checkpoint = Path(s.checkpoint_dir)
    fresh = Application(s)
    assert not fresh._nothing_to_read()  # one record unread

    ends = {s.topics.segments: {"0": 1}, s.topics.commits: {"0": 0}}
    spark_log(checkpoint, 0, ends, committed=False)
    assert not Application(s)._nothing_to_read()  # planned, not finished: Spark replays it
    spark_log(checkpoint, 0, ends, committed=True)
    assert Application(s)._nothing_to_read()
