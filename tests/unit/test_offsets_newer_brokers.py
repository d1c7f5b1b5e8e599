"""`__consumer_offsets` as newer brokers write it, built byte by byte from Kafka's record schemas.

Key types compactd does not use (16 = KIP-848 regex subscriptions, anything later) are skipped, not DLQ'd; value
versions above 4 are read with v4's layout, because Kafka only appends or tags new fields.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from compactd.codec.offsets import (
    DecodeError,
    GroupValue,
    OffsetValue,
    OtherKey,
    decode_group_value,
    decode_key,
    decode_offset_value,
    decode_record,
    encode_group_value,
)
from compactd.labels import UNDECODABLE
from compactd.streaming.decode import Decoder
from tests.unit.test_offsets_codec import s16

OFFSET_KEY = struct.pack(">h", 1) + s16("billing") + s16("orders") + struct.pack(">i", 3)
GROUP_KEY = struct.pack(">h", 2) + s16("billing")
TOPIC_ID = "0d0a6b2c-7f1e-4b7a-9d7c-3f1c2a5e8b90"


def cs(x: str) -> bytes:
    """Compact string, length + 1 as an unsigned varint (one byte: the strings here are short)."""
    b = x.encode()
    assert len(b) < 127
    return bytes([len(b) + 1]) + b


def cb(x: bytes) -> bytes:
    """Compact bytes, same length rule as `cs`."""
    assert len(x) < 127
    return bytes([len(x) + 1]) + x


def tags(fields: dict[int, bytes]) -> bytes:
    """Tagged fields: count, then (tag, size, bytes) per field; all small enough for one-byte varints."""
    return bytes([len(fields)]) + b"".join(bytes([t, len(v)]) + v for t, v in sorted(fields.items()))


def regex_key(group: str, regex: str) -> bytes:
    """ConsumerGroupRegularExpressionKey (Kafka 4.0+): version 16, non-flexible `GroupId string,
    RegularExpression string`."""
    return struct.pack(">h", 16) + s16(group) + s16(regex)


def regex_value(topics: list[str], version: int, timestamp: int) -> bytes:
    """ConsumerGroupRegularExpressionValue v0, flexible: Topics (compact array of compact strings), Version int64,
    Timestamp int64, tagged fields."""
    return (
        struct.pack(">h", 0)
        + bytes([len(topics) + 1])
        + b"".join(cs(t) for t in topics)
        + struct.pack(">qq", version, timestamp)
        + tags({})
    )


def offset_value_v4_fields(version: int, offset: int, epoch: int, metadata: str, ts: int) -> bytes:
    """OffsetCommitValue's v4 fields, no tags: version, offset, leaderEpoch, compact metadata, commitTimestamp."""
    return struct.pack(">hqi", version, offset, epoch) + cs(metadata) + struct.pack(">q", ts)


def group_value_v4_body(version: int) -> bytes:
    """GroupMetadataValue with v4's flexible layout: one consumer member assigned orders 0 and 2."""
    assignment = struct.pack(">hi", 0, 1) + s16("orders") + struct.pack(">iii", 2, 0, 2) + struct.pack(">i", -1)
    member = (
        cs("m1")
        + b"\x00"  # groupInstanceId: null compact string
        + cs("client")
        + cs("/10.0.0.1")
        + struct.pack(">ii", 300_000, 45_000)
        + cb(b"")
        + cb(assignment)
        + tags({})
    )
    return (
        struct.pack(">h", version)
        + cs("consumer")
        + struct.pack(">i", 9)
        + cs("range")
        + cs("m1")
        + struct.pack(">q", 1_763_800_000_000)
        + bytes([2])  # one member
        + member
        + tags({})
    )


# ---- keys -------------------------------------------------------------------------------------------


def test_regex_subscription_record_is_skipped_on_every_path() -> None:
    key = regex_key("billing", "orders-.*")
    value = regex_value(["orders-eu", "orders-us"], 3, 1_763_800_000_000)
    assert decode_key(key) == OtherKey(16)
    d = Decoder("s", "c")
    assert d.binary_row(key, value) == {"stream": "consumer_offsets", "kind": "skipped_key_v16"}
    assert d.binary_row(key, None) == {"stream": "consumer_offsets", "kind": "skipped_key_v16"}
    assert decode_record(key, value) == {"kind": "skipped", "key_version": 16}
    # the fast path (compactd's Java decoder) skips it too: tests/integration/test_columns.py


@pytest.mark.parametrize("version", [3, 15, 16, 17, 100, 2**15 - 1])
def test_key_versions_from_newer_brokers_are_skipped(version: int) -> None:
    for key in (struct.pack(">h", version), struct.pack(">h", version) + b"a body we cannot know"):
        assert decode_key(key) == OtherKey(version)
        assert "error" not in Decoder("s", "c").binary_row(key, b"\x00\x00")
        assert decode_record(key, None)["kind"] == "skipped"


@pytest.mark.parametrize(
    "key",
    [struct.pack(">h", -1), struct.pack(">h", -(2**15)) + b"x", b"", b"\x00"],
    ids=["v-1", "v-32768", "empty", "one-byte"],
)
def test_negative_or_short_keys_go_to_the_dlq(key: bytes) -> None:
    with pytest.raises(DecodeError, match=r"negative key version|truncated"):
        decode_key(key)
    assert Decoder("s", "c").binary_row(key, None)["error"] == UNDECODABLE


# ---- values -----------------------------------------------------------------------------------------


def test_offset_value_v5_with_an_appended_field_and_a_new_tag() -> None:
    appended = struct.pack(">q", 2**40)  # a hypothetical v5 int64 field after commitTimestamp
    raw = (
        offset_value_v4_fields(5, 123_456_789, 7, "meta", 1_763_800_000_000)
        + appended
        + tags({0: uuid.UUID(TOPIC_ID).bytes, 1: b"\x2a\x2b"})
    )
    v = decode_offset_value(raw)
    # the topic id tag is not looked for past unknown fields
    assert v == OffsetValue(5, 123_456_789, "meta", 1_763_800_000_000, leader_epoch=7)
    row = Decoder("s", "c").binary_row(OFFSET_KEY, raw)
    assert (row["kind"], row["value_offset"], row["ts"], row.get("error")) == (
        "offset_commit",
        123_456_789,
        1_763_800_000_000,
        None,
    )
    assert decode_record(OFFSET_KEY, raw)["value_version"] == 5


def test_offset_value_v5_laid_out_exactly_as_v4() -> None:
    raw = offset_value_v4_fields(5, 9, -1, "", 77) + tags({1: b"\x01"})
    assert decode_offset_value(raw) == OffsetValue(5, 9, "", 77, leader_epoch=-1)


def test_truncated_v5_offset_value_goes_to_the_dlq() -> None:
    inside_offset = struct.pack(">h", 5) + struct.pack(">q", 42)[:4]
    with pytest.raises(DecodeError, match="truncated"):
        decode_offset_value(inside_offset)
    row = Decoder("s", "c").binary_row(OFFSET_KEY, inside_offset)
    assert (row["error"], row.get("kind")) == (UNDECODABLE, None)
    whole = offset_value_v4_fields(5, 42, 1, "meta", 1000)
    for cut in range(len(whole)):  # every cut short of v4's fields
        with pytest.raises(DecodeError):
            decode_offset_value(whole[:cut])


def test_negative_value_versions_are_errors() -> None:
    with pytest.raises(DecodeError, match="negative offset commit value version"):
        decode_offset_value(offset_value_v4_fields(-1, 1, 1, "", 1) + tags({}))
    with pytest.raises(DecodeError, match="negative group metadata value version"):
        decode_group_value(struct.pack(">h", -1) + group_value_v4_body(4)[2:])


def test_group_value_v5_is_read_as_v4_with_trailing_bytes() -> None:
    raw = group_value_v4_body(5) + struct.pack(">q", 5) + tags({3: b"\xff"})
    g = decode_group_value(raw)
    assert (g.version, g.protocol_type, g.generation, g.protocol, g.leader, g.current_state_timestamp) == (
        5,
        "consumer",
        9,
        "range",
        "m1",
        1_763_800_000_000,
    )
    (m,) = g.members
    assert (m.member_id, m.group_instance_id, m.client_host, m.rebalance_timeout, m.session_timeout) == (
        "m1",
        None,
        "/10.0.0.1",
        300_000,
        45_000,
    )
    row = Decoder("s", "c").binary_row(GROUP_KEY, raw)
    assert (row["kind"], row["assigned"]) == ("group_metadata", '{"orders":[0,2]}')
    assert decode_group_value(group_value_v4_body(5)).members == g.members  # no trailing bytes at all
    body = group_value_v4_body(5)
    for cut in range(len(body) - 1):  # short of the members (the final tag count is not read above v4)
        with pytest.raises(DecodeError):
            decode_group_value(body[:cut])


# ---- v0-v4 stay strict ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack(">hq", 0, 42) + s16("m") + struct.pack(">q", 1000),
        struct.pack(">hq", 1, 42) + s16("") + struct.pack(">qq", 1000, 2000),
        struct.pack(">hq", 2, 43) + s16("x") + struct.pack(">q", 1001),
        struct.pack(">hqi", 3, 44, 5) + s16("meta") + struct.pack(">q", 1002),
        offset_value_v4_fields(4, 45, 6, "meta", 1003) + tags({0: uuid.UUID(TOPIC_ID).bytes}),
    ],
    ids=["v0", "v1", "v2", "v3", "v4"],
)
def test_known_offset_value_versions_still_refuse_trailing_bytes(raw: bytes) -> None:
    assert decode_offset_value(raw).offset in (42, 43, 44, 45)
    with pytest.raises(DecodeError, match="trailing"):
        decode_offset_value(raw + b"\x00")
    assert Decoder("s", "c").binary_row(OFFSET_KEY, raw + b"\x00")["error"] == UNDECODABLE


def test_known_group_value_versions_still_refuse_trailing_bytes() -> None:
    assert decode_group_value(group_value_v4_body(4)).generation == 9
    with pytest.raises(DecodeError, match="trailing"):
        decode_group_value(group_value_v4_body(4) + b"\x00")
    for version in range(4):
        raw = encode_group_value(GroupValue(version, "consumer", 1, "range", "m", 5 if version >= 2 else -1, ()))
        with pytest.raises(DecodeError, match="trailing"):
            decode_group_value(raw + b"\x00")


def test_known_key_versions_still_refuse_trailing_bytes() -> None:
    with pytest.raises(DecodeError, match="trailing"):
        decode_key(OFFSET_KEY + b"\x00")
    with pytest.raises(DecodeError, match="trailing"):
        decode_key(GROUP_KEY + b"\x00")
