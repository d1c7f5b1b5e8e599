"""The evaluation of one chunk of a topic's partitions, read and planned over arrays: the step every batch takes,
on the driver or in a slice (control/slices.py).

`BatchThresholds` resolves a batch's threshold layers once per topic (partition scopes where they exist) and names the
readers that count; `plan_chunk` reads a chunk's numbers and live records, folds those readers in, and finds the rows
that are quiet (no rule crossed, no live record, the topic not excluded): those are planned in bulk, the rest
(`TopicChunk.full`) one by one by the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
