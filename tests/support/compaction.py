"""Histories for compaction tests: keys reused, tombstones, null keys, headers present/absent/equal, timestamps out
of order; produced to the real broker, returned as the records the broker stored (with their offsets)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from compactd.compaction.reduce import Record

# `compactd compact status TOPIC`: the contract's keys, exactly
STATUS_KEYS = frozenset(
    ("topic", "status", "generation", "horizon", "keys", "records_in", "records_out", "bytes_in", "bytes_out",
     "seconds", "error", "lineage", "lineage_why", "gaps", "gap_pending", "appended", "dirty_ratio")
)  # fmt: skip


@dataclass(frozen=True)
class Event:
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


def history(
    seed: int, n: int, keys: int, start_ts: int = 0, partitions: int = 2, header: str = "v", null_every: int = 37
) -> list[Event]:
    rnd = random.Random(seed)
    base = int(time.time() * 1000) - 600_000 + start_ts  # recent: the broker's time retention keeps them
    out = []
    for i in range(n):
        p = rnd.randrange(partitions)
        key = None if i % null_every == 5 else b"k%d" % rnd.randrange(keys)
        value = None if rnd.random() < 0.15 else b"v%d-%d" % (seed, i)
        ts = base + rnd.randrange(-5_000, 5_000) + i  # out of order
        roll = rnd.random()
        if roll < 0.3:
            headers: tuple[tuple[str, bytes | None], ...] = ()
        elif roll < 0.4:
            headers = ((header, (7).to_bytes(8, "big")),)  # equal versions: ties go to the higher offset
        else:
            headers = ((header, rnd.randrange(-50, 50).to_bytes(8, "big", signed=True)),)
        out.append(Event(p, key, value, ts, headers))
    return out


def produce(cluster, topic: str, events: list[Event], partitions: int = 2) -> dict[int, list[Record]]:
    """Send `events` in order; per partition, the records as stored (offsets from the delivery reports)."""
    from confluent_kafka import Producer

    stored: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    producer = Producer(cluster.conn.client("producer", {"enable.idempotence": True, "linger.ms": 5}))

    def on_delivery(err, msg, ev: Event) -> None:
        assert err is None, err
        stored[msg.partition()].append(Record(msg.offset(), ev.timestamp, ev.key, ev.value, ev.headers))

    for ev in events:
        producer.produce(
            topic,
            key=ev.key,
            value=ev.value,
            partition=ev.partition % partitions,
            timestamp=ev.timestamp,
            headers=list(ev.headers),
            on_delivery=lambda err, msg, ev=ev: on_delivery(err, msg, ev),
        )
    assert producer.flush(30) == 0
    for recs in stored.values():
        recs.sort(key=lambda r: r.offset)
    return stored


def last_record_wins(records: Iterable[Record]) -> dict[bytes, bytes]:
    """What a plain reader of a compacted topic holds (a KTable, a Connect sink, ksqlDB): per key, its last record in
    log order; a key whose last record is a tombstone is deleted. Records without a key are no key."""
    held: dict[bytes, bytes | None] = {}
    for r in records:
        if r.key is not None:
            held[r.key] = r.value
    return {k: v for k, v in held.items() if v is not None}


def read_plain(cluster, topic: str, timeout_s: float = 30.0) -> dict[int, list[Record]]:
    """Every record of `topic` from its log start to its end, per partition, read as any Kafka consumer reads a
    compacted topic (a KTable's restore, a Connect sink): a plain consumer from `earliest`, no compactd code."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer(
        cluster.conn.client("consumer", forced={"group.id": f"plain-{time.time_ns()}", "enable.auto.commit": False})
    )
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        marks = {p: cluster.watermarks(topic, p) for p in parts}
        ends = {p: high for p, (_, high) in marks.items()}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: dict[int, list[Record]] = {p: [] for p in parts}
        pos = {p: low - 1 for p, (low, _) in marks.items()}  # a partition emptied by deleteRecords has nothing to read
        deadline = time.monotonic() + timeout_s
        while any(pos[p] + 1 < ends[p] for p in parts):
            assert time.monotonic() < deadline, f"{topic}: read up to {pos}, the log ends at {ends}"
            for m in c.consume(1000, timeout=0.5):
                if m.error() is None:
                    out[m.partition()].append(
                        Record(m.offset(), m.timestamp()[1], m.key(), m.value(), tuple(m.headers() or ()))
                    )
                    pos[m.partition()] = m.offset()
        return out
    finally:
        c.close()


def produce_stamped(cluster, topic: str, records: list[tuple[int, bytes, bytes, int]]) -> dict[int, list[Record]]:
    """(partition, key, value, timestamp) sent by Kafka's Java producer (tests/support/jvm/StampedProducer.java),
    which writes a timestamp of 0 as 0 where librdkafka writes the time of sending; the records as stored."""
    import shutil
    import subprocess
    from pathlib import Path

    from compactd.local.broker import kafka_jars

    source = Path(__file__).parent / "jvm" / "StampedProducer.java"
    argv = [shutil.which("java") or "java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", f"{kafka_jars()}/*",
            str(source), cluster.bootstrap, topic]  # fmt: skip
    lines = "".join(f"{p} {k.decode()} {v.decode()} {ts}\n" for p, k, v, ts in records)
    proc = subprocess.run(argv, input=lines, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the Java producer failed: {(proc.stdout + proc.stderr)[-800:]}"
    offsets = [int(x) for x in proc.stdout.split()]
    out: dict[int, list[Record]] = {}
    for (p, k, v, ts), offset in zip(records, offsets, strict=True):
        out.setdefault(p, []).append(Record(offset, ts, k, v))
    return out


class Killed(BaseException):
    """A run that dies where its `on_phase` names, as a kill -9 there (nothing in the run catches it)."""


def run_killed_after_writing(comp: Any, topic: str, overrides: Any) -> None:
    """A compaction run that dies once it has written the view, before it publishes (what a kill -9 of the job then
    leaves: the dead run's records in the view topic, the manifest unchanged)."""
    import pytest

    def killed(phase: str) -> None:
        if phase == "written":
            raise Killed(phase)

    with pytest.raises(Killed):
        comp.run(topic, overrides, killed)
