"""Events on the broker → the Spark job (available-now) → Redis state → action records and a real deleteRecords."""

from __future__ import annotations

import time

import pytest

from state.store import RedisState
from streaming.job import Job

pytestmark = pytest.mark.spark
HOUR = 3_600_000


def test_once_run_deletes_consumed_segments_and_compacts_overdue(spark, cluster, job_settings, redis_url) -> None:
    now = int(time.time() * 1000)
    orders, ctopic = cluster.name("orders"), cluster.name("ctopic")
    cluster.create(orders, 1, {"cleanup.policy": "delete"})
    cluster.create(ctopic, 1, {"cleanup.policy": "compact"})
    cluster.fill(orders, 3000)
    settings = job_settings(
        thresholds={
            "global": {"dry.run": False},
            f"topic:{orders}": {"consumed.retention.ms": HOUR},
            f"topic:{ctopic}": {"max.compaction.lag.ms": HOUR},
        }
    )
    seg = settings.topics.segments
    cluster.send(
        seg,
        [
            {
                "type": "segment_rolled",
                "topic": orders,
                "partition": 0,
                "base_offset": 0,
                "end_offset": 1000,
                "first_batch_max_ts": now - 3 * HOUR,
                "size_bytes": 10,
                "ts": now - 2 * HOUR,
            },
            {
                "type": "segment_rolled",
                "topic": orders,
                "partition": 0,
                "base_offset": 1000,
                "end_offset": 2000,
                "first_batch_max_ts": now - 2 * HOUR,
                "size_bytes": 10,
                "ts": now - 90 * 60_000,
            },
            {
                "type": "segment_rolled",
                "topic": orders,
                "partition": 0,
                "base_offset": 2000,
                "end_offset": 3000,
                "first_batch_max_ts": now - HOUR,
                "size_bytes": 10,
                "ts": now - 60_000,
            },
            {
                "type": "segment_rolled",
                "topic": ctopic,
                "partition": 0,
                "base_offset": 0,
                "end_offset": 100,
                "first_batch_max_ts": now - 2 * HOUR,
                "size_bytes": 10,
                "ts": now - HOUR,
            },
        ],
    )
    cluster.send(
        settings.topics.commits,
        [
            {"type": "offset_commit", "group": "billing", "topic": orders, "partition": 0, "offset": 1500, "ts": now},
            {"type": "offset_commit", "group": "analytics", "topic": orders, "partition": 0, "offset": 2500, "ts": now},
        ],
    )

    with Job(settings, spark=spark) as job:
        job.run(once=True)

    actions = {a["action"]: a for a in cluster.read_all(settings.topics.actions)}
    delete = actions["delete_records"]
    assert (delete["topic"], delete["partition"], delete["before_offset"]) == (orders, 0, 1000)
    assert (delete["reason"], delete["status"], delete["dry_run"]) == ("consumed_retention", "sent", False)
    compact = actions["compact"]
    assert (compact["topic"], compact["reason"], compact["status"]) == (ctopic, "max_compaction_lag", "sent")
    assert compact["delay_ms"] >= HOUR - 5_000
    assert cluster.watermarks(orders) == (1000, 3000)
    view = RedisState.from_url(redis_url).view(orders, 0)
    assert view.min_committed == 1500
    assert [s.base_offset for s in view.segments] == [0, 1000, 2000]
