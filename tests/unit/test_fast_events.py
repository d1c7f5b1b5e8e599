"""The fast JSON path accepts only what the pydantic reference accepts, with the same row, and accepts every valid
event (else it would be fast for nothing)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.codec.events import MAX_INT, OFFSET_EVENTS, SEGMENT_EVENTS
from compactd.codec.fast_events import OFFSET_TYPES, SEGMENT_TYPES, fast_row
from compactd.streaming.decode import Decoder

D = Decoder("seg", "com", max_event_bytes=20_000)
TYPES = sorted(SEGMENT_TYPES | OFFSET_TYPES)
FIELDS = ("group", "topic", "partition", "offset", "base_offset", "end_offset", "first_batch_max_ts", "size_bytes",
          "cleaned_up_to", "log_start_offset", "ts")  # fmt: skip
INTS = st.sampled_from([0, 1, 7, 2**31 - 1, 2**31, MAX_INT, MAX_INT + 1, -1, 2**63, 2**64 + 3]) | st.integers(0, 10**6)
ODD = st.sampled_from([1.0, 2.5, True, False, None, [], {}, "0", "", "x" * 250, "bad topic!", "abc\n", "é", "\ud800"])
TOPICS = st.sampled_from(["orders", "a.b_c-1", "x" * 249])
GROUPS = st.sampled_from(["g", "billing", "é" * 1024, "é" * 1025, "g" * 1024, "g" * 1025])


@st.composite
def event(draw: st.DrawFn) -> dict:
    ev: dict = {"type": draw(st.sampled_from([*TYPES, "segment_exploded", 5]))}
    for f in FIELDS:
        if draw(st.integers(0, 9)) == 0:
            continue  # missing
        if f == "topic":
            ev[f] = draw(TOPICS | ODD)
        elif f == "group":
            ev[f] = draw(GROUPS | ODD)
        else:
            ev[f] = draw(INTS | ODD) if draw(st.integers(0, 5)) == 0 else draw(st.integers(0, 10**6))
    if draw(st.booleans()):
        ev["extra"] = draw(ODD | st.dictionaries(st.text(max_size=3), INTS, max_size=2))
    return ev


@st.composite
def value(draw: st.DrawFn) -> bytes | None:
    ev = draw(event())
    raw = json.dumps(ev).encode()
    match draw(st.integers(0, 9)):
        case 0:
            return raw[: draw(st.integers(0, len(raw)))]  # truncated
        case 1:
            return raw[:-1] + b',"ts":' + str(draw(INTS)).encode() + b"}"  # a duplicate key, last one wins
        case 2:
            return draw(st.sampled_from([None, b"", b"[1,2]", b"5", b"null", b'"x"', b"{}", b"x" * 20_001]))
        case _:
            return raw


def check(topic: str, stream: str, types: frozenset[str], adapter, raw: bytes | None) -> None:
    reference = D.reference_row(stream, adapter, raw)
    fast = fast_row(stream, types, raw, D.max_event_bytes)
    if fast is not None:
        assert "error" not in reference and fast == reference, (raw, fast, reference)
    assert D.row(topic, raw) == (fast if fast is not None else reference)


@settings(max_examples=2000, deadline=None)
@given(value())
def test_fast_path_never_accepts_what_the_reference_rejects(raw: bytes | None) -> None:
    check("seg", "segments", SEGMENT_TYPES, SEGMENT_EVENTS, raw)
    check("com", "commits", OFFSET_TYPES, OFFSET_EVENTS, raw)


VALID = {
    "offset_commit": {"group": "g", "topic": "t", "partition": 3, "offset": 10, "ts": 5},
    "offset_delete": {"group": "g", "topic": "t", "partition": 3, "ts": 5},
    "group_delete": {"group": "g", "ts": 5},
    "segment_rolled": {
        "topic": "t",
        "partition": 0,
        "base_offset": 0,
        "end_offset": 9,
        "first_batch_max_ts": 1,
        "ts": 2,
    },
    "compacted": {"topic": "t", "partition": 0, "cleaned_up_to": 4, "ts": 2},
    "log_start": {"topic": "t", "partition": 0, "log_start_offset": 4, "ts": 2},
}


def test_fast_path_takes_every_valid_event() -> None:
    for kind, fields in VALID.items():
        types = SEGMENT_TYPES if kind in SEGMENT_TYPES else OFFSET_TYPES
        raw = json.dumps({"type": kind, **fields, "unknown": {"x": [1]}}).encode()
        row = fast_row("s", types, raw, 20_000)
        assert row is not None and row["kind"] == kind, kind
        other = OFFSET_TYPES if types is SEGMENT_TYPES else SEGMENT_TYPES
        assert fast_row("s", other, raw, 20_000) is None  # on the other topic it is the reference's unknown_type
