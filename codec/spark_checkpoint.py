"""A Spark Structured Streaming checkpoint's Kafka positions: what a query has read, for consumed retention.

Spark's Kafka source commits nothing to Kafka; its progress is the checkpoint. `offsets/<N>` is written before batch
N runs (the write-ahead log: line 1 a version, line 2 the batch metadata, then one line per source, `-` for a source
with no offset yet) and `commits/<N>` once batch N is done. A Kafka source's line is `{"topic": {"partition":
next offset}}`: the end, exclusive, of what the batch read. So the position of the query is the offsets of the latest
batch with a commit: everything below it is processed, and a restart resumes there. Pure: file names and texts in,
positions out; control/readers.py reads the files.

Two formats (Spark 4.2's `OffsetSeqLog`): `v1` lists the sources in query order, one JSON offset a line; `v2`
(`spark.sql.streaming.offsetLog.formatVersion=2`, `OffsetMap`) writes `<source name>:<offset JSON>` a line, names
from `.name(...)` on the source. A position read wrong lets a delete pass the reader, so anything else is an error
(the reader is blind and holds), never "no position": another version, a line that is not JSON, a Kafka-shaped
offset whose partitions or offsets are not integers.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from compactd.errors import DecodeError

Positions = dict[str, dict[int, int]]  # topic -> partition -> next offset to read


class Checkpoint(NamedTuple):
    """A query's latest committed batch: its number and its Kafka positions."""

    batch: int
    positions: Positions


def latest_batch(commit_names: list[str], offset_names: list[str]) -> int | None:
    """The latest batch with both an offsets file and a commit (Spark's own files are named by the batch number;
    checksums, temporary and other files are not batches)."""
    done = {int(n) for n in commit_names if n.isdigit()} & {int(n) for n in offset_names if n.isdigit()}
    return max(done) if done else None


def latest_planned(offset_names: list[str]) -> int | None:
    """The latest batch with an offsets file, committed or not: planned, so possibly running."""
    planned = [int(n) for n in offset_names if n.isdigit()]
    return max(planned) if planned else None


def _source_lines(lines: list[str]) -> list[str]:
    """The offset JSON of each source, by the file's version; an unknown version is an error."""
    version = lines[0].strip()
    if version == "v1":
        return lines[2:]
    if version == "v2":
        out = []
        for line in lines[2:]:
            name, colon, offset = line.partition(":")
            if not colon or not name:
                raise DecodeError(f"offset log v2: a line is not <source>:<offset>: {line[:80]!r}")
            out.append(offset)
        return out
    raise DecodeError(f"unknown Spark offset log version {version[:20]!r} (read: v1, v2)")


def kafka_positions(offsets_text: str) -> Positions:
    """The Kafka positions in an `offsets/<N>` file, merged over the query's Kafka sources (the lowest per partition:
    each source is a reader of its own). A source with no offset yet (`-`) and another kind of source's offset (a
    file source's `{"logOffset": 4}`, a rate source's number) are skipped; what cannot be read at all raises."""
    lines = offsets_text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise DecodeError("not a Spark offset log file (no version line)")
    out: Positions = {}
    for line in _source_lines(lines):
        if line.strip() == "-":
            continue
        try:
            source = json.loads(line)
        except ValueError:
            raise DecodeError(f"a source's offset is not JSON: {line[:80]!r}") from None
        if not isinstance(source, dict) or not source or not all(isinstance(v, dict) for v in source.values()):
            continue  # not a Kafka source's {topic: {partition: offset}}
        try:
            parsed = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in source.items()}
        except (TypeError, ValueError):
            raise DecodeError(f"a Kafka source's offset is not partitions and offsets: {line[:80]!r}") from None
        for topic, parts in parsed.items():
            mine = out.setdefault(topic, {})
            for p, o in parts.items():
                if o >= 0:
                    mine[p] = min(o, mine.get(p, o))
    return out
