"""The records a streams group (KIP-1071) keeps in `__consumer_offsets`, as far as holding its topics needs them.

A Kafka Streams application in a streams group commits ordinary offsets, but until its first commit (30 s by
default, and a backfill from `earliest` may take much longer) only its group's own records say it reads a topic.
compactd reads two of them (kafka/groups.py): whether the group has members, and which topics its topology reads.
Keys (not flexible): int16 record type, GroupId (string); type 19 StreamsGroupMemberMetadataKey adds MemberId
(string), type 23 StreamsGroupTopologyKey has the group only. Other types are not read here. A null value is a
tombstone (the member left, the group was deleted).
StreamsGroupTopologyValue v0 (flexible): Epoch (int32), Subtopologies: SubtopologyId, SourceTopics ([]string),
SourceTopicRegex ([]string), StateChangelogTopics ([]TopicInfo), RepartitionSinkTopics ([]string),
RepartitionSourceTopics ([]TopicInfo), CopartitionGroups ([][]int16 x3); TopicInfo: Name, Partitions (int32),
ReplicationFactor (int16), TopicConfigs ([]{key, value}). Layouts from Kafka 4.4's group-coordinator schemas, checked
against what a live 4.4 broker wrote (tests/integration/test_streams_groups.py); later tagged fields are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compactd.codec.offsets import _Reader
from compactd.errors import DecodeError

MEMBER, TOPOLOGY = 19, 23  # record types of StreamsGroupMemberMetadataKey, StreamsGroupTopologyKey


@dataclass(frozen=True)
class StreamsKey:
    kind: int  # MEMBER or TOPOLOGY
    group: str
    member: str = ""


@dataclass(frozen=True)
class Topology:
    """What a streams group's topology reads: source topics (with its repartition topics), and source regexes."""

    topics: frozenset[str]
    patterns: tuple[str, ...] = ()

    def __contains__(self, topic: object) -> bool:
        """Whether it reads `topic`; a regex Python cannot compile (Java's dialect) may match anything."""
        if topic in self.topics:
            return True
        for pattern in self.patterns:
            try:
                if re.fullmatch(pattern, str(topic)):
                    return True
            except re.error:
                return True
        return False


def decode_key(data: bytes) -> StreamsKey | None:
    """The key of a streams group's member or topology record; None for any other `__consumer_offsets` record."""
    r = _Reader(data)
    kind = r.i16()
    if kind not in (MEMBER, TOPOLOGY):
        return None
    group = r.string()
    assert group is not None
    member = r.string() if kind == MEMBER else ""
    r.end("streams group key")
    return StreamsKey(kind, group, member or "")


def decode_topology(data: bytes) -> Topology:
    r = _Reader(data)
    if r.i16() < 0:
        raise DecodeError("negative streams group topology version")
    r.i32()  # epoch
    topics: set[str] = set()
    patterns: list[str] = []
    for _ in range(r.array_len(compact=True)):
        r.compact_string()  # subtopology id
        topics.update(_strings(r))
        patterns.extend(_strings(r))
        _topic_infos(r)  # state changelog topics: written, not read
        _strings(r)  # repartition sink topics: written
        topics.update(_topic_infos(r))  # repartition source topics: read
        for _ in range(r.array_len(compact=True)):  # copartition groups
            for _ in range(3):
                for _ in range(r.array_len(compact=True)):
                    r.i16()
            r.tagged_fields()
        r.tagged_fields()
    return Topology(frozenset(topics), tuple(patterns))


def _strings(r: _Reader) -> list[str]:
    return [s for _ in range(r.array_len(compact=True)) if (s := r.compact_string()) is not None]


def _topic_infos(r: _Reader) -> list[str]:
    names = []
    for _ in range(r.array_len(compact=True)):
        names.append(r.compact_string() or "")
        r.i32(), r.i16()  # partitions, replication factor
        for _ in range(r.array_len(compact=True)):  # topic configs
            r.compact_string(), r.compact_string()
            r.tagged_fields()
        r.tagged_fields()
    return names
