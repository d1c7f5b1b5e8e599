"""Blocks decoded in Arrow (the fast path) give, record for record, the rows of the pydantic reference: nothing it
rejects is accepted, DLQ reasons come from it, and valid blocks — every valid event, unknown fields and all — never
fall back to the per-record path (else there is no speed-up)."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from compactd.codec.arrow_events import _SMALL, decode_json_block
from compactd.codec.events import OFFSET_EVENTS, OFFSET_TYPES, SEGMENT_EVENTS, SEGMENT_TYPES
from compactd.streaming.decode import DECODED_SCHEMA, Decoder
from tests.support.event_values import VALID, event, value
from tests.support.examples import examples

D = Decoder("seg", "com", max_event_bytes=20_000)


def reference_rows(topic: str, values: list[bytes | None]) -> list[dict]:
    stream, adapter = ("segments", SEGMENT_EVENTS) if topic == "seg" else ("commits", OFFSET_EVENTS)
    rows = []
    for i, raw in enumerate(values):
        row = {**D.reference_row(stream, adapter, raw), "src_topic": topic, "src_partition": 3, "src_offset": 100 + i}
        if "error" in row:
            row.update(raw_key=b"k", raw_value=raw)
        rows.append({**row, "n": 1})
    return pa.Table.from_pylist(rows, schema=DECODED_SCHEMA).to_pylist()


def decoded_rows(topic: str, values: list[bytes | None]) -> list[dict]:
    n = len(values)
    table = D.table(topic, 3, list(range(100, 100 + n)), [b"k"] * n, values)
    return sorted(table.to_pylist(), key=lambda r: r["src_offset"])


# every valid event, as it is and with an unknown field (ignored, as in the reference)
VALID_VALUES = [json.dumps({"type": k, **f, **extra}).encode() for k, f in VALID.items()
                for extra in ({}, {"unknown": {"x": [1]}})]  # fmt: skip
# mostly valid events (blocks must reach the Arrow parser), with some of every kind of damage
blocks = st.lists(
    st.one_of(value(), event().map(lambda e: json.dumps(e).encode()), st.sampled_from(VALID_VALUES)),
    min_size=0,
    max_size=300,
)


NULL_SIZE = b'{"type": "segment_rolled", "topic": "orders", "partition": 0, "base_offset": 0, "end_offset": 1, "first_batch_max_ts": 0, "size_bytes": null, "ts": 0}'  # noqa: E501


@settings(max_examples=examples(300), deadline=None)
@given(blocks)
@example([b"", b"", b"", b"", b"", b'{"type": "compacted"}', NULL_SIZE])  # null is refused, absent is 0 (soak find)
@example([NULL_SIZE, NULL_SIZE.replace(b'"size_bytes": null, ', b"")] * 40)  # in a block the parser takes
def test_blocks_decode_to_the_reference_rows(values: list[bytes | None]) -> None:
    for topic in ("seg", "com"):
        assert decoded_rows(topic, values) == reference_rows(topic, values)


def test_every_valid_event_is_taken_on_its_own_topic_only() -> None:
    values = VALID_VALUES * (2 * _SMALL // len(VALID_VALUES) + 1)  # one block, large enough for the parser
    kinds = [json.loads(v)["type"] for v in values]
    for types in (SEGMENT_TYPES, OFFSET_TYPES):
        _, positions, rest = decode_json_block(values, types, 20_000)
        assert positions.to_pylist() == [i for i, k in enumerate(kinds) if k in types]
        assert rest == [i for i, k in enumerate(kinds) if k not in types]  # the reference's unknown_type there


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.sampled_from(VALID_VALUES), min_size=512, max_size=1000), st.integers(0, 999))
def test_valid_blocks_stay_in_arrow_and_one_bad_record_stays_alone(values: list[bytes], at: int) -> None:
    for types in (SEGMENT_TYPES, OFFSET_TYPES):
        _, positions, rest = decode_json_block(values, types, 20_000)
        expected_rest = [i for i, v in enumerate(values) if json.loads(v)["type"] not in types]
        assert rest == expected_rest and len(positions) == len(values) - len(rest)
    at %= len(values)
    broken = [*values[:at], b'{"type": "offset_commit", "partition": 1.5}', *values[at + 1 :]]
    _, positions, rest = decode_json_block(broken, OFFSET_TYPES | SEGMENT_TYPES, 20_000)
    # the block was split around it, the rest stayed in Arrow: what goes record by record is inside the first block
    # of at most 2 * _SMALL + 1 around it (129 = 64 + 65: the 65 is split again, both its halves small)
    assert at in rest and len(rest) <= 2 * _SMALL + 1
    assert len(positions) + len(rest) == len(values)
