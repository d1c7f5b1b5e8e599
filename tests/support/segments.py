"""Segment files and checkpoint files built byte for byte as a Kafka broker writes them (test fixtures).

RecordBatch v2 headers carry a correct CRC-32C, legacy magic 0/1 messages a correct CRC-32; checkpoints are
written like the broker's (`.tmp`, fsync, rename).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import crc32c


def encode_batch_v2(base_offset: int, base_ts: int, max_ts: int, records: int = 1, payload: bytes = b"") -> bytes:
    """A RecordBatch v2 with a correct CRC-32C (records section left opaque: only the header is read)."""
    after_crc = struct.pack(">hiqqqhii", 0, max(records - 1, 0), base_ts, max_ts, -1, -1, -1, records) + payload
    crc = crc32c.crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, rest
    return struct.pack(">qiibI", base_offset, batch_length, 0, 2, crc) + after_crc


def encode_message_v1(offset: int, ts: int | None, key: bytes = b"k", value: bytes = b"v") -> bytes:
    """A legacy magic 1 message (or magic 0 when ts is None) with a correct CRC-32."""
    magic = 0 if ts is None else 1
    body = struct.pack(">bb", magic, 0) + (struct.pack(">q", ts) if ts is not None else b"")
    body += struct.pack(">i", len(key)) + key + struct.pack(">i", len(value)) + value
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, 4 + len(body), crc) + body


def write_checkpoint(path: Path, entries: dict[tuple[str, int], int]) -> None:
    """Like the broker: write `.tmp`, fsync, rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"0\n{len(entries)}\n" + "".join(f"{t} {p} {o}\n" for (t, p), o in sorted(entries.items())))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
