"""Histories for compaction tests: keys reused, tombstones, null keys, headers present/absent/equal, timestamps out
of order; produced to the real broker, returned as the records the broker stored (with their offsets)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

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
