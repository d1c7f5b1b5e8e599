"""A group's deletion and its commits on the JSON commits topic are ordered by their event times, not by the topic's
partition numbers: `<group>/<topic>/<partition>` and `<group>` keys land in different partitions.

The operator's runs of the issue, on a 4-partition commits topic, with `run --once` and the cluster check off, then
again after Redis lost everything (a rebuild from the compacted commits topic). Ground truth: the broker's low
watermarks. Before the fix, case A kept the deleted group's 500 (low watermark 0, not 2000), and case B deleted to
2000 while the new group stood at 500."""

from __future__ import annotations

import json
import time

import pytest

from compactd.daemon.application import Application
from tests.support.events import old_segments

pytestmark = pytest.mark.spark
H = 3_600_000


def test_a_groups_deletion_and_commits_go_by_event_time_across_partitions(spark, cluster, job_settings) -> None:
    now = int(time.time() * 1000)
    a, b = cluster.name("a"), cluster.name("b")
    thresholds = {"global": {"dry.run": False}, **{f"topic:{t}": {"consumed.retention.ms": H} for t in (a, b)}}
    settings = job_settings(thresholds=thresholds, cluster_check="off")
    t = settings.topics
    cluster.create(t.commits, 4, {"cleanup.policy": "compact"})
    cluster.create(t.segments)
    segments = []
    for topic in (a, b):
        cluster.create(topic, 1, {"cleanup.policy": "delete"})
        cluster.fill(topic, 3000)
        segments += old_segments(topic, [1000, 2000, 3000], now)
    cluster.send(t.segments, segments)

    def commit(group: str, topic: str, offset: int, ts: int, partition: int) -> None:
        ev = {"type": "offset_commit", "group": group, "topic": topic, "partition": 0, "offset": offset, "ts": ts}
        cluster.send_raw(t.commits, json.dumps(ev).encode(), f"{group}/{topic}/0".encode(), partition)

    def delete(group: str, ts: int, partition: int) -> None:
        ev = {"type": "group_delete", "group": group, "ts": ts}
        cluster.send_raw(t.commits, json.dumps(ev).encode(), group.encode(), partition)

    for topic in (a, b):
        commit("H", topic, 2500, now - 5000, 0)
    # case A: G commits 500 on partition 3, then G is deleted (on partition 1): G holds nothing any more
    commit("G", a, 500, now - 2000, 3)
    delete("G", now - 1000, 1)
    # case B: N is deleted (on partition 3), then a new N commits 500 (on partition 1): N holds b at 500
    delete("N", now - 2000, 3)
    commit("N", b, 500, now - 1000, 1)
    cluster.flush()

    with Application(settings, spark=spark) as job:
        job.run(once=True)
    assert cluster.watermarks(a) == (2000, 3000)  # H at 2500 alone holds a
    assert cluster.watermarks(b) == (0, 3000)  # N at 500 holds [0, 1000)

    # Redis loses everything: the rebuild reads the compacted commits topic again, and decides the same
    settings.redis_state().r.flushall()
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        assert job.state.view(b, 0).min_committed == 500 and job.state.view(a, 0).min_committed == 2500
    assert cluster.watermarks(b) == (0, 3000)
    assert cluster.watermarks(a) == (2000, 3000)
