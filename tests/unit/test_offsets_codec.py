"""`__consumer_offsets` records built byte by byte from the spec; round trips; random bytes never crash."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.codec.offsets import (
    DecodeError,
    GroupKey,
    GroupValue,
    Member,
    OffsetKey,
    OffsetValue,
    OtherKey,
    decode_group_value,
    decode_key,
    decode_offset_value,
    decode_record,
    encode_assignment,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from compactd.streaming.decode import Decoder
from tests.support.examples import examples


def s16(x: str) -> bytes:
    b = x.encode()
    return struct.pack(">h", len(b)) + b


def test_real_v4_value_from_a_kafka_4_1_broker() -> None:
    raw = bytes.fromhex("0004000000000021d4a8ffffffff010000019964f2d83600")
    v = decode_offset_value(raw)
    assert (v.version, v.offset, v.leader_epoch, v.metadata, v.commit_timestamp) == (4, 0x21D4A8, -1, "", 0x19964F2D836)


def test_keys_by_hand() -> None:
    k = decode_key(struct.pack(">h", 1) + s16("billing") + s16("orders") + struct.pack(">i", 7))
    assert k == OffsetKey(1, "billing", "orders", 7)
    assert decode_key(struct.pack(">h", 0) + s16("g") + s16("t") + struct.pack(">i", 0)) == OffsetKey(0, "g", "t", 0)
    assert decode_key(struct.pack(">h", 2) + s16("billing")) == GroupKey(2, "billing")
    for version in (3, 8, 9, 15, 16):  # KIP-848, share-group, regex records: skipped, not failed
        assert decode_key(struct.pack(">h", version) + b"whatever") == OtherKey(version)
    with pytest.raises(DecodeError, match="negative key version"):
        decode_key(struct.pack(">h", -1))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (struct.pack(">hq", 0, 42) + s16("m") + struct.pack(">q", 1000), OffsetValue(0, 42, "m", 1000)),
        (
            struct.pack(">hq", 1, 42) + s16("") + struct.pack(">qq", 1000, 2000),
            OffsetValue(1, 42, "", 1000, expire_timestamp=2000),
        ),
        # v2 (Burrow skipped it): same layout as v0
        (struct.pack(">hq", 2, 43) + s16("x") + struct.pack(">q", 1001), OffsetValue(2, 43, "x", 1001)),
        (struct.pack(">hqi", 3, 44, 5) + s16("meta") + struct.pack(">q", 1002), OffsetValue(3, 44, "meta", 1002, 5)),
    ],
)
def test_offset_values_by_hand(raw: bytes, expected: OffsetValue) -> None:
    assert decode_offset_value(raw) == expected


def test_v4_compact_string_length_is_a_varint_and_topic_id_tag_is_read() -> None:
    metadata = "m" * 200  # length 201 needs two varint bytes: 0xC9 0x01
    topic_id = "0d0a6b2c-7f1e-4b7a-9d7c-3f1c2a5e8b90"
    tag = bytes([0x01, 0x00, 0x10]) + bytes.fromhex(topic_id.replace("-", ""))
    raw = struct.pack(">hqi", 4, 9, 3) + bytes([0xC9, 0x01]) + metadata.encode() + struct.pack(">q", 77) + tag
    v = decode_offset_value(raw)
    assert (v.metadata, v.commit_timestamp, v.topic_id, v.leader_epoch) == (metadata, 77, topic_id, 3)
    assert encode_offset_value(v) == raw


def test_unknown_tags_are_skipped() -> None:
    raw = struct.pack(">hqi", 4, 9, 3) + b"\x01" + struct.pack(">q", 7) + bytes([0x02, 0x05, 0x01, 0xAA, 0x00, 0x00])
    assert decode_offset_value(raw).offset == 9


def test_group_metadata_v2_by_hand_with_assignment() -> None:
    assignment = struct.pack(">hi", 0, 1) + s16("orders") + struct.pack(">iii", 2, 0, 3) + struct.pack(">i", -1)
    raw = (
        struct.pack(">h", 2)
        + s16("consumer")
        + struct.pack(">i", 5)
        + s16("range")
        + s16("m1")
        + struct.pack(">q", 1763800000000)
        + struct.pack(">i", 1)
        + s16("m1")
        + s16("client")
        + s16("/10.0.0.1")
        + struct.pack(">ii", 300000, 45000)
        + struct.pack(">i", 0)
        + struct.pack(">i", len(assignment))
        + assignment
    )
    g = decode_group_value(raw)
    assert (g.protocol_type, g.generation, g.protocol, g.leader, g.current_state_timestamp) == (
        "consumer",
        5,
        "range",
        "m1",
        1763800000000,
    )
    m = g.members[0]
    assert (m.member_id, m.rebalance_timeout, m.session_timeout) == ("m1", 300000, 45000)
    assert m.assigned_partitions() == {"orders": [0, 3]}


members = st.builds(
    Member,
    st.text(max_size=20),
    st.text(max_size=10),
    st.text(max_size=10),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=20),
    st.binary(max_size=40),
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.text(max_size=10),
)


@given(
    st.integers(0, 4),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=300),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.none() | st.uuids(),
)
def test_offset_value_round_trip(version, offset, metadata, ts, epoch, expire, topic_id) -> None:
    v = OffsetValue(
        version,
        offset,
        metadata,
        ts,
        leader_epoch=epoch if version >= 3 else -1,
        expire_timestamp=expire if version == 1 else -1,
        topic_id=str(topic_id) if topic_id and version == 4 else None,
    )
    assert decode_offset_value(encode_offset_value(v)) == v


@given(
    st.integers(0, 4),
    st.text(max_size=20),
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.text(max_size=20),
    st.none() | st.text(max_size=20),
    st.integers(-(2**63), 2**63 - 1),
    st.lists(members, max_size=3),
)
def test_group_value_round_trip(version, ptype, gen, protocol, leader, ts, ms) -> None:
    ms = [
        Member(
            m.member_id,
            m.client_id,
            m.client_host,
            m.session_timeout,
            m.subscription,
            m.assignment,
            m.rebalance_timeout if version >= 1 else -1,
            m.group_instance_id if version >= 3 else None,
        )
        for m in ms
    ]
    g = GroupValue(version, ptype, gen, protocol, leader, ts if version >= 2 else -1, tuple(ms))
    assert decode_group_value(encode_group_value(g)) == g


@given(st.text(max_size=50), st.text(max_size=50), st.integers(0, 2**31 - 1), st.integers(0, 1))
def test_key_round_trip(group, topic, partition, version) -> None:
    assert decode_key(encode_offset_key(group, topic, partition, version)) == OffsetKey(
        version, group, topic, partition
    )
    assert decode_key(encode_group_key(group)) == GroupKey(2, group)


def test_truncated_and_corrupted_inputs_raise_decode_error() -> None:
    good = encode_offset_value(OffsetValue(3, 1, "meta", 2, 3))
    for cut in range(len(good)):
        with pytest.raises(DecodeError):
            decode_offset_value(good[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        decode_offset_value(good + b"\x00")
    with pytest.raises(DecodeError, match="negative offset commit value version"):
        decode_offset_value(struct.pack(">h", -1) + good[2:])
    with pytest.raises(DecodeError, match="null compact string"):  # v5 is read as v4: a v3 body does not fit
        decode_offset_value(struct.pack(">h", 5) + good[2:])
    with pytest.raises(DecodeError, match="UTF-8"):
        decode_key(struct.pack(">h", 2) + struct.pack(">h", 2) + b"\xff\xfe")
    with pytest.raises(DecodeError, match="cannot fit"):
        decode_group_value(
            struct.pack(">h", 0) + s16("c") + struct.pack(">i", 1) + s16("p") + s16("l") + struct.pack(">i", 2**30)
        )


@settings(max_examples=examples(3000))
@given(st.binary(max_size=200), st.none() | st.binary(max_size=200))
def test_fuzz_random_bytes_never_escape_as_anything_but_decode_error(key: bytes, value: bytes | None) -> None:
    with contextlib.suppress(DecodeError):
        decode_record(key, value)
    row = Decoder("s", "c").binary_row(key, value)  # the Spark path never raises
    assert row.get("error") in (None, "undecodable", "invalid_field")


def test_decode_record_and_spark_rows() -> None:
    key = encode_offset_key("billing", "orders", 2)
    value = encode_offset_value(OffsetValue(3, 500, "", 1763800000000, 7))
    assert decode_record(key, value)["offset"] == 500
    assert decode_record(key, None) == {
        "kind": "offset_tombstone",
        "key_version": 1,
        "group": "billing",
        "topic": "orders",
        "partition": 2,
    }
    assert decode_record(encode_group_key("billing"), None)["kind"] == "group_tombstone"
    d = Decoder("s", "c")
    assert d.binary_row(key, value) == {
        "stream": "consumer_offsets",
        "grp": "billing",
        "topic": "orders",
        "partition": 2,
        "kind": "offset_commit",
        "value_offset": 500,
        "ts": 1763800000000,
    }
    assert d.binary_row(key, None)["kind"] == "offset_delete"
    assert d.binary_row(encode_group_key("g"), None) == {
        "stream": "consumer_offsets",
        "kind": "group_metadata",
        "assigned": "{}",
        "grp": "g",
    }
    gv = encode_group_value(GroupValue(3, "consumer", 1, "range", "m", 5, ()))
    assert d.binary_row(encode_group_key("g"), gv)["kind"] == "group_metadata"
    assert d.binary_row(struct.pack(">h", 11) + b"x", b"y")["kind"] == "skipped_key_v11"
    absurd = encode_offset_value(OffsetValue(2, -5, "", 1))
    assert d.binary_row(key, absurd)["error"] == "invalid_field"
    assert d.binary_row(key, b"\x00\x03\x00")["error"] == "undecodable"
    assert encode_assignment({"t": [1]})


def test_group_metadata_row_carries_the_members_assignments() -> None:
    d = Decoder("s", "c")

    def member(mid: str, assignment: dict[str, list[int]]) -> Member:
        return Member(mid, "client", "/10.0.0.1", 30_000, b"", encode_assignment(assignment), 60_000, None)

    members = (member("m1", {"orders": [2, 0], "audit": [1]}), member("m2", {"orders": [1], "empty": []}))
    gv = encode_group_value(GroupValue(3, "consumer", 7, "range", "m1", 5, members))
    row = d.binary_row(encode_group_key("billing"), gv)
    assert (row["kind"], row["grp"], row["assigned"]) == ("group_metadata", "billing", '{"audit":[1],"orders":[0,1,2]}')
    # a Connect group's assignment is not the consumer protocol: it assigns no partitions
    connect = encode_group_value(GroupValue(3, "connect", 7, "sessioned", "m1", 5, members))
    assert d.binary_row(encode_group_key("connect-sink"), connect)["assigned"] == "{}"
    # an Empty group (every member left) assigns nothing either
    empty = encode_group_value(GroupValue(3, "consumer", 8, None, None, 6, ()))
    assert d.binary_row(encode_group_key("billing"), empty)["assigned"] == "{}"
