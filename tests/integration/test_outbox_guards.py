"""Send-time guards and the outbox with retries, against real Redis (the recording sink stands in for Kafka)."""

from __future__ import annotations

import redis
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.model import ActionRecord, Segment
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000
T0 = 1_800_000_000_000
LIVE = {"dry.run": False, "consumed.retention.ms": H}


class Flaky(RecordingSink):
    """Refuses while `down` is set, the way a cluster that times out answers."""

    def __init__(self) -> None:
        super().__init__(self._reply)
        self.down = True

    def _reply(self, rec: ActionRecord) -> ActionRecord:
        return rec.with_status("failed", error="timed out") if self.down else rec.with_status("sent")


def controller(rclient: redis.Redis, sink: RecordingSink, clock: list[int], layers: dict) -> Controller:
    return Controller(RedisState(rclient), layers, sink, None, Metrics(CollectorRegistry()), clock=lambda: clock[0])


def consumed(topic: str, committed: int, partitions: int = 1, group: str = "g") -> BatchChanges:
    """A partition with one closed old segment [0, 100) and a group committed at `committed`."""
    c = BatchChanges()
    for p in range(partitions):
        c.topic(topic).segments.append((p, Segment(0, 100, T0 - 3 * H, 1, T0 - 3 * H)))
        c.topic(topic).offsets.append((group, p, committed))
    return c


def commit(topic: str, group: str, offset: int | None, partition: int = 0) -> BatchChanges:
    c = BatchChanges()
    c.topic(topic).offsets.append((group, partition, offset))
    return c


def test_refused_action_is_retried_with_backoff_and_survives_a_restart(rclient: redis.Redis) -> None:
    sink, clock = Flaky(), [T0]
    layers = {"global": {**LIVE, "action.backoff.ms": 1000}}
    ctl = controller(rclient, sink, clock, layers)
    ctl.on_batch("s", 0, consumed("t", 100))
    state = RedisState(rclient)
    [rec] = state.outbox()
    assert (rec.status, rec.detail["try"], rec.detail["retry_at"]) == ("pending", 1, T0 + 1000)
    clock[0] += 999
    ctl.tick()  # not due yet
    assert len(sink.executed) == 1
    clock[0] += 1
    ctl.tick()
    assert len(sink.executed) == 2 and state.outbox()[0].detail["retry_at"] == clock[0] + 2000  # doubled
    # a new process on the same Redis picks the action up where the old one left it
    sink2 = Flaky()
    sink2.down = False
    ctl2 = controller(rclient, sink2, clock, layers)
    clock[0] += 2000
    ctl2.tick()
    assert [r.before_offset for r in sink2.executed] == [100]
    assert state.outbox() == [] and ctl.outcomes["failed"] == 2 and ctl2.outcomes["sent"] == 1
    assert state.records([("t", 0)])[("t", 0)][0].detail["try"] == 2  # the sent record keeps its history


def test_newer_decision_supersedes_a_retrying_one(rclient: redis.Redis) -> None:
    sink, clock = Flaky(), [T0]
    ctl = controller(rclient, sink, clock, {"global": LIVE})
    batch = consumed("t", 50)
    batch.topic("t").segments.append((0, Segment(100, 200, T0 - 3 * H, 1, T0 - 3 * H)))
    ctl.on_batch("s", 0, batch)
    assert sink.executed == []  # nothing all groups read yet: 50 is inside the first segment
    ctl.on_batch("s", 1, commit("t", "g", 100))
    assert [r.before_offset for r in sink.executed] == [100]  # refused: waits for its retry
    sink.down = False
    ctl.on_batch("s", 2, commit("t", "g", 200))  # more became deletable: decided and sent at once
    assert [r.before_offset for r in sink.executed] == [100, 200]
    assert RedisState(rclient).outbox() == []


def test_delete_no_longer_safe_at_send_time_is_skipped(rclient: redis.Redis) -> None:
    sink, clock = Flaky(), [T0]
    ctl = controller(rclient, sink, clock, {"global": {**LIVE, "action.backoff.ms": 1000}})
    ctl.on_batch("s", 0, consumed("t", 100))
    assert len(sink.executed) == 1  # refused, waiting for its retry
    ctl.on_batch("s", 1, commit("t", "g", 10))  # the group rewinds before the retry
    sink.down = False
    clock[0] += 1000
    ctl.tick()
    assert len(sink.executed) == 1  # never sent again
    last = RedisState(rclient).last_actions()["t/0"]
    assert last.status == "skipped" and last.detail["why"].startswith("no longer safe: min committed offset is 10")


def test_new_group_without_position_blocks_a_queued_delete(rclient: redis.Redis) -> None:
    sink, clock = Flaky(), [T0]
    ctl = controller(rclient, sink, clock, {"global": {**LIVE, "action.backoff.ms": 1000}})
    ctl.on_batch("s", 0, consumed("t", 100, partitions=2))
    ctl.on_batch("s", 1, commit("t", "late", 100, partition=1))  # a new group, with no position on partition 0
    sink.down = False
    clock[0] += 1000
    ctl.tick()
    last = RedisState(rclient).last_actions()["t/0"]
    assert (last.status, last.detail["why"]) == (
        "skipped",
        "no longer safe: min committed offset is None (unknown if None)",
    )


def test_dry_run_and_exclusion_set_after_the_decision_win_at_send_time(rclient: redis.Redis) -> None:
    sink, clock = Flaky(), [T0]
    ctl = controller(rclient, sink, clock, {"global": {**LIVE, "action.backoff.ms": 1000}})
    batch = consumed("t", 100)
    batch.topics.update(consumed("u", 100).topics)
    ctl.on_batch("s", 0, batch)
    assert len(sink.executed) == 1  # t was refused, which ends the round: u waits in the outbox
    sink.down = False
    ctl.set_layers(
        {"global": {**LIVE, "action.backoff.ms": 1000, "topics.exclude": ["t"]}, "topic:u": {"dry.run": True}}
    )
    clock[0] += 1000
    ctl.tick()
    assert len(sink.executed) == 1
    last = RedisState(rclient).last_actions()
    assert (last["t/0"].status, last["t/0"].detail["why"]) == ("skipped", "excluded by topics.exclude")
    assert last["u/0"].status == "dry_run" and last["u/0"].dry_run


def test_actions_per_second_caps_sends_and_drain_sends_the_rest(rclient: redis.Redis) -> None:
    sink, clock = RecordingSink(), [T0]
    ctl = controller(rclient, sink, clock, {"global": {**LIVE, "actions.per.second": 2}})
    real = [0.0]
    ctl.monotonic = lambda: real[0]
    ctl.on_batch("s", 0, consumed("t", 100, partitions=5))
    assert len(sink.executed) == 2 and ctl.held_back == 3  # a burst of one second's worth
    assert ctl.drain() == 3 and len(sink.executed) == 2  # no time passed: no token
    real[0] += 1.0
    assert ctl.drain() == 1 and len(sink.executed) == 4
    real[0] += 0.5
    assert ctl.drain() == 0 and len(sink.executed) == 5
    assert len({r.partition for r in sink.executed}) == 5  # each partition once


def test_compaction_max_concurrent_caps_nudges_in_flight(rclient: redis.Redis) -> None:
    sink, clock = RecordingSink(), [T0]
    layers = {"global": {"dry.run": False, "max.compaction.lag.ms": H, "compaction.max.concurrent": 2}}
    ctl = controller(rclient, sink, clock, layers)
    batch = BatchChanges()
    for p in range(4):
        batch.topic("g").segments.append((p, Segment(0, 10, T0 - 2 * H, 1, T0 - 2 * H)))
    ctl.on_batch("s", 0, batch)
    assert [r.partition for r in sink.executed] == [0, 1]
    ctl.tick()
    assert len(sink.executed) == 2  # still two in flight
    done = BatchChanges()
    done.topic("g").compacted.append((0, 10))  # the cleaner got to partition 0: its nudge is answered
    ctl.on_batch("s", 1, done)
    assert [r.partition for r in sink.executed] == [0, 1, 2]
    assert RedisState(rclient).compactions_in_flight() == 2
