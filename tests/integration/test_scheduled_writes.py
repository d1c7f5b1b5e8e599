"""Deadlines written only when they change (control/scheduled.py), against real Redis: the zsets end up exactly as
when every evaluation writes every deadline, through batches, ticks, a threshold change and a wipe."""

from __future__ import annotations

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
LAYERS = {"global": {"max.compaction.lag.ms": 2 * H, "consumed.retention.ms": 3 * H}}


class Counting(RedisState):
    """Counts the partitions whose deadlines it stores."""

    stored = 0

    def schedule_many(self, chunks) -> None:  # type: ignore[no-untyped-def]
        self.stored += sum(len(parts) for _, parts, _ in chunks)
        super().schedule_many(chunks)


def zsets(r: redis.Redis, state: RedisState) -> list:
    return r.zrange(state.keys.deadlines, 0, -1, withscores=True)


def test_only_changed_deadlines_are_written_and_redis_holds_the_same_as_writing_all(rclient: redis.Redis) -> None:
    clock = [T0]
    remembering, writing_all = Counting(rclient, prefix="a"), Counting(rclient, prefix="b")
    ctls = [
        Controller(s, LAYERS, RecordingSink(), None, Metrics(CollectorRegistry()), clock=lambda: clock[0])
        for s in (remembering, writing_all)
    ]
    ctls[1].scheduled.off()

    def step(batch_id: int, changes: BatchChanges) -> None:
        for ctl in ctls:
            ctl.on_batch("s", batch_id, changes)

    def same() -> None:
        assert zsets(rclient, remembering) == zsets(rclient, writing_all)

    first = BatchChanges()
    for p in range(40):
        first.topic("t").segments.append((p, Segment(0, 100, T0 - H, 1, T0 - H + p * 1000)))
        first.topic("t").offsets.append(("g", p, 10))
    step(0, first)
    same()
    assert remembering.stored == writing_all.stored == 40 and len(zsets(rclient, remembering)) == 40

    commits = BatchChanges()  # every partition touched, no deadline moves: nothing to store
    for p in range(40):
        commits.topic("t").offsets.append(("g", p, 20))
    step(1, commits)
    same()
    assert (remembering.stored, writing_all.stored) == (40, 80)

    rolled = BatchChanges()  # five partitions compacted, with a later segment, and the group reads all of ten
    for p in range(5):
        rolled.topic("t").segments.append((p, Segment(100, 200, T0, 1, T0)))
        rolled.topic("t").compacted.append((p, 100))
    for p in range(10):
        rolled.topic("t").offsets.append(("g", p, 200 if p < 5 else 100))
    clock[0] += 60_000
    step(2, rolled)
    same()
    assert remembering.stored == 40 + 5 and writing_all.stored == 90

    clock[0] = T0 + 2 * H  # compactions overdue: the ticks decide, and deadlines move
    for ctl in ctls:
        ctl.tick()
    same()

    changed = {"global": {"max.compaction.lag.ms": 4 * H, "consumed.retention.ms": 3 * H}}
    for ctl in ctls:
        ctl.set_layers(changed)
        ctl.evaluate([("t", p) for p in range(40)], "config")
    same()

    rclient.delete(remembering.keys.deadlines, writing_all.keys.deadlines)  # what a wipe does
    ctls[0].forget_scheduled()
    step(3, commits)
    same()
    assert rclient.zcard(remembering.keys.deadlines) == 40


def test_the_compaction_due_zset_earlier_versions_wrote_is_deleted_at_start(rclient: redis.Redis) -> None:
    """Issue 65: a zset member a partition (about 104 B each) that no decision read: gone at the next start."""
    state = RedisState(rclient, prefix="old")
    [retired] = state.keys.retired
    rclient.zadd(retired, {f"t/{p}": T0 for p in range(10)})
    state.start()
    assert not rclient.exists(retired)
