"""The fast decode (Arrow blocks, reduced in the decode tasks) and the reference decode (record by record), both over
the rows Spark's Kafka connector reads, reduce the same corpus to the same changes, DLQ rows and counts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from compactd.streaming.aggregate import Collected
from compactd.streaming.connector import java_options
from compactd.streaming.decode import Decoder
from compactd.streaming.job import StreamingJob, StreamSpec

pytestmark = pytest.mark.spark


def corpus(topic: str, rnd: random.Random) -> list[tuple[int, bytes | None]]:
    """(source partition, value): commits, deletes, segments, cleaner and log-start events, and bad records."""
    out: list[tuple[int, bytes | None]] = []
    for i in range(3000):
        part, group, p = rnd.randrange(3), f"g{rnd.randrange(4)}", rnd.randrange(5)
        roll = rnd.random()
        if roll < 0.5:
            ev = {"type": "offset_commit", "group": group, "topic": topic, "partition": p, "offset": i, "ts": i}
        elif roll < 0.55:
            ev = {"type": "offset_delete", "group": group, "topic": topic, "partition": p, "ts": i}
        elif roll < 0.57:
            ev = {"type": "group_delete", "group": group, "ts": i}
        elif roll < 0.75:
            base = rnd.randrange(4) * 100
            ev = {
                "type": "segment_rolled",
                "topic": topic,
                "partition": p,
                "base_offset": base,
                "end_offset": base + 100,
                "first_batch_max_ts": i,
                "size_bytes": 1,
                "ts": i,
            }
        elif roll < 0.85:
            kind, field = rnd.choice([("compacted", "cleaned_up_to"), ("log_start", "log_start_offset")])
            ev = {"type": kind, "topic": topic, "partition": p, field: i, "ts": i}
        elif roll < 0.9:
            out.append((part, b"{not json"))
            continue
        elif roll < 0.95:
            ev = {"type": "offset_commit", "group": group, "topic": topic, "partition": p, "offset": -5, "ts": i}
        else:
            out.append((part, None))
            continue
        out.append((part, json.dumps(ev).encode()))
    return out


def normalised(c: Collected) -> dict:
    changes = {
        t: {
            "segments": sorted((p, s.base_offset, s.end_offset, s.first_batch_max_ts) for p, s in tc.segments),
            "compacted": sorted(tc.compacted),
            "log_start": sorted(tc.log_start),
            "offsets": sorted(tc.offsets, key=repr),
        }
        for t, tc in c.changes.topics.items()
    }
    rejected = sorted((r["src_topic"], r["src_partition"], r["src_offset"], r["error"]) for r in c.rejected)
    return {
        "changes": changes,
        "group_deletes": sorted(c.changes.group_deletes),
        "rejected": rejected,
        "counts": dict(c.counts),
    }


def test_fast_decode_equals_the_reference_decode(spark, cluster, job_settings, tmp_path: Path) -> None:
    s = job_settings()
    data = cluster.name("data")
    # segments and commits interleaved over three partitions of each compactd topic
    for name in (s.topics.segments, s.topics.commits):
        cluster.create(name, 3)
    rnd = random.Random(11)
    for part, value in corpus(data, rnd):
        is_segment = value is not None and b'"group"' not in value and b"group_delete" not in value
        cluster.send_raw(s.topics.segments if is_segment else s.topics.commits, value, b"k", part)
    cluster.flush()

    def run(reference: bool) -> dict:
        got: list[Collected] = []
        spec = StreamSpec(
            kafka_options=java_options(s.kafka_connection()),
            topics=[s.topics.segments, s.topics.commits],
            decoder=Decoder(s.topics.segments, s.topics.commits),
            checkpoint=tmp_path / f"ckpt-{reference}",
            max_rows_per_trigger=1_000_000,
            reference=reference,
        )
        job = StreamingJob(spec, spark, lambda batch: got.append(batch.collected))
        job.start(once=True).awaitTermination()
        assert len(got) == 1
        return normalised(got[0])

    fast, reference = run(False), run(True)
    assert fast == reference
    assert sum(fast["counts"].values()) == 3000 and len(fast["rejected"]) > 100
    assert fast["changes"][data]["offsets"] and fast["changes"][data]["compacted"]
