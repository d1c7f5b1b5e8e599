"""Generated input-event values for the JSON decoders' tests: valid events, events with fields of every wrong kind,
and byte-level damage (truncation, duplicate keys, invalid UTF-8, a BOM, line breaks, two objects in one value)."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from compactd.codec.events import MAX_INT, OFFSET_TYPES, SEGMENT_TYPES

TYPES = sorted(SEGMENT_TYPES | OFFSET_TYPES)
FIELDS = ("group", "topic", "partition", "offset", "base_offset", "end_offset", "first_batch_max_ts", "size_bytes",
          "cleaned_up_to", "log_start_offset", "ts", "replica", "replicas", "last_epoch")  # fmt: skip
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
        elif f == "replicas":
            ev[f] = draw(st.lists(st.integers(0, 4), max_size=4) | ODD)
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
            return draw(st.sampled_from([None, b"", b" ", b"[1,2]", b"5", b"null", b'"x"', b"{}", b"x" * 20_001]))
        case 3:
            return draw(st.sampled_from([b"\xef\xbb\xbf" + raw, raw + raw, b" " + raw, raw + b"\n", raw + b"\r\n"]))
        case 4:
            at = draw(st.integers(0, len(raw)))  # one byte replaced: invalid UTF-8, a line break, a control character
            return raw[:at] + draw(st.sampled_from([b"\xff", b"\n", b"\r", b"\x01", b"\xc3"])) + raw[at + 1 :]
        case _:
            return raw


# one valid event of each type
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
    "replica_log": {
        "topic": "t",
        "partition": 0,
        "replica": 2,
        "replicas": [1, 2, 3],
        "cleaned_up_to": 4,
        "ts": 2,
    },
    "log_start": {"topic": "t", "partition": 0, "log_start_offset": 4, "ts": 2},
}
