"""The fast path for JSON input events: `pyarrow.json` parses a whole block into columns (~1 µs a record, no Python
object per field), and the contract's checks run as Arrow compute kernels over those columns.

Accepting is the only decision made here, and it never accepts what the pydantic reference (`events`) rejects: every
constraint of the models is checked (ranges, topic pattern, lengths, which types belong on which topic, end after
base, a null `size_bytes` refused where an absent one is 0). A block the parser refuses (one bad record fails the
whole block) is split in halves until the bad records are found; those, blocks too small to be worth a parse, and
every row the checks do not accept, are handed back to the reference, record by record, which names the DLQ reason.
`tests/unit/test_arrow_events.py` compares the rows with the reference's on generated blocks, and checks that every
valid event is accepted here (else the path would be fast for nothing).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from compactd.codec.events import MAX_INT

# every field an input event may carry (unknown fields are ignored, as in the reference)
JSON_SCHEMA = pa.schema(
    [
        ("type", pa.string()),
        ("group", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int64()),
        ("offset", pa.int64()),
        ("base_offset", pa.int64()),
        ("end_offset", pa.int64()),
        ("first_batch_max_ts", pa.int64()),
        ("size_bytes", pa.int64()),
        ("cleaned_up_to", pa.int64()),
        ("log_start_offset", pa.int64()),
        ("ts", pa.int64()),
    ]
)
_PARSE = pj.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="ignore")
_READ = pj.ReadOptions(use_threads=False, block_size=1 << 30)  # Spark's tasks are the parallelism
_SMALL = 64  # blocks the parser refuses are split down to this size, then decoded record by record
_TOPIC = r"^[a-zA-Z0-9._-]{1,249}$"
_BOM = b"\xef\xbb\xbf"


class Decoded:
    """Parsed blocks with their input positions, and the positions left to the per-record path."""

    def __init__(self) -> None:
        self.tables: list[tuple[pa.Table, pa.Array]] = []
        self.rest: list[int] = []


def decode_json_block(
    values: Sequence[bytes | None], types: frozenset[str], max_bytes: int
) -> tuple[dict[str, pa.Array], pa.Array, list[int]]:
    """Decode `values`; returns (accepted columns, their input positions, positions left to the per-record path)."""
    out = Decoded()
    _block(values, 0, len(values), max_bytes, out)
    if out.tables:
        parsed = pa.concat_tables([t for t, _ in out.tables])
        positions = pa.chunked_array([p for _, p in out.tables], pa.int64()).combine_chunks()
    else:
        parsed, positions = JSON_SCHEMA.empty_table(), pa.array([], pa.int64())
    cols, ok = _checked(parsed, types)
    ok = _size_absent_not_null(parsed, ok, positions, values)
    refused = pc.filter(positions, pc.invert(ok)).to_pylist()
    accepted = {name: pc.filter(col, ok) for name, col in cols.items()}
    rest = sorted(out.rest + refused)
    return accepted, pc.filter(positions, ok), rest


def _size_absent_not_null(t: pa.Table, ok: pa.Array, positions: pa.Array, values: Sequence[bytes | None]) -> pa.Array:
    """Refuse the accepted segment rows whose null `size_bytes` may be an explicit null: the parser reads absent and
    null alike, the reference defaults an absent size to 0 but rejects null. Only rows whose raw text names the field
    (or escapes a character, which could spell it) go back to the per-record path; valid events omit it or set it."""
    maybe = pc.and_(ok, pc.is_null(t.column("size_bytes")))
    if not pc.any(maybe).as_py():
        return ok
    suspect = [i for i in pc.indices_nonzero(maybe).to_pylist() if _may_name_size(values[positions[i].as_py()])]
    if not suspect:
        return ok
    mask = ok.to_pylist()
    for i in suspect:
        mask[i] = False
    return pa.array(mask, pa.bool_())


def _may_name_size(raw: bytes | None) -> bool:
    return raw is None or b"size_bytes" in raw or b"\\" in raw


def _block(values: Sequence[bytes | None], lo: int, hi: int, max_bytes: int, out: Decoded) -> None:
    if hi - lo <= _SMALL:
        out.rest.extend(range(lo, hi))
        return
    chunk = values[lo:hi]
    table = None
    # Each value must become exactly one line of the block: no line breaks inside, nothing empty, an object's braces
    # at both ends (a value of two objects parses as two rows: the row count check below catches it).
    if None not in chunk and max(map(len, chunk)) <= max_bytes:
        joined = b"\n".join(chunk)
        if (
            joined.count(b"\n") == len(chunk) - 1
            and b"\r" not in joined
            and not joined.startswith(_BOM)
            and all(v[:1] == b"{" and v[-1:] == b"}" for v in chunk)
            and _utf8(joined)  # the parser does not check the names of the fields it ignores
        ):
            try:
                table = pj.read_json(io.BytesIO(joined), read_options=_READ, parse_options=_PARSE)
            except (pa.ArrowInvalid, UnicodeDecodeError):
                table = None
            if table is not None and table.num_rows != len(chunk):
                table = None
    if table is not None:
        out.tables.append((table, pa.array(range(lo, hi), pa.int64())))
        return
    mid = (lo + hi) // 2
    _block(values, lo, mid, max_bytes, out)
    _block(values, mid, hi, max_bytes, out)


def _utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _count(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.and_(pc.greater_equal(col, 0), pc.less_equal(col, MAX_INT))


def _checked(t: pa.Table, types: frozenset[str]) -> tuple[dict[str, pa.Array], pa.Array]:
    """The decoded-schema columns of the parsed rows (fields a type does not carry are null, as in the reference's
    rows) and the mask of rows that satisfy the contract: the constraints of the models in `events`, as kernels."""
    kind = t.column("type")
    is_ = {k: pc.equal(kind, k) for k in ("offset_commit", "offset_delete", "group_delete", "segment_rolled",
                                          "compacted", "log_start")}  # fmt: skip
    topic, part, group = t.column("topic"), t.column("partition"), t.column("group")
    topic_ok = pc.and_(
        pc.and_(pc.match_substring_regex(topic, _TOPIC), pc.greater_equal(part, 0)), pc.less_equal(part, 2**31 - 1)
    )
    glen = pc.utf8_length(group)
    group_ok = pc.and_(pc.greater_equal(glen, 1), pc.less_equal(glen, 1024))
    size = pc.fill_null(t.column("size_bytes"), 0)
    base, end = t.column("base_offset"), t.column("end_offset")
    seg_ok = pc.and_(
        pc.and_(pc.and_(topic_ok, _count(base)), pc.and_(_count(end), _count(t.column("first_batch_max_ts")))),
        pc.and_(_count(size), pc.greater(end, base)),
    )
    per_kind = [
        pc.and_(is_["offset_commit"], pc.and_(pc.and_(group_ok, topic_ok), _count(t.column("offset")))),
        pc.and_(is_["offset_delete"], pc.and_(group_ok, topic_ok)),
        pc.and_(is_["group_delete"], group_ok),
        pc.and_(is_["segment_rolled"], seg_ok),
        pc.and_(is_["compacted"], pc.and_(topic_ok, _count(t.column("cleaned_up_to")))),
        pc.and_(is_["log_start"], pc.and_(topic_ok, _count(t.column("log_start_offset")))),
    ]
    any_kind = per_kind[0]
    for m in per_kind[1:]:
        any_kind = pc.or_(pc.fill_null(any_kind, False), pc.fill_null(m, False))
    ok = pc.and_(pc.and_(pc.is_in(kind, pa.array(sorted(types))), _count(t.column("ts"))), any_kind)
    ok = pc.fill_null(ok, False)
    if isinstance(ok, pa.ChunkedArray):
        ok = ok.combine_chunks()

    def only(mask: pa.Array, col: pa.ChunkedArray | pa.Array) -> pa.Array:
        return pc.if_else(pc.fill_null(mask, False), col, pa.nulls(len(t), col.type))

    has_topic = pc.invert(is_["group_delete"])
    has_group = pc.or_(pc.or_(is_["offset_commit"], is_["offset_delete"]), is_["group_delete"])
    seg = is_["segment_rolled"]
    value = pc.if_else(
        is_["offset_commit"],
        t.column("offset"),
        pc.if_else(
            is_["compacted"],
            t.column("cleaned_up_to"),
            pc.if_else(is_["log_start"], t.column("log_start_offset"), pa.scalar(None, pa.int64())),
        ),
    )
    cols = {
        "kind": kind,
        "topic": only(has_topic, topic),
        "partition": pc.cast(only(has_topic, part), pa.int32(), safe=False),
        "grp": only(has_group, group),
        "base_offset": only(seg, base),
        "end_offset": only(seg, end),
        "first_batch_max_ts": only(seg, t.column("first_batch_max_ts")),
        "size_bytes": only(seg, size),
        "value_offset": value,
        "ts": t.column("ts"),
    }
    return {k: (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v) for k, v in cols.items()}, ok
