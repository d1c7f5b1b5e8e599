"""Read Kafka log directories: segment headers (first batch only) and the broker's checkpoint files.

Layout: `<log.dir>/<topic>-<partition>/<base offset, 20 digits>.log`; the highest base offset is the active
segment. Transient files (`.cleaned`, `.swap`, `.deleted`) and `-delete` partition directories are ignored.
Only the first batch of a segment is read: RecordBatch v2 (its max timestamp, checked with CRC-32C) or a legacy
magic 0/1 message (CRC-32); magic 0 carries no timestamp, so the file's mtime stands in (a later-than-real bound:
compaction is never decided early).
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import crc32c

from compactd.errors import CompactdError

SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
BATCH_V2_HEADER = 61
MAX_FIRST_BATCH = 256 * 1024 * 1024  # Kafka's message.max.bytes tops out far below this


class SegmentError(CompactdError, ValueError):
    """A segment whose header cannot be trusted (truncated, corrupt, unknown magic)."""


@dataclass(frozen=True)
class SegmentFile:
    topic: str
    partition: int
    base_offset: int
    size_bytes: int
    mtime_ms: int
    active: bool
    end_offset: int | None = None  # the next segment's base offset; None for the active segment
    magic: int | None = None
    first_batch_max_ts: int | None = None
    error: str | None = None
    last_epoch: int | None = None  # the leader epoch of its last offset (leader-epoch-checkpoint); None: unknown
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "path"}


def partition_of(dirname: str) -> tuple[str, int] | None:
    """`orders-3` → ("orders", 3); None for anything that is not a live partition directory."""
    if dirname.endswith("-delete") or dirname.endswith("-future") or dirname.endswith("-stray"):
        return None
    topic, sep, num = dirname.rpartition("-")
    if not sep or not topic or not num.isdigit():
        return None
    return topic, int(num)


def first_batch(data: bytes, read_more: Any) -> tuple[int, int | None]:
    """(magic, first timestamp or None) from the start of a segment; raises SegmentError."""
    if len(data) < 17:
        raise SegmentError(f"truncated header: {len(data)} bytes")
    magic = data[16]
    if magic == 2:
        if len(data) < BATCH_V2_HEADER:
            raise SegmentError(f"truncated batch header: {len(data)} of {BATCH_V2_HEADER} bytes")
        batch_length = struct.unpack_from(">i", data, 8)[0]
        total = 12 + batch_length
        if batch_length < BATCH_V2_HEADER - 12 or total > MAX_FIRST_BATCH:
            raise SegmentError(f"implausible batch length {batch_length}")
        data = read_more(total)
        if len(data) < total:
            raise SegmentError(f"truncated first batch: {len(data)} of {total} bytes")
        stored = struct.unpack_from(">I", data, 17)[0]
        if crc32c.crc32c(data[21:total]) != stored:
            raise SegmentError("crc mismatch in first batch (CRC-32C)")
        return 2, struct.unpack_from(">q", data, 35)[0]
    if magic in (0, 1):
        size = struct.unpack_from(">i", data, 8)[0]
        total = 12 + size
        if size < (14 if magic == 0 else 22) or total > MAX_FIRST_BATCH:
            raise SegmentError(f"implausible message size {size}")
        data = read_more(total)
        if len(data) < total:
            raise SegmentError(f"truncated first message: {len(data)} of {total} bytes")
        stored = struct.unpack_from(">I", data, 12)[0]
        if zlib.crc32(data[16:total]) != stored:
            raise SegmentError("crc mismatch in first message (CRC-32)")
        return magic, struct.unpack_from(">q", data, 18)[0] if magic == 1 else None
    raise SegmentError(f"unknown magic {magic}")


def read_segment(path: Path, topic: str, partition: int, base: int, active: bool, end: int | None) -> SegmentFile:
    """Header of one segment file. Raises FileNotFoundError if it vanished (retention, cleaning)."""
    st = path.stat()
    mtime_ms = st.st_mtime_ns // 1_000_000
    common = dict(
        topic=topic,
        partition=partition,
        base_offset=base,
        size_bytes=st.st_size,
        mtime_ms=mtime_ms,
        active=active,
        end_offset=end,
        path=str(path),
    )
    with open(path, "rb") as f:
        head = f.read(BATCH_V2_HEADER)

        def read_more(total: int) -> bytes:
            return head + f.read(max(total - len(head), 0))

        try:
            magic, ts = first_batch(head, read_more)
        except SegmentError as exc:
            return SegmentFile(**common, error=str(exc))  # type: ignore[arg-type]
    if ts is None or ts < 0:  # magic 0, or NO_TIMESTAMP
        ts = mtime_ms
    return SegmentFile(**common, magic=magic, first_batch_max_ts=ts)  # type: ignore[arg-type]


def read_leader_epochs(pdir: Path) -> list[tuple[int, int]]:
    """The partition's `leader-epoch-checkpoint`: (epoch, start offset) in offset order, each epoch's records from
    its start offset up to the next one's. Empty when there is none or it cannot be read: the epochs are then unknown
    (a segment's report goes without one), never guessed."""
    try:
        lines = [ln.split() for ln in (pdir / "leader-epoch-checkpoint").read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError):
        return []
    if len(lines) < 2 or lines[0] != ["0"] or len(lines[1]) != 1 or not lines[1][0].isdigit():
        return []
    entries = lines[2:]
    if len(entries) != int(lines[1][0]) or any(len(e) != 2 or not (e[0].isdigit() and e[1].isdigit()) for e in entries):
        return []
    return sorted(((int(e), int(o)) for e, o in entries), key=lambda eo: eo[1])


def epoch_at(epochs: list[tuple[int, int]], offset: int) -> int | None:
    """The leader epoch the record at `offset` was written in, by the checkpoint's entries (None: before them)."""
    found = None
    for epoch, start in epochs:
        if start > offset:
            break
        found = epoch
    return found


def scan_partition(pdir: Path, topic: str, partition: int) -> list[SegmentFile]:
    try:
        names = os.listdir(pdir)
    except FileNotFoundError:
        return []
    bases = sorted(int(m.group(1)) for n in names if (m := SEGMENT_NAME.match(n)))
    epochs = read_leader_epochs(pdir) if len(bases) > 1 else []
    out = []
    for i, base in enumerate(bases):
        active = i == len(bases) - 1
        end = None if active else bases[i + 1]
        try:
            seg = read_segment(pdir / f"{base:020d}.log", topic, partition, base, active, end)
        except FileNotFoundError:
            continue  # deleted while we looked
        if end is not None and epochs:
            seg = replace(seg, last_epoch=epoch_at(epochs, end - 1))
        out.append(seg)
    return out


def scan_log_dir(log_dir: Path) -> list[SegmentFile]:
    """Every segment under a log dir (or under one partition directory)."""
    own = partition_of(log_dir.name)
    if own is not None and any(SEGMENT_NAME.match(n) for n in os.listdir(log_dir)):
        return scan_partition(log_dir, *own)
    out = []
    for entry in sorted(os.scandir(log_dir), key=lambda e: e.name):
        parsed = partition_of(entry.name) if entry.is_dir() else None
        if parsed is not None:
            out.extend(scan_partition(Path(entry.path), *parsed))
    return out


class CheckpointError(CompactdError, ValueError):
    pass


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """`cleaner-offset-checkpoint` / `log-start-offset-checkpoint`: version 0, count, `topic partition offset`.
    An empty file holds no entries: Kafka creates each checkpoint file empty when its log manager starts and writes
    the first version only when there is something to record (its own reader reads an empty file as no entries)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    if not lines:
        return {}
    if len(lines) < 2 or lines[0].strip() != "0" or not lines[1].strip().isdigit():
        raise CheckpointError(f"{path}: not a version-0 offset checkpoint")
    count = int(lines[1])
    entries = [ln for ln in lines[2:] if ln.strip()]
    if len(entries) != count:
        raise CheckpointError(f"{path}: header says {count} entries, found {len(entries)}")
    out = {}
    for ln in entries:
        parts = ln.split()
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].lstrip("-").isdigit():
            raise CheckpointError(f"{path}: bad line {ln!r}")
        out[(parts[0], int(parts[1]))] = int(parts[2])
    return out
