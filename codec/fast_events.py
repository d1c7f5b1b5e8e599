"""The fast path for JSON input events: msgspec decodes into one lenient struct, plain checks accept what is clearly
valid, and everything else goes back to the pydantic models in `events` (the reference), which give the DLQ reason.

Accepting is the only decision made here, and it never accepts what the reference rejects: every constraint of
`events` is checked (ranges, topic pattern, lengths, which types belong on which topic, end after base). The row it
builds is the reference row for the same record (`tests/unit/test_fast_events.py` checks both on generated input).
A pydantic validation costs ~2.8 µs a record; this path ~1 µs.
"""

from __future__ import annotations

import re

import msgspec

from compactd.codec.events import MAX_INT

_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_MAX_PARTITION = 2**31 - 1


class Lenient(msgspec.Struct, frozen=True):
    """Every field an input event may carry; None when absent. Unknown fields are ignored, as in the reference.

    `size_bytes` alone has a default in the reference (0 when absent), so absent (UNSET) and null (refused) differ.
    """

    type: str | None = None
    group: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    base_offset: int | None = None
    end_offset: int | None = None
    first_batch_max_ts: int | None = None
    size_bytes: int | msgspec.UnsetType | None = msgspec.UNSET
    cleaned_up_to: int | None = None
    log_start_offset: int | None = None
    ts: int | None = None


_DECODE = msgspec.json.Decoder(Lenient).decode
SEGMENT_TYPES = frozenset(("segment_rolled", "compacted", "log_start"))
OFFSET_TYPES = frozenset(("offset_commit", "offset_delete", "group_delete"))


def _count(v: int | None) -> bool:
    return v is not None and 0 <= v <= MAX_INT


def _topic(v: str | None, partition: int | None) -> bool:
    return (
        v is not None and _TOPIC.fullmatch(v) is not None and partition is not None and 0 <= partition <= _MAX_PARTITION
    )


def _group(v: str | None) -> bool:
    return v is not None and 1 <= len(v) <= 1024


def fast_row(stream: str, types: frozenset[str], value: bytes | None, max_bytes: int) -> dict | None:
    """The decoded row for a clearly valid event of `types`, or None: ask the reference."""
    if value is None or len(value) > max_bytes:
        return None
    if not value.isascii():  # msgspec does not check the names of the fields it skips: the reference does
        try:
            value.decode()
        except UnicodeDecodeError:
            return None
    try:
        e = _DECODE(value)
    except (msgspec.DecodeError, UnicodeDecodeError):  # not JSON (or UTF-8), not an object, a field's JSON type
        return None
    kind = e.type
    if kind not in types or not _count(e.ts):
        return None
    if kind == "offset_commit":
        if _group(e.group) and _topic(e.topic, e.partition) and _count(e.offset):
            return {"stream": stream, "kind": kind, "ts": e.ts, "grp": e.group, "topic": e.topic,
                    "partition": e.partition, "value_offset": e.offset}  # fmt: skip
    elif kind == "segment_rolled":
        size = 0 if e.size_bytes is msgspec.UNSET else e.size_bytes
        if (
            _topic(e.topic, e.partition)
            and _count(e.base_offset)
            and _count(e.end_offset)
            and _count(e.first_batch_max_ts)
            and _count(size)
            and e.end_offset > e.base_offset  # type: ignore[operator]
        ):
            return {"stream": stream, "kind": kind, "ts": e.ts, "topic": e.topic, "partition": e.partition,
                    "base_offset": e.base_offset, "end_offset": e.end_offset,
                    "first_batch_max_ts": e.first_batch_max_ts, "size_bytes": size}  # fmt: skip
    elif kind == "offset_delete":
        if _group(e.group) and _topic(e.topic, e.partition):
            return {"stream": stream, "kind": kind, "ts": e.ts, "grp": e.group, "topic": e.topic,
                    "partition": e.partition}  # fmt: skip
    elif kind == "group_delete":
        if _group(e.group):
            return {"stream": stream, "kind": kind, "ts": e.ts, "grp": e.group}
    elif kind == "compacted":
        if _topic(e.topic, e.partition) and _count(e.cleaned_up_to):
            return {"stream": stream, "kind": kind, "ts": e.ts, "topic": e.topic, "partition": e.partition,
                    "value_offset": e.cleaned_up_to}  # fmt: skip
    elif kind == "log_start" and _topic(e.topic, e.partition) and _count(e.log_start_offset):
        return {"stream": stream, "kind": kind, "ts": e.ts, "topic": e.topic, "partition": e.partition,
                "value_offset": e.log_start_offset}  # fmt: skip
    return None
