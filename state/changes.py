"""What one micro-batch changes, after Spark reduced it to one entry per distinct key."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from compactd.model import ReplicaReport, Segment


@dataclass
class TopicChanges:
    segments: list[tuple[int, Segment]] = field(default_factory=list)
    # (partition, base offset) -> the leader epoch of the segment's last record, where its event gave one: a delete
    # whose last record was written in a later epoch is skipped (the log was written again under the report)
    segment_epochs: dict[tuple[int, int], int] = field(default_factory=dict)
    # (partition, cleaned_up_to, ts): ts is when the clean was seen (the event's `ts`; a pair: unknown)
    compacted: list[tuple[int, int, int] | tuple[int, int]] = field(default_factory=list)
    log_start: list[tuple[int, int]] = field(default_factory=list)
    # every replica's cleaner checkpoint the agents reported (erasure across replicas; never the partition's own)
    replicas: list[ReplicaReport] = field(default_factory=list)
    # (group, partition, committed offset or None for an offset tombstone)
    offsets: list[tuple[str, int, int | None]] = field(default_factory=list)
    group_deletes: list[str] = field(default_factory=list)
    # group -> its latest offset commit time on this topic (epoch ms): `compactd explain` says since when a group
    # holds data back. Per (group, topic), not per partition, to keep state small.
    commit_ts: dict[str, int] = field(default_factory=dict)
    # (group, partition) -> the topic ID a commit of `offsets` names (OffsetCommitValue v4): the merge voids a commit
    # made on another incarnation of the topic (policy.identity.other_incarnation)
    offset_ids: dict[tuple[str, int], str] = field(default_factory=dict)
    # (group, partition) -> the event time of a commit of `offsets` from the JSON commits topic: a commit older than
    # its group's deletion (`BatchChanges.group_delete_ts`, or one remembered from an earlier batch) never counts
    offset_ts: dict[tuple[str, int], int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.segments or self.compacted or self.replicas or self.log_start or self.offsets or self.group_deletes
        )


@dataclass
class BatchChanges:
    topics: dict[str, TopicChanges] = field(default_factory=lambda: defaultdict(TopicChanges))
    # groups deleted in this batch, applied to every topic the group has offsets on
    group_deletes: list[str] = field(default_factory=list)
    # group -> its deletion's event time, for deletions from the JSON commits topic: a group's deletion and its
    # commits sit in different partitions of that topic, so their times, not the log, say which came first
    group_delete_ts: dict[str, int] = field(default_factory=dict)
    # each group's latest membership in this batch: {group: {topic: [partition, ...]}} ({} = no members)
    assignments: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def topic(self, name: str) -> TopicChanges:
        return self.topics[name]
