"""The fast JSON path accepts only what the pydantic reference accepts, with the same row, and accepts every valid
event (else it would be fast for nothing)."""

from __future__ import annotations

import json

from hypothesis import example, given, settings

from compactd.codec.events import OFFSET_EVENTS, SEGMENT_EVENTS
from compactd.codec.fast_events import OFFSET_TYPES, SEGMENT_TYPES, fast_row
from compactd.streaming.decode import Decoder
from tests.support.event_values import VALID, value
from tests.support.examples import examples

D = Decoder("seg", "com", max_event_bytes=20_000)


def check(topic: str, stream: str, types: frozenset[str], adapter, raw: bytes | None) -> None:
    reference = D.reference_row(stream, adapter, raw)
    fast = fast_row(stream, types, raw, D.max_event_bytes)
    if fast is not None:
        assert "error" not in reference and fast == reference, (raw, fast, reference)
    assert D.row(topic, raw) == (fast if fast is not None else reference)


@settings(max_examples=examples(2000), deadline=None)
@given(value())
@example(
    b'{"type": "segment_rolled", "topic": "o", "partition": 0, "base_offset": 0, "end_offset": 1, '
    b'"first_batch_max_ts": 0, "size_bytes": null, "ts": 0}'
)  # null is refused, absent is 0 (soak find)
def test_fast_path_never_accepts_what_the_reference_rejects(raw: bytes | None) -> None:
    check("seg", "segments", SEGMENT_TYPES, SEGMENT_EVENTS, raw)
    check("com", "commits", OFFSET_TYPES, OFFSET_EVENTS, raw)


def test_fast_path_takes_every_valid_event() -> None:
    for kind, fields in VALID.items():
        types = SEGMENT_TYPES if kind in SEGMENT_TYPES else OFFSET_TYPES
        raw = json.dumps({"type": kind, **fields, "unknown": {"x": [1]}}).encode()
        row = fast_row("s", types, raw, 20_000)
        assert row is not None and row["kind"] == kind, kind
        other = OFFSET_TYPES if types is SEGMENT_TYPES else SEGMENT_TYPES
        assert fast_row("s", other, raw, 20_000) is None  # on the other topic it is the reference's unknown_type
