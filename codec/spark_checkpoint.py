"""A Spark Structured Streaming checkpoint's Kafka positions: what a query has read, for consumed retention.

Spark's Kafka source commits nothing to Kafka; its progress is the checkpoint. `offsets/<N>` is written before batch
N runs (the write-ahead log: line 1 a version, line 2 the batch metadata, then one line per source, `-` for a source
with no offset yet) and `commits/<N>` once batch N is done. A Kafka source's line is `{"topic": {"partition":
next offset}}`: the end, exclusive, of what the batch read. So the position of the query is the offsets of the latest
batch with a commit: everything below it is processed, and a restart resumes there. Pure: file names and texts in,
positions out; control/readers.py reads the files.
"""

from __future__ import annotations

import json

from compactd.errors import DecodeError

Positions = dict[str, dict[int, int]]  # topic -> partition -> next offset to read


def latest_batch(commit_names: list[str], offset_names: list[str]) -> int | None:
    """The latest batch with both an offsets file and a commit (Spark's own files are named by the batch number;
    checksums, temporary and other files are not batches)."""
    done = {int(n) for n in commit_names if n.isdigit()} & {int(n) for n in offset_names if n.isdigit()}
    return max(done) if done else None


def kafka_positions(offsets_text: str) -> Positions:
    """The Kafka positions in an `offsets/<N>` file, merged over the query's Kafka sources (the lowest per partition:
    each source is a reader of its own). A line that is not a Kafka source's offset (another source, `-`) is
    skipped; a file that is not an offset log at all is an error."""
    lines = offsets_text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise DecodeError("not a Spark offset log file (no version line)")
    out: Positions = {}
    for line in lines[2:]:
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if not isinstance(source, dict) or not all(isinstance(v, dict) for v in source.values()):
            continue
        try:
            parsed = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in source.items()}
        except (TypeError, ValueError):
            continue
        for topic, parts in parsed.items():
            mine = out.setdefault(topic, {})
            for p, o in parts.items():
                if o >= 0:
                    mine[p] = min(o, mine.get(p, o))
    return out
