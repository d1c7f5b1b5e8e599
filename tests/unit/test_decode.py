"""Input validation without Spark: every way an event can be wrong has its own DLQ reason."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from compactd.streaming.decode import DECODED_SCHEMA, Decoder

D = Decoder("seg", "com", max_event_bytes=200)
GOOD_SEG = {
    "type": "segment_rolled",
    "topic": "orders",
    "partition": 0,
    "base_offset": 0,
    "end_offset": 10,
    "first_batch_max_ts": 5,
    "size_bytes": 1,
    "ts": 6,
}


# (source topic, value, reason): also fed to the metrics test, which checks each reason is exported from start-up
REJECTIONS: list[tuple[str, bytes | None, str]] = [
    ("seg", b"{not json", "malformed_json"),
    ("seg", None, "null_value"),
    ("seg", b"x" * 201, "oversized"),
    ("seg", json.dumps({**GOOD_SEG, "type": "segment_exploded"}).encode(), "unknown_type"),
    ("seg", json.dumps({"topic": "orders"}).encode(), "unknown_type"),
    ("seg", json.dumps({**GOOD_SEG, "end_offset": 0}).encode(), "invalid_field"),
    ("seg", json.dumps({**GOOD_SEG, "base_offset": -1}).encode(), "invalid_field"),
    ("seg", json.dumps({**GOOD_SEG, "end_offset": 2**63}).encode(), "invalid_field"),
    ("seg", json.dumps({**GOOD_SEG, "partition": "0"}).encode(), "invalid_field"),
    ("seg", json.dumps({**GOOD_SEG, "topic": "bad topic!"}).encode(), "invalid_field"),
    ("seg", b"[1,2]", "invalid_field"),
    (
        "com",
        json.dumps({"type": "offset_commit", "group": "g", "topic": "t", "partition": 0, "ts": 1}).encode(),
        "invalid_field",
    ),
    ("com", json.dumps(GOOD_SEG).encode(), "unknown_type"),  # a segment event on the commits topic
    ("elsewhere", b"{}", "unknown_topic"),
]


@pytest.mark.parametrize(("topic", "value", "reason"), REJECTIONS)
def test_rejections_have_reasons(topic: str, value: bytes | None, reason: str) -> None:
    row = D.row(topic, value)
    assert row["error"] == reason and row["message"]


def test_unknown_fields_are_ignored_and_values_mapped() -> None:
    row = D.row("seg", json.dumps({**GOOD_SEG, "future_field": {"x": 1}}).encode())
    assert "error" not in row
    assert (row["kind"], row["topic"], row["end_offset"], row["first_batch_max_ts"]) == (
        "segment_rolled",
        "orders",
        10,
        5,
    )
    c = D.row("com", b'{"type":"offset_commit","group":"g","topic":"t","partition":2,"offset":7,"ts":1}')
    assert (c["kind"], c["grp"], c["partition"], c["value_offset"]) == ("offset_commit", "g", 2, 7)


def test_refused_records_are_decided_by_the_reference_with_their_bytes_kept_only_for_rejects() -> None:
    """What the fast path's tasks leave (streaming/columns.py `FastPath.reduced`): decoded rows pass as they are;
    refused ones (`slow`) are decided here, record by record, and only a rejected one keeps its bytes for the DLQ."""
    rows = [
        {"stream": "segments", "kind": "segment_rolled", "topic": "orders", "partition": 0, "base_offset": 0,
         "end_offset": 10, "first_batch_max_ts": 5, "size_bytes": 1, "ts": 6, "src_topic": "seg", "src_partition": 0,
         "src_offset": 9, "n": 4, "slow": False},
        {"src_topic": "seg", "src_partition": 0, "src_offset": 10, "raw_key": b"k1",
         "raw_value": json.dumps(GOOD_SEG).encode(), "n": 1, "slow": True},
        {"src_topic": "seg", "src_partition": 0, "src_offset": 11, "raw_key": b"k2", "raw_value": b"oops", "n": 1,
         "slow": True},
    ]  # fmt: skip
    names = sorted({k for r in rows for k in r})
    out = D.complete(pa.Table.from_pylist([{k: r.get(k) for k in names} for r in rows]))
    assert out.schema == DECODED_SCHEMA
    got = {r["src_offset"]: r for r in out.to_pylist()}
    assert got[9]["n"] == 4 and got[9]["kind"] == "segment_rolled" and got[9]["raw_value"] is None
    assert got[10]["error"] is None and got[10]["raw_value"] is None and got[10]["base_offset"] == 0
    assert got[11]["error"] == "malformed_json" and got[11]["raw_value"] == b"oops" and got[11]["raw_key"] == b"k2"
