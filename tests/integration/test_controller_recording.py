"""The controller against real Redis with the recording sink: no broker needed to see what it would carry out."""

from __future__ import annotations

import redis
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.metrics import Metrics
from compactd.model import Segment
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000
T0 = 1_800_000_000_000


def test_overdue_partition_is_carried_out_once_and_dry_run_never(rclient: redis.Redis) -> None:
    sink, clock = RecordingSink(), [T0]
    layers = {"topic:live": {"dry.run": False, "max.compaction.lag.ms": H}, "topic:dry": {"max.compaction.lag.ms": H}}
    ctl = Controller(RedisState(rclient), layers, sink, None, Metrics(CollectorRegistry()), clock=lambda: clock[0])
    batch = BatchChanges()
    for topic in ("live", "dry"):
        batch.topic(topic).segments.append((0, Segment(0, 10, T0 - 2 * H, 1, T0 - 2 * H)))
    assert ctl.on_batch("s", 0, batch) == 2
    assert [(r.topic, r.action) for r in sink.executed] == [("live", "compact")]
    ctl.on_batch("s", 0, batch)  # the replayed batch decides nothing again
    clock[0] += 60_000
    ctl.tick()  # nor does a tick before action.retry.ms
    assert len(sink.executed) == 1 and ctl.outcomes == {"sent": 1, "dry_run": 1}


def test_a_restarted_controller_fills_metrics_without_deciding(rclient: redis.Redis) -> None:
    sink, clock = RecordingSink(), [T0]
    layers = {"global": {"dry.run": False, "max.compaction.lag.ms": H}}
    first = Controller(RedisState(rclient), layers, sink, None, Metrics(CollectorRegistry()), clock=lambda: clock[0])
    batch = BatchChanges()
    for p in range(5):
        batch.topic("t").segments.append((p, Segment(0, 10, T0 - 30 * 60_000, 1, T0 - 30 * 60_000)))
    first.on_batch("s", 0, batch)  # nothing overdue yet
    clock[0] += 2 * H  # the process dies; two hours later a new one starts
    metrics = Metrics(CollectorRegistry())
    second = Controller(RedisState(rclient), layers, sink, None, metrics, clock=lambda: clock[0])
    assert second.warm_metrics(limit=2) == 3 and len(metrics.partitions) == 2
    assert second.warm_metrics(limit=2) == 1
    assert second.warm_metrics(limit=2) == 0 and len(metrics.partitions) == 5
    assert metrics.registry.get_sample_value("compactd_topic_compaction_delay_seconds", {"topic": "t"}) == 5400
    assert sink.executed == [] and RedisState(rclient).outbox() == []  # warming never decides
    second.tick()  # the deadlines stored by the first process still fire
    assert len(sink.executed) == 5
