"""A share of a micro-batch's topics merged and evaluated on its own, where the data is (out of the driver).

The per-partition work of a batch — merging its changes into Redis and planning each touched partition — needs no
global state: each topic's keys share one Redis hash tag, so a share of topics is a share of Redis slots. What must be
global stays with the controller on the driver: the partitions where a rule is crossed, a live record waits or the
topic is excluded are planned there (their decisions and records, the readiness gate, the compacted view's cap, the
outbox and its caps, the send-time re-check), the metrics are kept there, and group-level changes (deletes,
memberships: they reach every topic of a group) are merged there first.

`evaluate_share` is what one share does: merge, then plan the quiet partitions in bulk (`policy/rules.py`): store their
deadlines and return their metrics; return the other partitions for the driver. It takes plain values (state, layers,
changes), so the same code runs in the controller's process or in a Spark task.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compactd.model import ActionRecord, PartitionNumbers, PartitionRef
from compactd.policy.forecast import PartitionStats, stats_rows
from compactd.policy.readers import SHARE_GROUP, Holds, ReaderHold, fold_numbers, holds_on
from compactd.policy.rules import Limits, Quiet, quiet
from compactd.policy.thresholds import (
    Thresholds,
    group_counts,
    partition_scopes,
    resolve,
    topic_excluded,
)
from compactd.state.changes import BatchChanges
from compactd.state.protocols import ControllerState

EVAL_CHUNK = 2000


@dataclass
class TopicChunk:
    """A chunk of one topic's partitions, read and planned over arrays: which rows need the full plan (`full`)."""

    topic: str
    parts: list[int]
    nums: PartitionNumbers
    records: dict[int, list[ActionRecord]]
    limits: Limits
    scoped: dict[int, Thresholds]  # row -> its partition-scoped thresholds
    q: Quiet
    full: np.ndarray  # bool [P]: a rule crossed, a live record, or an excluded topic

    @property
    def calm(self) -> list[int]:
        return np.flatnonzero(~self.full).tolist()

    def calm_stats(self) -> list[tuple[PartitionRef, PartitionStats]]:
        rows = self.calm
        stats = stats_rows(rows, self.nums, self.limits, self.q)
        return [((self.topic, self.parts[row]), st) for row, st in zip(rows, stats, strict=True)]


class BatchThresholds:
    """Threshold resolution for one batch: each topic's thresholds once, partition scopes where they exist."""

    def __init__(
        self, layers: Mapping[str, Mapping[str, Any]], own_topics: frozenset[str], holds: Holds | None = None
    ) -> None:
        """`holds`: the readers that commit no group offsets, per topic (policy/readers.py), as the batch read them."""
        self.layers = layers
        self.own_topics = own_topics
        self.holds: Holds = holds or {}
        self.scopes = partition_scopes(layers)
        self._topics: dict[str, Thresholds] = {}

    def __call__(self, topic: str, partition: int | None = None) -> Thresholds:
        if partition is not None and partition in self.scopes.get(topic, frozenset()):
            return resolve(self.layers, topic, partition)
        if topic not in self._topics:
            self._topics[topic] = resolve(self.layers, topic)
        return self._topics[topic]

    def counts(self, group: str, topic: str) -> bool:
        return group_counts(group, self(topic))

    def excluded(self, topic: str, th: Thresholds) -> str | None:
        return topic_excluded(topic, th, self.own_topics)

    def readers(self, topic: str, th: Thresholds | None = None) -> tuple[ReaderHold, ...]:
        """The readers that count on `topic`: every declared reader, and the share groups `groups.include` /
        `groups.exclude` count, as for any group."""
        th = th or self(topic)
        return tuple(h for h in holds_on(self.holds, topic) if h.kind != SHARE_GROUP or group_counts(h.reader, th))


ChunkRead = tuple[PartitionNumbers, dict[int, list[ActionRecord]]]


def read_chunk(state: ControllerState, topic: str, parts: list[int]) -> ChunkRead:
    """What planning a chunk reads: its numbers and its live records (`read_chunks`, the controller's read)."""
    return state.read_chunks([(topic, parts)])[0]


def plan_chunk(
    state: ControllerState,
    layers: BatchThresholds,
    topic: str,
    parts: list[int],
    now: int,
    read: ChunkRead | None = None,
) -> TopicChunk:
    """Read a chunk (or take what `read_chunk` read for it) and find its quiet rows."""
    nums, records = read_chunk(state, topic, parts) if read is None else read
    th = layers(topic)
    nums = fold_numbers(nums, layers.readers(topic, th))  # readers count like groups, before any rule reads them
    own = layers.scopes.get(topic, frozenset())
    scoped = {row: layers(topic, n) for row, n in enumerate(parts) if n in own}
    limits = Limits.of(
        len(parts),
        (th, layers.excluded(topic, th) is not None),
        {row: (t, layers.excluded(topic, t) is not None) for row, t in scoped.items()},
    )
    q = quiet(nums, limits, now)
    full = ~q.quiet | limits.excluded
    if records:
        full[[row for row, n in enumerate(parts) if n in records]] = True
    return TopicChunk(topic, parts, nums, records, limits, scoped, q, full)


@dataclass
class ShareResult:
    """What a share returns to the driver."""

    touched: int = 0  # partitions its merge touched
    replayed: bool = False  # a topic of the share had this batch already (Spark replayed it)
    full: list[PartitionRef] = field(default_factory=list)  # partitions for the driver's full plan
    stats: list[tuple[PartitionRef, PartitionStats]] = field(default_factory=list)  # the quiet partitions' metrics
    merged: list[str] = field(default_factory=list)  # topics merged, with partitions touched or not (where known)


def evaluate_share(
    state: ControllerState,
    layers: BatchThresholds,
    stream_id: str,
    batch_id: int,
    changes: BatchChanges,
    now: int,
) -> ShareResult:
    """Merge a share's topics (idempotently, per topic and batch) and plan its quiet partitions; their deadlines and
    compaction-due times are stored here, the rest is returned."""
    touched, replayed = state.merge(stream_id, batch_id, changes, layers.counts)
    out = ShareResult(replayed=replayed)
    for topic in sorted(touched):
        parts = sorted(touched[topic])
        out.touched += len(parts)
        for start in range(0, len(parts), EVAL_CHUNK):
            chunk = plan_chunk(state, layers, topic, parts[start : start + EVAL_CHUNK], now)
            calm = chunk.calm
            if calm:
                ix = np.asarray(calm)
                state.schedule(
                    topic,
                    [chunk.parts[row] for row in calm],
                    chunk.q.deadline[ix].tolist(),
                    chunk.q.compaction_due[ix].tolist(),
                )
                out.stats.extend(chunk.calm_stats())
            out.full.extend((topic, chunk.parts[row]) for row in np.flatnonzero(chunk.full).tolist())
    return out


def share_of(topic: str, shares: int) -> int:
    """Which share a topic belongs to: stable across processes and restarts (a replayed batch splits the same)."""
    return zlib.crc32(topic.encode()) % shares


def split(changes: BatchChanges, shares: int) -> list[BatchChanges]:
    """The batch's per-topic changes in `shares` parts (group-level changes stay with the driver)."""
    out = [BatchChanges() for _ in range(shares)]
    for topic, tc in changes.topics.items():
        out[share_of(topic, shares)].topics[topic] = tc
    return out
