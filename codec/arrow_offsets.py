"""`__consumer_offsets` offset commits decoded a block at a time: numpy reads the big-endian fields straight from the
Arrow buffers of the keys and values (no Python object per field), the strings are gathered into Arrow arrays.

Only the common, clean shape is accepted here: an offset key (v0/v1) with ASCII group and topic, a value of version
0 to 3 with ASCII metadata, exact lengths, an offset and a partition in range. Everything else — tombstones, group
metadata, other key versions, flexible (v4) values, truncated or trailing bytes, non-ASCII names — goes back to the
per-record codec (`offsets.py`), which knows every version and names the DLQ reason.
`tests/unit/test_arrow_offsets.py` compares the rows with the per-record codec's on generated records.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from compactd.codec.events import MAX_INT

_PAD = 32  # reads past the end of the data land in padding; their rows are refused by the length checks


def _column(items: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(data bytes + padding, start of each item, length of each item, is-valid) of a list of bytes."""
    arr = pa.array(items, pa.binary())
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
    keys: Sequence[bytes | None], values: Sequence[bytes | None]
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
    # value: version i16, offset i64, [leader epoch i32 (v3)], metadata (i16 length + bytes), commit ts i64,
    # [expire ts i64 (v1)]; nothing after
    ok &= vl >= 20
    vver = _be(vd, np.where(ok, vs, 0), 2)
    ok &= (vver >= 0) & (vver <= 3)
    offset = _be(vd, np.where(ok, vs + 2, 0), 8)
    mpos = np.where(vver == 3, 14, 10)
    mlen = _be(vd, np.where(ok, vs + mpos, 0), 2)
    ok &= mlen >= 0
    fixed = np.select([vver == 1, vver == 3], [28, 24], 20)
    ok &= vl == fixed + mlen
    ts = _be(vd, np.where(ok, vs + mpos + 2 + mlen, 0), 8)
    ok &= (offset >= 0) & (offset <= MAX_INT)
    zero = np.zeros(n, np.int64)
    group, g_ascii = _strings(kd, np.where(ok, ks + 4, 0), np.where(ok, glen, zero))
    topic, t_ascii = _strings(kd, np.where(ok, tpos + 2, 0), np.where(ok, tlen, zero))
    _, m_ascii = _strings(vd, np.where(ok, vs + mpos + 2, 0), np.where(ok, mlen, zero))
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
    return cols, take, np.flatnonzero(~ok).tolist()
