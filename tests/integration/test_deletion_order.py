"""A group's deletion from the JSON commits topic is ordered against its commits partition by partition, through the
real merge script (lua/merge.lua) on a real Redis."""

from __future__ import annotations

import redis

from compactd.clock import now_ms
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

DAY = 86_400_000


def everyone(group: str, topic: str) -> bool:
    return True


def commit(state: RedisState, batch_id: int, group: str, topic: str, partition: int, offset: int, ts: int) -> None:
    """One commit event of the JSON commits topic, in a batch of its own (as the streaming job reduces it)."""
    c = BatchChanges()
    c.topic(topic).offsets.append((group, partition, offset))
    c.topic(topic).offset_ts[(group, partition)] = ts
    c.topic(topic).commit_ts[group] = ts
    state.merge("s", batch_id, c, everyone)


def delete(state: RedisState, batch_id: int, group: str, ts: int) -> None:
    state.merge("s", batch_id, BatchChanges(group_deletes=[group], group_delete_ts={group: ts}), everyone)


def test_a_groups_deletion_goes_by_each_partitions_commit_time(rclient: redis.Redis) -> None:
    """G/T/1@500 (ts 100), then G/T/0@10 (ts 300), then the deletion of G (ts 200), each read in its own batch: the
    deletion came after the commit on T/1 and before the one on T/0. Before the fix the deletion was compared with
    the group's latest commit on the topic (300) and voided as a whole: T/1 kept holding at 500."""
    state = RedisState(rclient)
    commit(state, 0, "G", "T", 1, 500, ts=100)
    commit(state, 1, "G", "T", 0, 10, ts=300)
    delete(state, 2, "G", ts=200)
    assert state.group_offsets("T") == {("G", 0): 10}
    assert state.topic_groups("T").counted == {"G"}  # it still holds T, at its commit after the deletion
    commit(state, 3, "G", "T", 1, 600, ts=400)  # a later commit on T/1 counts again
    assert state.group_offsets("T") == {("G", 0): 10, ("G", 1): 600}
    delete(state, 4, "G", ts=500)  # a deletion after every commit: the group is gone from T
    assert state.group_offsets("T") == {} and state.topic_groups("T").counted == frozenset()


def test_a_deletion_without_a_commit_time_per_partition_keeps_what_may_be_newer(rclient: redis.Redis) -> None:
    """A commit merged without its own time (a state written before times were kept per partition) is judged by the
    group's latest commit time on the topic: newer than the deletion, it stays (the group may be back: it holds)."""
    state = RedisState(rclient)
    c = BatchChanges()
    c.topic("T").offsets += [("G", 0, 10), ("G", 1, 500)]
    c.topic("T").commit_ts["G"] = 300
    state.merge("s", 0, c, everyone)
    delete(state, 1, "G", ts=200)
    assert state.group_offsets("T") == {("G", 0): 10, ("G", 1): 500}
    delete(state, 2, "G", ts=300)  # a tie: the commit counts as after the deletion, the safe side
    assert state.group_offsets("T") == {("G", 0): 10, ("G", 1): 500}
    delete(state, 3, "G", ts=301)
    assert state.group_offsets("T") == {}


def test_a_deletion_stamped_in_the_future_does_not_drop_the_commits_after_it(rclient: redis.Redis) -> None:
    """A producer's clock a day ahead stamps a group's deletion: it cannot have happened after it was read, so it
    counts as of its merge. Before the fix every commit of the group stamped before that day was dropped as older
    than the deletion: the group, consuming again, held nothing back."""
    state = RedisState(rclient)
    now = now_ms()
    commit(state, 0, "F", "U", 0, 100, ts=now - 1_000)
    delete(state, 1, "F", ts=now + DAY)
    assert state.group_offsets("U") == {}  # the commit before it is gone
    commit(state, 2, "F", "U", 0, 200, ts=now_ms() + 1_000)  # the group consumes again after the deletion was read
    assert state.group_offsets("U") == {("F", 0): 200}
    commit(state, 3, "F", "U", 1, 300, ts=now - 500)  # read late, made before the deletion was read: void
    assert state.group_offsets("U") == {("F", 0): 200}


def test_a_deletion_stamped_in_the_future_does_not_void_the_commits_after_it_in_the_same_batch(
    rclient: redis.Redis,
) -> None:
    """The same deletion and a commit made after it, read in one batch (the reduce orders them before the merge):
    the deletion counts as of its reading there too, so the commit holds."""
    import json

    import pyarrow as pa

    from compactd.streaming.aggregate import collect_changes, keyed
    from compactd.streaming.decode import DECODED_SCHEMA, Decoder, reduce_table

    state = RedisState(rclient)
    decoder = Decoder("segments", "commits")
    now = now_ms()
    events = [
        (1, {"type": "group_delete", "group": "F", "ts": now + DAY}),
        (0, {"type": "offset_commit", "group": "F", "topic": "V", "partition": 0, "offset": 200, "ts": now + 1_000}),
    ]
    rows = [decoder.record_row("commits", p, i, None, json.dumps(ev).encode()) for i, (p, ev) in enumerate(events)]
    changes = collect_changes(keyed(reduce_table(pa.Table.from_pylist(rows, schema=DECODED_SCHEMA)))).changes
    state.merge("s", 0, changes, everyone)
    assert state.group_offsets("V") == {("F", 0): 200}
