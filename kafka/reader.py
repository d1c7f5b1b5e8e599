"""Read a small topic from its start to its high watermark (the config topic, for `compactd config set`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from compactd.errors import DeliveryTimeout
from compactd.kafka.config import KafkaConnection, new_consumer
from compactd.kafka.watermarks import watermarks


def reader(conn: KafkaConnection) -> Any:
    """A consumer for `read_to_end`: a private group, nothing committed, read_committed.

    `fetch.wait.max.ms` 10: at a partition's end the broker holds a fetch that long for new records, and the next
    read on this consumer waits for it first (one fetch in flight per broker). At the default 500 ms a run's manifest
    read, 0.3 s after the one before, waited 0.18 s."""
    return new_consumer(
        conn.client(
            "consumer",
            {"isolation.level": "read_committed", "fetch.wait.max.ms": 10},
            forced={"group.id": f"compactd-{uuid.uuid4()}"},
        )
    )


def read_to_end(
    conn: KafkaConnection, topic: str, timeout_s: float = 30.0, tail: int | None = None, consumer: Any = None
) -> Iterator[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record, partition by partition; a topic that does not exist yet has none. `tail`: only
    the last that many offsets of each partition (the newest marks of a topic that grows by one per poll).
    `consumer`: one of `reader`'s, kept open by the caller across reads (a new one connects first: 0.04 to 0.06 s)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    own = consumer is None
    consumer = reader(conn) if own else consumer
    try:
        md = consumer.list_topics(timeout=timeout_s).topics.get(topic)
        if md is None or md.error is not None:
            return
        deadline = time.monotonic() + timeout_s
        for p in sorted(md.partitions):
            low, high = watermarks(consumer, topic, p, timeout_s)
            if tail is not None:
                low = max(low, high - tail)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low if tail is not None else OFFSET_BEGINNING)])
            position = low
            while position < high:
                if time.monotonic() > deadline:
                    raise DeliveryTimeout(f"{topic}[{p}] not read to its end within {timeout_s:g}s")
                # consume() waits for all it asked for or the timeout: ask for no more than the partition holds
                for msg in consumer.consume(max(1, min(1000, high - position)), timeout=0.5):
                    if msg.error() is None:
                        position = msg.offset() + 1
                        yield msg.key(), msg.value()
    finally:
        if own:
            consumer.close()
        else:
            consumer.unassign()
