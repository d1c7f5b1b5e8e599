"""The controller against real Redis with the recording sink: no broker needed to see what it would carry out."""

from __future__ import annotations

import pytest
import redis
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
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


def test_batches_and_ticks_run_with_the_collector_off_and_leave_it_on(rclient: redis.Redis) -> None:
    """compactd/gc_pause.py: a batch's objects die by reference counting, not in full collections mid-batch."""
    from compactd.gc_pause import collecting

    seen: list[tuple[str, bool]] = []
    state = RedisState(rclient)
    ctl = Controller(
        state, {"global": {"max.compaction.lag.ms": H}}, RecordingSink(), None, Metrics(CollectorRegistry()),
        clock=lambda: T0, probe=lambda point, _: seen.append((point, collecting())),
    )  # fmt: skip
    batch = BatchChanges()
    batch.topic("t").segments.append((0, Segment(0, 10, T0 - 2 * H, 1, T0 - 2 * H)))
    ctl.on_batch("s", 0, batch)
    assert seen == [("after_merge", False), ("after_enqueue", False)] and collecting()

    def due(now: int) -> list[tuple[str, int]]:
        seen.append(("due", collecting()))
        raise RuntimeError("Redis went away")

    state.due = due  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        ctl.tick()
    assert seen[-1] == ("due", False) and collecting()  # off during the tick, on after it failed


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


@pytest.mark.parametrize("slices", [0, 2], ids=["evaluated-here", "in-slices"])
def test_run_once_ends_with_the_partitions_its_batches_did_not_evaluate_and_those_due_since(
    rclient: redis.Redis, slices: int
) -> None:
    """`run --once` evaluates each partition once: what its batches touched is not planned again at its end, unless
    its deadline passed meanwhile; everything else is, with the thresholds of this run."""
    sink, clock = RecordingSink(), [T0]
    earlier = BatchChanges()  # merged by an earlier run, with thresholds under which nothing was due
    for p in range(4):
        earlier.topic("t").segments.append((p, Segment(0, 10, T0 - 2 * H, 1, T0 - 2 * H)))
    Controller(RedisState(rclient), {}, sink, None, Metrics(CollectorRegistry()), clock=lambda: clock[0]).on_batch(
        "s", 0, earlier
    )
    layers = {
        "global": {"dry.run": False, "max.compaction.lag.ms": H, "action.retry.ms": 4 * H},
        "partition:t/1": {"max.compaction.lag.ms": 3 * H},
    }
    metrics = Metrics(CollectorRegistry())
    ctl = Controller(RedisState(rclient), layers, sink, None, metrics, clock=lambda: clock[0], slices=slices)
    ctl.track_evaluated()
    batch = BatchChanges()
    batch.topic("t").segments.append((0, Segment(10, 20, T0 - 2 * H, 1, T0 - 2 * H)))
    batch.topic("t").segments.append((1, Segment(10, 20, T0 - 2 * H, 1, T0 - 2 * H)))
    assert ctl.on_batch("s", 1, batch) == 2  # partition 0 overdue and sent; partition 1 due in an hour
    assert [(r.partition, r.action) for r in sink.executed] == [(0, "compact")]
    clock[0] += H + 1  # partition 1's deadline passes before the run ends
    assert ctl.evaluate_rest() == 3  # 2 and 3, never evaluated by this run, and 1, due since; not 0
    assert sorted(r.partition for r in sink.executed) == [0, 1, 2, 3]
    evaluations = metrics.registry.get_sample_value("compactd_partition_evaluations_total", {"trigger": "full"})
    assert evaluations == 3
