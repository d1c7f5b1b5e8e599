"""Kafka's `__consumer_offsets` record format: decode every record a broker writes, encode for fixtures.

Keys: int16 version; v0/v1 OffsetCommitKey (group, topic, partition), v2 GroupMetadataKey (group). Every key version
>= 3 (KIP-848 consumer-group, KIP-932 share-group, 16 = KIP-848 regex subscriptions, whatever newer brokers add)
holds no offset compactd needs: skipped and counted, not sent to the DLQ. A negative version is an error. A null
value is a tombstone. Values: OffsetCommitValue v0-v4 (v4 flexible: compact strings, tagged fields; tag 0 = topic
id) and GroupMetadataValue v0-v4 (v4 flexible), strict: trailing bytes are an error. A value version above 4 is
read with v4's layout and anything after it is ignored, because Kafka's compatibility rules only append fields or
add tagged ones (KIP-915: new fields are tags, the version stays 4) and never move the offset, which stays first; only a
value that cannot hold even v4's fields is an error. All big-endian. Peer tools broke on v2 values, on tombstones
and on the v4 compact-string length (an unsigned varint, not one byte): each has a test here. One module (~460
lines): the reference decoder and the fixture encoder of one binary format, field for field side by side.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from compactd.errors import DecodeError

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class _Reader:
    """Cursor over a record: precompiled structs read in place, every read bounds-checked."""

    __slots__ = ("data", "n", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.n = len(self.data)
        self.pos = 0

    def _need(self, k: int) -> int:
        pos = self.pos
        if k < 0 or pos + k > self.n:
            raise DecodeError(f"truncated: need {k} bytes at offset {pos}, have {self.n - pos}")
        self.pos = pos + k
        return pos

    def take(self, k: int) -> bytes:
        pos = self._need(k)
        return self.data[pos : pos + k]

    def i8(self) -> int:
        pos = self._need(1)
        b = self.data[pos]
        return b - 256 if b > 127 else b

    def i16(self) -> int:
        return _I16.unpack_from(self.data, self._need(2))[0]

    def i32(self) -> int:
        return _I32.unpack_from(self.data, self._need(4))[0]

    def i64(self) -> int:
        return _I64.unpack_from(self.data, self._need(8))[0]

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            b = self.data[self._need(1)]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 35:
                raise DecodeError(f"unsigned varint too long at offset {self.pos}")

    def string(self, nullable: bool = False) -> str | None:
        n = self.i16()
        if n == -1 and nullable:
            return None
        if n < 0:
            raise DecodeError(f"negative string length {n} at offset {self.pos - 2}")
        return self._utf8(self.take(n))

    def compact_string(self, nullable: bool = False) -> str | None:
        n = self.uvarint()
        if n == 0:
            if nullable:
                return None
            raise DecodeError(f"null compact string at offset {self.pos - 1}")
        return self._utf8(self.take(n - 1))

    def bytes_(self) -> bytes | None:
        n = self.i32()
        if n == -1:
            return None
        if n < 0:
            raise DecodeError(f"negative bytes length {n}")
        return self.take(n)

    def compact_bytes(self) -> bytes | None:
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1)

    def array_len(self, compact: bool) -> int:
        n = self.uvarint() - 1 if compact else self.i32()
        if n < 0:
            raise DecodeError(f"null or negative array length at offset {self.pos}")
        if n > self.n - self.pos:  # every element takes at least one byte
            raise DecodeError(f"array of {n} elements cannot fit in {self.n - self.pos} bytes")
        return n

    def tagged_fields(self) -> dict[int, bytes]:
        tags: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            tags[tag] = self.take(self.uvarint())
        return tags

    def end(self, what: str) -> None:
        if self.pos != self.n:
            raise DecodeError(f"{what}: {self.n - self.pos} unexpected trailing bytes")

    @staticmethod
    def _utf8(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"invalid UTF-8 in string: {exc.reason}") from None


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def raw(self, b: bytes) -> _Writer:
        self.parts.append(b)
        return self

    def i16(self, v: int) -> _Writer:
        return self.raw(struct.pack(">h", v))

    def i32(self, v: int) -> _Writer:
        return self.raw(struct.pack(">i", v))

    def i64(self, v: int) -> _Writer:
        return self.raw(struct.pack(">q", v))

    def uvarint(self, v: int) -> _Writer:
        out = bytearray()
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return self.raw(bytes(out))

    def string(self, s: str | None) -> _Writer:
        if s is None:
            return self.i16(-1)
        b = s.encode()
        return self.i16(len(b)).raw(b)

    def compact_string(self, s: str | None) -> _Writer:
        if s is None:
            return self.uvarint(0)
        b = s.encode()
        return self.uvarint(len(b) + 1).raw(b)

    def bytes_(self, b: bytes | None) -> _Writer:
        return self.i32(-1) if b is None else self.i32(len(b)).raw(b)

    def compact_bytes(self, b: bytes | None) -> _Writer:
        return self.uvarint(0) if b is None else self.uvarint(len(b) + 1).raw(b)

    def tagged(self, tags: dict[int, bytes]) -> _Writer:
        self.uvarint(len(tags))
        for tag in sorted(tags):
            self.uvarint(tag).uvarint(len(tags[tag])).raw(tags[tag])
        return self

    def done(self) -> bytes:
        return b"".join(self.parts)


# ---- records ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetKey:
    version: int
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupKey:
    version: int
    group: str


@dataclass(frozen=True)
class OtherKey:
    """Any key version >= 3 (KIP-848, share groups, newer brokers' records): not offsets compactd needs."""

    version: int


@dataclass(frozen=True)
class OffsetValue:
    version: int
    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    expire_timestamp: int = -1
    topic_id: str | None = None


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout: int
    subscription: bytes
    assignment: bytes
    rebalance_timeout: int = -1
    group_instance_id: str | None = None

    def assigned_partitions(self) -> dict[str, list[int]]:
        """ConsumerProtocolAssignment: version, [topic, [partition]], user data. Empty if not that protocol."""
        try:
            r = _Reader(self.assignment)
            r.i16()
            out = {}
            for _ in range(r.array_len(compact=False)):
                topic = r.string()
                out[str(topic)] = [r.i32() for _ in range(r.array_len(compact=False))]
            return out
        except DecodeError:
            return {}


@dataclass(frozen=True)
class GroupValue:
    version: int
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: tuple[Member, ...] = field(default_factory=tuple)


Key = OffsetKey | GroupKey | OtherKey
NEWEST_VALUE_VERSION = 4  # both value schemas; newer versions are read with this one's layout


def decode_key(data: bytes) -> Key:
    """Versions 0-2 in full; any version >= 3 is `OtherKey` (its body unread: brokers keep adding record types)."""
    r = _Reader(data)
    version = r.i16()
    if version in (0, 1):
        key: Key = OffsetKey(version, str(r.string()), str(r.string()), r.i32())
    elif version == 2:
        key = GroupKey(version, str(r.string()))
    elif version >= 3:
        return OtherKey(version)
    else:
        raise DecodeError(f"negative key version {version}")
    r.end(f"key v{version}")
    return key


def decode_offset_value(data: bytes) -> OffsetValue:
    """v0-v4 exactly; above v4, v4's fields and nothing more (the bytes after them may be new fields or tags, so
    the topic id tag is not looked for)."""
    r = _Reader(data)
    v = r.i16()
    if v > NEWEST_VALUE_VERSION:
        offset, epoch = r.i64(), r.i32()
        metadata, ts = str(r.compact_string()), r.i64()
        return OffsetValue(v, offset, metadata, ts, leader_epoch=epoch)
    if v in (0, 2):
        out = OffsetValue(v, r.i64(), str(r.string()), r.i64())
    elif v == 1:
        out = OffsetValue(v, r.i64(), str(r.string()), r.i64(), expire_timestamp=r.i64())
    elif v == 3:
        offset, epoch = r.i64(), r.i32()
        out = OffsetValue(v, offset, str(r.string()), r.i64(), leader_epoch=epoch)
    elif v == 4:
        offset, epoch = r.i64(), r.i32()
        metadata, ts = str(r.compact_string()), r.i64()
        tags = r.tagged_fields()
        topic_id = str(uuid.UUID(bytes=tags[0])) if len(tags.get(0, b"")) == 16 else None
        out = OffsetValue(v, offset, metadata, ts, leader_epoch=epoch, topic_id=topic_id)
    else:
        raise DecodeError(f"negative offset commit value version {v}")
    r.end(f"offset value v{v}")
    return out


def decode_group_value(data: bytes) -> GroupValue:
    """v0-v4 exactly; above v4, v4's fields up to the members and nothing after them (new fields or tags)."""
    r = _Reader(data)
    v = r.i16()
    if v < 0:
        raise DecodeError(f"negative group metadata value version {v}")
    flex, newer = v >= 4, v > NEWEST_VALUE_VERSION

    def s(nullable: bool = False) -> str | None:
        return r.compact_string(nullable) if flex else r.string(nullable)

    def b() -> bytes:
        return (r.compact_bytes() if flex else r.bytes_()) or b""

    protocol_type, generation = str(s()), r.i32()
    protocol, leader = s(nullable=True), s(nullable=True)
    state_ts = r.i64() if v >= 2 else -1
    members = []
    for _ in range(r.array_len(compact=flex)):
        member_id = str(s())
        instance = s(nullable=True) if v >= 3 else None
        client_id, client_host = str(s()), str(s())
        rebalance = r.i32() if v >= 1 else -1
        session = r.i32()
        subscription, assignment = b(), b()
        if flex:
            r.tagged_fields()
        members.append(
            Member(member_id, client_id, client_host, session, subscription, assignment, rebalance, instance)
        )
    if not newer:
        if flex:
            r.tagged_fields()
        r.end(f"group value v{v}")
    return GroupValue(v, protocol_type, generation, protocol, leader, state_ts, tuple(members))


def decode_record(key: bytes | None, value: bytes | None) -> dict[str, Any]:
    """One `__consumer_offsets` record as a JSON-able dict (`compactd offsets decode`)."""
    if key is None:
        raise DecodeError("record has no key")
    k = decode_key(key)
    if isinstance(k, OtherKey):
        return {"kind": "skipped", "key_version": k.version}
    if isinstance(k, OffsetKey):
        base = {"key_version": k.version, "group": k.group, "topic": k.topic, "partition": k.partition}
        if value is None:
            return {"kind": "offset_tombstone", **base}
        val = decode_offset_value(value)
        return {
            "kind": "offset_commit",
            **base,
            "value_version": val.version,
            "offset": val.offset,
            "metadata": val.metadata,
            "commit_timestamp": val.commit_timestamp,
            "leader_epoch": val.leader_epoch,
            "expire_timestamp": val.expire_timestamp,
            "topic_id": val.topic_id,
        }
    if value is None:
        return {"kind": "group_tombstone", "key_version": k.version, "group": k.group}
    g = decode_group_value(value)
    return {
        "kind": "group_metadata",
        "key_version": k.version,
        "group": k.group,
        "value_version": g.version,
        "protocol_type": g.protocol_type,
        "generation": g.generation,
        "protocol": g.protocol,
        "leader": g.leader,
        "current_state_timestamp": g.current_state_timestamp,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout": m.session_timeout,
                "rebalance_timeout": m.rebalance_timeout,
                "assignment": m.assigned_partitions(),
            }
            for m in g.members
        ],
    }


# ---- encoders (fixtures, tools) ------------------------------------------------------------------------


def encode_offset_key(group: str, topic: str, partition: int, version: int = 1) -> bytes:
    return _Writer().i16(version).string(group).string(topic).i32(partition).done()


def encode_group_key(group: str) -> bytes:
    return _Writer().i16(2).string(group).done()


def encode_offset_value(v: OffsetValue) -> bytes:
    w = _Writer().i16(v.version).i64(v.offset)
    if v.version in (0, 1, 2):
        w.string(v.metadata).i64(v.commit_timestamp)
        if v.version == 1:
            w.i64(v.expire_timestamp)
    elif v.version == 3:
        w.i32(v.leader_epoch).string(v.metadata).i64(v.commit_timestamp)
    elif v.version == 4:
        w.i32(v.leader_epoch).compact_string(v.metadata).i64(v.commit_timestamp)
        w.tagged({0: uuid.UUID(v.topic_id).bytes} if v.topic_id else {})
    else:
        raise ValueError(f"cannot encode offset value v{v.version}")
    return w.done()


def encode_assignment(partitions: dict[str, list[int]], version: int = 0) -> bytes:
    w = _Writer().i16(version).i32(len(partitions))
    for topic, parts in partitions.items():
        w.string(topic).i32(len(parts))
        for p in parts:
            w.i32(p)
    return w.bytes_(None).done()


def encode_group_value(g: GroupValue) -> bytes:
    v, flex = g.version, g.version >= 4
    w = _Writer().i16(v)

    def s(x: str | None) -> None:
        w.compact_string(x) if flex else w.string(x)

    def b(x: bytes) -> None:
        w.compact_bytes(x) if flex else w.bytes_(x)

    s(g.protocol_type)
    w.i32(g.generation)
    s(g.protocol)
    s(g.leader)
    if v >= 2:
        w.i64(g.current_state_timestamp)
    w.uvarint(len(g.members) + 1) if flex else w.i32(len(g.members))
    for m in g.members:
        s(m.member_id)
        if v >= 3:
            s(m.group_instance_id)
        s(m.client_id)
        s(m.client_host)
        if v >= 1:
            w.i32(m.rebalance_timeout)
        w.i32(m.session_timeout)
        b(m.subscription)
        b(m.assignment)
        if flex:
            w.tagged({})
    if flex:
        w.tagged({})
    return w.done()
