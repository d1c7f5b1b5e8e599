"""`__consumer_offsets` blocks decoded with numpy give, record for record, the per-record codec's rows (bytes built
to the spec by the codec's encoders, then damaged), and the common shape (key v1, value v1/v3) stays vectorised."""

from __future__ import annotations

import struct
import uuid

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.codec.arrow_offsets import decode_offset_commits
from compactd.codec.offsets import (
    GroupValue,
    OffsetValue,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from compactd.streaming.decode import DECODED_SCHEMA, KAFKA_SCHEMA, Decoder
from tests.support.examples import examples

D = Decoder("seg", "com", offsets_topic="__consumer_offsets")
NAMES = st.sampled_from(["g", "orders", "", "é", "a" * 300]) | st.text(max_size=8)
BIG = st.sampled_from([0, 1, 2**31 - 1, 2**53, 2**53 + 1, -1, 2**63 - 1, -(2**63)]) | st.integers(0, 10**9)


@st.composite
def record(draw: st.DrawFn) -> tuple[bytes | None, bytes | None]:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        key: bytes | None = encode_group_key(draw(NAMES))
        value = draw(st.none() | st.just(encode_group_value(GroupValue(3, "consumer", 1, "range", None, 5))))
    else:
        partition = draw(st.sampled_from([0, 7, 2**31 - 1, -1]) | st.integers(0, 100))
        key = encode_offset_key(draw(NAMES), draw(NAMES), partition, version=draw(st.sampled_from([0, 1, 1, 1])))
        version = draw(st.sampled_from([1, 3, 3, 0, 2, 4]))
        metadata = draw(st.sampled_from(["", "", "x", "é", "m" * 126, "m" * 127]))
        topic_id = draw(st.none() | st.uuids().map(str)) if version == 4 else None
        v = OffsetValue(version, draw(BIG), metadata, draw(BIG), leader_epoch=3 if version >= 3 else -1,
                        topic_id=topic_id)  # fmt: skip
        value = None if kind == 1 else encode_offset_value(v)
        if value is not None and version == 4 and draw(st.integers(0, 5)) == 0:  # a tag of a later Kafka
            if topic_id is None:  # tag count 0 → one tag (1) of two bytes
                value = value[:-1] + b"\x01\x01\x02ab"
            else:  # the topic ID's tag, then an empty tag 1
                value = value[:-19] + b"\x02" + value[-18:] + b"\x01\x00"
    damage = draw(st.integers(0, 11))
    if damage == 0 and key is not None:
        key = key[: draw(st.integers(0, len(key)))]  # truncated
    elif damage == 1 and value is not None:
        value = value[: draw(st.integers(0, len(value)))]
    elif damage == 2:
        key, value = (key or b"") + b"\x00", (value or b"") + b"\x00"  # trailing bytes
    elif damage == 6:
        key = (key or b"") + b"\x00"
    elif damage == 7:  # metadata that is not UTF-8
        metadata = draw(st.sampled_from([b"\xff", b"\xc3", b"ok\x80"]))
        value = struct.pack(">hqih", 3, 5, 0, len(metadata)) + metadata + struct.pack(">q", 9)
    elif damage == 3 and key:
        at = draw(st.integers(0, len(key) - 1))
        key = key[:at] + draw(st.sampled_from([b"\xff", b"\x80", b"\x00"])) + key[at + 1 :]
    elif damage == 4 and value:
        at = draw(st.integers(0, len(value) - 1))
        value = value[:at] + draw(st.sampled_from([b"\xff", b"\x80", b"\x00"])) + value[at + 1 :]
    elif damage == 5:
        key = draw(st.none() | st.binary(max_size=12))
    return key, value


def reference_rows(records: list[tuple[bytes | None, bytes | None]]) -> list[dict]:
    rows = [D.record_row("__consumer_offsets", 2, 50 + i, k, v) for i, (k, v) in enumerate(records)]
    return pa.Table.from_pylist(rows, schema=DECODED_SCHEMA).to_pylist()


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(record(), max_size=200))
def test_blocks_decode_to_the_per_record_rows(records: list[tuple[bytes | None, bytes | None]]) -> None:
    keys, values = [k for k, _ in records], [v for _, v in records]
    table = D.table("__consumer_offsets", 2, list(range(50, 50 + len(records))), keys, values)
    assert sorted(table.to_pylist(), key=lambda r: r["src_offset"]) == reference_rows(records)


def test_the_common_shape_stays_vectorised() -> None:
    keys = [encode_offset_key(f"group-{i % 7}", f"topic-{i % 3}", i % 11) for i in range(1000)]
    ids = [str(uuid.UUID(int=i)) if i % 10 == 4 else None for i in range(1000)]  # v4 with and without topic ID
    values = [encode_offset_value(OffsetValue(i % 5, i, "m" * (i % 3), 1_700_000_000_000 + i, 5, topic_id=ids[i]))
              for i in range(1000)]  # fmt: skip
    cols, positions, rest = decode_offset_commits(keys, values)
    assert rest == [] and positions.to_pylist() == list(range(1000))
    assert cols["topic_id"][14].as_py() == str(uuid.UUID(int=14)) and cols["topic_id"][9].as_py() is None
    assert cols["grp"][8].as_py() == "group-1" and cols["topic"][8].as_py() == "topic-2"
    assert cols["partition"][8].as_py() == 8 and cols["value_offset"][8].as_py() == 8
    assert cols["ts"][9].as_py() == 1_700_000_000_009


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(record(), max_size=200))
def test_spark_rows_decode_to_the_reference_rows(records: list[tuple[bytes | None, bytes | None]]) -> None:
    """The rows as Spark's Kafka connector hands them over (Arrow arrays, read in place) give the reference's rows."""
    batch = pa.RecordBatch.from_pydict(
        {"topic": ["__consumer_offsets"] * len(records), "partition": [2] * len(records),
         "offset": list(range(50, 50 + len(records))), "key": [k for k, _ in records],
         "value": [v for _, v in records]},
        schema=KAFKA_SCHEMA,
    )  # fmt: skip
    fast = [r for b in D(iter([batch])) for r in b.to_pylist()]
    assert sorted(fast, key=lambda r: r["src_offset"]) == reference_rows(records)
