"""`__consumer_offsets` offset commits decoded a block at a time: numpy reads the big-endian fields straight from the
Arrow buffers of the keys and values (no Python object per field), the strings are gathered into Arrow arrays.

Only the common, clean shape is accepted here: an offset key (v0/v1) with ASCII group and topic, a value of version
0 to 4 with ASCII metadata, exact lengths, an offset and a partition in range. A v4 value (flexible, what Kafka 4.x
writes) is accepted with metadata of at most 126 bytes (a one-byte length) and either no tagged field or exactly the
topic ID (tag 0, 16 bytes). Everything else — tombstones, group metadata, other key versions, other tags, truncated or
trailing bytes, non-ASCII names — goes back to the per-record codec (`offsets.py`), which knows every version and
names the DLQ reason.
`tests/unit/test_arrow_offsets.py` compares the rows with the per-record codec's on generated records.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactd.codec.events import MAX_INT

_PAD = 32  # reads past the end of the data land in padding; their rows are refused by the length checks


def _column(items: Sequence[bytes | None] | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(data bytes + padding, start of each item, length of each item, is-valid) of a list of bytes, or of an Arrow
    binary array as Spark hands it over (read in place)."""
    arr = items.cast(pa.binary()) if isinstance(items, pa.Array) else pa.array(items, pa.binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4).astype(np.int64)
    raw = arr.buffers()[2]
    data = np.frombuffer(raw, np.uint8) if raw is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(_PAD, np.uint8)])
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
    return data, offsets[:-1], offsets[1:] - offsets[:-1], valid


def _be(data: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Signed big-endian integers of `width` bytes at `pos` (positions must be inside data + padding)."""
    out = np.zeros(len(pos), np.uint64)
    for i in range(width):
        out = (out << np.uint64(8)) | data[pos + i].astype(np.uint64)
    signed = {2: np.int16, 4: np.int32, 8: np.int64}[width]
    return out.astype({2: np.uint16, 4: np.uint32, 8: np.uint64}[width]).view(signed).astype(np.int64)


def _strings(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The strings at (start, length) as an Arrow array, and which of them are pure ASCII (valid UTF-8 as is)."""
    ends = np.concatenate([[0], np.cumsum(length)])
    total = int(ends[-1])
    index = np.repeat(start - ends[:-1], length) + np.arange(total, dtype=np.int64)
    chars = data[index] if total else np.zeros(0, np.uint8)
    high = np.concatenate([[0], np.cumsum(chars >= 0x80)])
    ascii_ = high[ends[1:]] == high[ends[:-1]]
    arr = pa.StringArray.from_buffers(len(length), pa.py_buffer(ends.astype(np.int32)), pa.py_buffer(chars.tobytes()))
    return arr, ascii_


def decode_offset_commits(
    keys: Sequence[bytes | None] | pa.Array, values: Sequence[bytes | None] | pa.Array
) -> tuple[dict[str, pa.Array], pa.Array, list[int]]:
    """Offset commits among `__consumer_offsets` records; returns (accepted columns in the decoded schema's names,
    their input positions, positions left to the per-record codec)."""
    n = len(keys)
    if n == 0:
        return {}, pa.array([], pa.int64()), []
    kd, ks, kl, kv = _column(keys)
    vd, vs, vl, vv = _column(values)
    # key: version i16, group (i16 length + bytes), topic (i16 length + bytes), partition i32; nothing after
    ok = kv & vv & (kl >= 10)
    kver = _be(kd, np.where(ok, ks, 0), 2)
    ok &= (kver == 0) | (kver == 1)
    glen = _be(kd, np.where(ok, ks + 2, 0), 2)
    ok &= (glen >= 0) & (kl >= 10 + glen)
    tpos = np.where(ok, ks + 4 + glen, 0)
    tlen = _be(kd, tpos, 2)
    ok &= (tlen >= 0) & (kl == 10 + glen + tlen)
    part = _be(kd, np.where(ok, tpos + 2 + tlen, 0), 4)
    ok &= part >= 0
    # value: version i16, offset i64, [leader epoch i32 (v3, v4)], metadata (v0-v3: i16 length + bytes; v4: uvarint
    # length + 1, then bytes), commit ts i64, [expire ts i64 (v1)], [tagged fields (v4)]; nothing after
    ok &= vl >= 20
    vver = _be(vd, np.where(ok, vs, 0), 2)
    ok &= (vver >= 0) & (vver <= 4)
    v4 = vver == 4
    offset = _be(vd, np.where(ok, vs + 2, 0), 8)
    mpos = np.where(vver >= 3, 14, 10)
    mlen16 = _be(vd, np.where(ok, vs + mpos, 0), 2)
    mvar = vd[np.where(ok, vs + mpos, 0)].astype(np.int64)  # v4: one byte, no continuation bit, not null (0)
    ok &= np.where(v4, (mvar >= 1) & (mvar <= 127), mlen16 >= 0)
    mlen = np.where(v4, mvar - 1, mlen16)
    mstart = mpos + np.where(v4, 1, 2)
    # v4: after the timestamp, the tag count: 0 (nothing after it), or 1 with tag 0 of 16 bytes (the topic ID)
    tpos_ = vs + mstart + mlen + 8
    ok &= ~v4 | (vl >= mstart + mlen + 9)
    tags = vd[np.where(ok & v4, tpos_, 0)]
    with_id = v4 & (tags == 1) & (vl == mstart + mlen + 9 + 18)
    with_id &= (vd[np.where(ok & with_id, tpos_ + 1, 0)] == 0) & (vd[np.where(ok & with_id, tpos_ + 2, 0)] == 16)
    fixed = np.select([vver == 1, vver == 3], [28, 24], 20)
    ok &= np.where(v4, ((tags == 0) & (vl == mstart + mlen + 9)) | with_id, vl == fixed + mlen)
    ts = _be(vd, np.where(ok, vs + mstart + mlen, 0), 8)
    ok &= (offset >= 0) & (offset <= MAX_INT)
    zero = np.zeros(n, np.int64)
    group, g_ascii = _strings(kd, np.where(ok, ks + 4, 0), np.where(ok, glen, zero))
    topic, t_ascii = _strings(kd, np.where(ok, tpos + 2, 0), np.where(ok, tlen, zero))
    _, m_ascii = _strings(vd, np.where(ok, vs + mstart, 0), np.where(ok, mlen, zero))
    ok &= g_ascii & t_ascii & m_ascii
    take = pa.array(np.flatnonzero(ok), pa.int64())
    cols = {
        "kind": pa.repeat("offset_commit", len(take)),
        "grp": group.take(take),
        "topic": topic.take(take),
        "partition": pa.array(part[ok].astype(np.int32), pa.int32()),
        "value_offset": pa.array(offset[ok], pa.int64()),
        "ts": pa.array(ts[ok], pa.int64()),
    }
    has_id = with_id[ok]
    if has_id.any():
        ids = _uuids(vd, (tpos_ + 3)[ok][has_id])
        cols["topic_id"] = pa.array(np.full(len(has_id), None, object)).cast(pa.string())
        cols["topic_id"] = pc.replace_with_mask(cols["topic_id"], pa.array(has_id), ids)
    return cols, take, np.flatnonzero(~ok).tolist()


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
# where each of a UUID's 32 hex digits goes in its 36 characters (8-4-4-4-12)
_DIGIT_AT = np.array([i + (i >= 8) + (i >= 12) + (i >= 16) + (i >= 20) for i in range(32)])


def _uuids(data: np.ndarray, pos: np.ndarray) -> pa.Array:
    """The 16 bytes at each position as UUID strings, as `str(uuid.UUID(bytes=...))` spells them."""
    raw = data[pos[:, None] + np.arange(16)]
    digits = np.stack([_HEX[raw >> 4], _HEX[raw & 15]], axis=2).reshape(len(pos), 32)
    chars = np.full((len(pos), 36), ord("-"), np.uint8)
    chars[:, _DIGIT_AT] = digits
    ends = np.arange(len(pos) + 1, dtype=np.int32) * 36
    return pa.StringArray.from_buffers(len(pos), pa.py_buffer(ends), pa.py_buffer(chars.tobytes()))
