"""The fast path (streaming/columns.py: compactd's Java decoders and reduction over Spark's internal rows, in
Spark's tasks) gives, record for record, the reference decoder's rows for every record it accepts, and the same
reduced rows as the reference for whole batches, refused records and all; the common shapes stay in the JVM (else the
path is fast for nothing). Bytes built to the spec by the codec's encoders, then damaged; JSON events of every kind
of damage."""

from __future__ import annotations

import json
import struct
import uuid
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactd.codec.offsets import (
    GroupValue,
    OffsetValue,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from compactd.streaming import columns
from compactd.streaming.aggregate import keyed
from compactd.streaming.decode import DECODED_DDL, DECODED_SCHEMA, KAFKA_SCHEMA, Decoder, reduce_table
from tests.support.event_values import ODD, VALID, event, value
from tests.support.examples import examples

pytestmark = pytest.mark.spark

D = Decoder("seg", "com", max_event_bytes=20_000, offsets_topic="__consumer_offsets", config_topic="cfg")
Record = tuple[str, int, int, bytes | None, bytes | None]  # Spark's Kafka row: topic, partition, offset, key, value
FIELDS = ("stream", "kind", "topic", "partition", "grp", "base_offset", "end_offset", "first_batch_max_ts",
          "size_bytes", "value_offset", "ts", "topic_id")  # fmt: skip


def slow(n: int) -> settings:
    return settings(max_examples=examples(n), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


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


def offsets_records(pairs: list[tuple[bytes | None, bytes | None]]) -> list[Record]:
    return [("__consumer_offsets", i % 3, 50 + i, k, v) for i, (k, v) in enumerate(pairs)]


def json_records(values: list[bytes | None]) -> list[Record]:
    return [(topic, i % 2, 100 + i, b"k", v) for topic in ("seg", "com") for i, v in enumerate(values)]


def frame(spark: Any, records: list[Record]) -> Any:
    cols = list(zip(*records, strict=True)) if records else [[] for _ in KAFKA_SCHEMA]
    table = pa.table([pa.array(c, f.type) for c, f in zip(cols, KAFKA_SCHEMA, strict=True)], schema=KAFKA_SCHEMA)
    return spark.createDataFrame(table)


def fast_rows(spark: Any, records: list[Record]) -> dict[tuple[str, int], dict]:
    """(source topic, offset) -> the fast path's row, for the records it accepts."""
    out = columns.FastPath(D).decoded(frame(spark, records)).filter("not slow")
    out = out.select(*FIELDS, "src_topic", "src_offset")
    return {(r["src_topic"], r["src_offset"]): r for r in out.toArrow().to_pylist()}


def reference_rows(records: list[Record]) -> dict[tuple[str, int], dict]:
    rows = pa.Table.from_pylist([D.record_row(*r) for r in records], schema=DECODED_SCHEMA).to_pylist()
    return {(r["src_topic"], r["src_offset"]): r for r in rows}


def assert_same_rows(spark: Any, records: list[Record]) -> None:
    """Every accepted record decodes as the reference decodes it (which accepts it too)."""
    ref = reference_rows(records)
    for at, row in fast_rows(spark, records).items():
        assert ref[at]["error"] is None, (at, row, ref[at])
        assert {f: row[f] for f in FIELDS} == {f: ref[at][f] for f in FIELDS}, at


def reduced_both(spark: Any, records: list[Record]) -> tuple[list[dict], list[dict]]:
    """The batch reduced on the fast path as the job runs it (the reduction in the tasks, the refused records decided
    by the reference on the driver), and by the reference alone; both keyed as the driver keys them. The rows one per
    record (no reduction in the tasks: the driver's alone) and the evaluation slices' path (the refused records
    decided in the tasks) give the same rows. The records are spread over several tasks, each holding several source
    partitions (a key's rows meet on the driver)."""
    path = columns.FastPath(D)
    batch = frame(spark, records).repartition(3)
    fast = keyed(reduce_table(D.complete(path.reduced(batch).toArrow())))
    per_record = keyed(reduce_table(D.complete(path.decoded(batch).toArrow())))
    in_tasks = keyed(reduce_table(path.reduced(batch).mapInArrow(D.completing, DECODED_DDL).toArrow()))
    ref = keyed(reduce_table(pa.Table.from_pylist([D.record_row(*r) for r in records], schema=DECODED_SCHEMA)))

    def rows(t: pa.Table) -> list[dict]:
        return sorted(t.to_pylist(), key=lambda r: (r["k"], r["src_topic"], r["src_partition"], r["src_offset"]))

    assert rows(per_record) == rows(fast)
    assert rows(in_tasks) == rows(fast)
    return rows(fast), rows(ref)


@slow(40)
@given(st.lists(record(), max_size=150))
def test_offsets_records_decode_and_reduce_as_the_reference(spark: Any, pairs: list) -> None:
    records = offsets_records(pairs)
    assert_same_rows(spark, records)
    fast, ref = reduced_both(spark, records)
    assert fast == ref


# mostly valid events, with some of every kind of damage, and valid ones with fields of no event
EXTRA = ({}, {"unknown": {"x": [1, {"y": None}]}}, {"note": "a", "n": 1.5e3, "b": True})
VALID_VALUES = [json.dumps({"type": k, **f, **extra}).encode() for k, f in VALID.items() for extra in EXTRA]
# valid events with a field of no event of any JSON value (a lone surrogate's escape, nulls, nesting, text)
with_extra = st.tuples(st.sampled_from(sorted(VALID.items())), ODD | st.text(max_size=4)).map(
    lambda p: json.dumps({"type": p[0][0], **p[0][1], "extra": p[1]}).encode()
)
values = st.lists(
    st.one_of(value(), event().map(lambda e: json.dumps(e).encode()), st.sampled_from(VALID_VALUES), with_extra),
    max_size=150,
)


@slow(40)
@given(values)
def test_json_events_decode_and_reduce_as_the_reference(spark: Any, raw: list[bytes | None]) -> None:
    records = json_records(raw)
    assert_same_rows(spark, records)
    fast, ref = reduced_both(spark, records)
    assert fast == ref


# what a parser that skips unknown fields and the reference can read differently: a lone surrogate (the reference
# rejects it; Jackson, which the decoder used first, skipped it in a field of no event), nesting past the reference's
# limit, a number past the decoder's 1,000 characters, escapes, a field twice
EDGES = [
    ',"x":"\\ud800"',
    ',"\\ud800":1',
    ',"x":' + "[" * 40 + "]" * 40,
    ',"x":' + "[" * 201 + "]" * 201,
    ',"x":"a\\"b"',
    ',"group":"a\\u0041"',
    ',"x":' + "1" * 2000,
    ',"group":"h"',
    ',"t\\u0073":2',
    "",
]


def test_what_jackson_and_the_reference_read_differently_is_refused(spark: Any) -> None:
    base = '{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":1,"ts":1%s}'
    records: list[Record] = [("com", 0, i, None, (base % edge).encode()) for i, edge in enumerate(EDGES)]
    assert_same_rows(spark, records)
    fast, ref = reduced_both(spark, records)
    assert fast == ref
    assert set(fast_rows(spark, records)) == {("com", EDGES.index(""))}  # only the plain event stays in the JVM


# the JSON scanner's corners (JsonDecode): each either decodes as the reference decodes it or is refused; the valid
# ones (`True`) stay in the JVM
SCANNER = [
    (
        ' \t\r\n{"type":"offset_commit" ,"group" :"g","topic":"t","partition":-0,"offset":9007199254740992,"ts":0}\n',
        True,
    ),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":9007199254740993,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":1234567890123456789,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":-1,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":1.0,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":1e2,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":01,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":"1","ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":null,"ts":1}', False),
    ('{"type":"offset_commit ","group":"g","topic":"t","partition":1,"offset":1,"ts":1}', False),
    ('{"type":"offset_commit","group":"g\x7f","topic":"t","partition":1,"offset":1,"ts":1}', False),
    ('{"type":"offset_commit","group":"","topic":"t","partition":1,"offset":1,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t/u","partition":1,"offset":1,"ts":1}', False),
    ('{"type":"offset_commit","group":"g","topic":"t","partition":2147483648,"offset":1,"ts":1}', False),
]
_BASE = '{"type":"offset_commit","group":"g","topic":"t","partition":1,"offset":1,"ts":1%s}'
SCANNER += [(_BASE % extra, ok) for extra, ok in [
    (',"x":1e400', True), (',"x":-0.0E-0', True), (',"x":1.5e+3', True), (',"x":' + "9" * 1000, True),
    (',"x":"\x7f ~"', True), (',"x":[]', True), (',"x":{}', True), (',"x":[{},[],""]', True),
    (',"x":{"a":1,"a":2}', True), (',"":true', True), (',"x":null,"y":false', True),
    (',"x":' + "[" * 32 + "]" * 32, True), (',"x":' + "[" * 33 + "]" * 33, False),
    (',"x":"\x1f"', False), (',"x":tru', False), (',"x":truex', False), (',"x":nul', False), (',"x":[1,]', False),
    (',"x":{"a":1,}', False), (',"x":[,1]', False), (',"x":{"a" 1}', False), (',"x":{1:2}', False),
    (',"x":-', False), (',"x":1.', False), (',"x":.5', False), (',"x":1e', False), (',"x":1e+', False),
    (',"x":-01', False), (',"x":[}', False), (',"x":{]', False), (',"x":"open', False), (',"x":[1', False),
    (',', False), ('}{', False), ('} x', False), ('\x0c', False), (',"x":1 2', False),
]]  # fmt: skip


def test_the_json_scanner_reads_as_the_reference_or_refuses(spark: Any) -> None:
    records: list[Record] = [("com", 0, i, None, text.encode()) for i, (text, _) in enumerate(SCANNER)]
    assert_same_rows(spark, records)
    fast, ref = reduced_both(spark, records)
    assert fast == ref
    assert sorted(at[1] for at in fast_rows(spark, records)) == [i for i, (_, ok) in enumerate(SCANNER) if ok]


def test_the_common_shapes_stay_in_the_jvm(spark: Any) -> None:
    ids = [str(uuid.UUID(int=i)) if i % 10 == 4 else None for i in range(1000)]  # v4 with and without topic ID
    pairs = [(encode_offset_key(f"group-{i % 7}", f"topic-{i % 3}", i % 11, version=i % 2),
              encode_offset_value(OffsetValue(i % 5, i, "m" * (i % 3), 1_700_000_000_000 + i, 5, topic_id=ids[i])))
             for i in range(1000)]  # fmt: skip
    pairs += [(encode_offset_key("g", "t", 1), None), (struct.pack(">h", 16) + b"a body", b"x")]  # delete, skipped
    fast = fast_rows(spark, offsets_records(pairs))
    assert len(fast) == len(pairs)
    assert fast[("__consumer_offsets", 64)]["topic_id"] == str(uuid.UUID(int=14))
    assert fast[("__consumer_offsets", 1050)]["kind"] == "offset_delete"
    assert fast[("__consumer_offsets", 1051)]["kind"] == "skipped_key_v16"
    valid = fast_rows(spark, json_records(VALID_VALUES))
    kinds = [json.loads(v)["type"] for v in VALID_VALUES]
    # each on its own topic only: on the other one it is the reference's unknown_type
    assert sorted(at[1] - 100 for at in valid if at[0] == "seg") == [
        i for i, k in enumerate(kinds) if k in ("segment_rolled", "compacted", "log_start")
    ]
    assert sorted(at[1] - 100 for at in valid if at[0] == "com") == [
        i for i, k in enumerate(kinds) if k in ("offset_commit", "offset_delete", "group_delete")
    ]


def test_events_a_reset_superseded_are_dropped_on_the_fast_path(spark: Any) -> None:
    def seg(topic: str, base: int) -> bytes:
        return json.dumps({**VALID["segment_rolled"], "type": "segment_rolled", "topic": topic,
                           "base_offset": base, "end_offset": base + 9}).encode()  # fmt: skip

    d = Decoder("seg", "com", superseded={"orders": {"seg": {"0": 2}}})
    records: list[Record] = [("seg", 0, i, None, v) for i, v in enumerate(
        [seg("orders", 0), seg("clicks", 0), seg("orders", 100), seg("orders", 0), b"{bad"])]  # fmt: skip
    records.append(("seg", 1, 0, None, seg("orders", 200)))  # another source partition: kept
    out = keyed(reduce_table(d.complete(columns.FastPath(d).reduced(frame(spark, records)).toArrow())))
    kept = sorted((r["topic"], r["src_partition"], r["src_offset"]) for r in out.to_pylist() if r["error"] is None)
    assert kept == [("clicks", 0, 1), ("orders", 0, 2), ("orders", 0, 3), ("orders", 1, 0)]
