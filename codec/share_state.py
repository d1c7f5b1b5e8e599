"""Kafka's `__share_group_state` record format (KIP-932): where share groups keep their progress.

A share group commits no offsets to `__consumer_offsets`. The share coordinator keeps, per (group, topic ID,
partition), the share-partition start offset (SPSO: every record below it is acknowledged or archived) and the state
of the records in flight above it. Keys: int16 type, then GroupId (string), TopicId (16 bytes), Partition (int32);
type 0 is ShareSnapshotKey, type 1 ShareUpdateKey. Values, both flexible (compact arrays, tagged fields):
- ShareSnapshotValue v0: SnapshotEpoch, StateEpoch, LeaderEpoch (int32), StartOffset (int64; -1 while the
  share-partition is not initialized), CreateTimestamp, WriteTimestamp (int64), StateBatches;
- ShareUpdateValue v0: SnapshotEpoch, LeaderEpoch (int32), StartOffset (int64; -1: unchanged), StateBatches.
A StateBatch is FirstOffset, LastOffset (int64), DeliveryState (int8: 0 available, 2 acknowledged, 4 archived),
DeliveryCount (int16), tagged fields. A null value is a tombstone: the group's state on that partition is gone.
Layouts read from Kafka 4.4's share-coordinator schemas and checked against the bytes a live 4.4 broker wrote
(tests/e2e/test_share_groups.py). Anything after the fields this module reads (newer tagged fields) is ignored, as
Kafka's compatibility rules allow; a value too short for them, or an unknown key type, is an error.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from compactd.codec.offsets import _Reader
from compactd.errors import DecodeError

SNAPSHOT, UPDATE = 0, 1
DONE_STATES = frozenset({2, 4})  # acknowledged, archived: a record in either is never delivered again


@dataclass(frozen=True)
class ShareKey:
    kind: int  # SNAPSHOT or UPDATE
    group: str
    topic_id: uuid.UUID
    partition: int


@dataclass(frozen=True)
class ShareValue:
    start_offset: int  # -1: not initialized (a snapshot) or unchanged (an update)
    done: tuple[tuple[int, int], ...]  # [first, last] offset ranges acknowledged or archived, in record order
    state_epoch: int | None = None  # a snapshot's; a new epoch is a reset (alter offsets, re-initialization)


def decode_key(data: bytes) -> ShareKey:
    r = _Reader(data)
    kind = r.i16()
    if kind not in (SNAPSHOT, UPDATE):
        raise DecodeError(f"unknown __share_group_state key type {kind}")
    group = r.string()
    assert group is not None
    topic_id = uuid.UUID(bytes=r.take(16))
    partition = r.i32()
    r.end("share state key")
    return ShareKey(kind, group, topic_id, partition)


def decode_value(kind: int, data: bytes) -> ShareValue:
    r = _Reader(data)
    version = r.i16()
    if version < 0:
        raise DecodeError(f"negative share state value version {version}")
    r.i32()  # snapshot epoch
    state_epoch = r.i32() if kind == SNAPSHOT else None
    r.i32()  # leader epoch
    start = r.i64()
    if kind == SNAPSHOT:
        r.i64(), r.i64()  # create and write timestamps
    done = []
    for _ in range(r.array_len(compact=True)):
        first, last, state = r.i64(), r.i64(), r.i8()
        r.i16()  # delivery count
        r.tagged_fields()
        if state in DONE_STATES and last >= first:
            done.append((first, last))
    return ShareValue(start, tuple(done), state_epoch)


def advance(start: int, done: list[tuple[int, int]]) -> int:
    """The offset below which every record is done: the start offset carried over the acknowledged or archived
    ranges that follow it without a gap. The share coordinator moves its start offset lazily; the ranges it has
    written already say the records are done, and done is final."""
    pos = start
    for first, last in sorted(done):
        if first > pos:
            break
        pos = max(pos, last + 1)
    return pos
