"""Bounded reads of one partition's offset range with confluent-kafka, for compactd's compaction service (its reads of
the source and of the previous view) and the benchmarks' bare reader.

The stream does not read through here: Spark's Kafka connector reads it (streaming/job.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from compactd.errors import SourceReadError
from compactd.kafka.config import KafkaConnection, KafkaValue

# Reader tuning: a broker may answer a fetch with a large part of a partition's backlog, so the receive
# limit is raised; reads are bounded ranges, not long polls (short broker waits, deep prefetch queue, no refetch
# backoff). Users' `kafka.*` options override each of these.
READER_DEFAULTS: dict[str, KafkaValue] = {
    "receive.message.max.bytes": 1_000_000_000,
    "fetch.wait.max.ms": 10,
    "queued.min.messages": 1_000_000,
    # librdkafka backs off 1 s (default) before refetching once its queue is "full enough": a stall per range read
    "fetch.queue.backoff.ms": 10,
}
# ... but not this: records written inside transactions count only once committed, whatever the user's `kafka:` says
# (an aborted record, a key's highest offset, won the view on the Python path under a user's read_uncommitted:
# issue 64). The JVM path forces the same (ViewRun.java).
COMMITTED_ONLY: dict[str, KafkaValue] = {"isolation.level": "read_committed"}


def reader_conf(conn: KafkaConnection, forced: dict[str, Any] | None = None) -> dict[str, Any]:
    """The librdkafka settings of a bounded range reader: READER_DEFAULTS, the user's settings, COMMITTED_ONLY."""
    return conn.client("consumer", READER_DEFAULTS, forced={**COMMITTED_ONLY, **(forced or {})})


@dataclass(frozen=True)
class KafkaRange:
    """Offsets [start, end) of one partition."""

    topic: str
    partition: int
    start: int
    end: int


def read_messages(
    conf: dict[str, Any], rng: KafkaRange, stall_ms: int, chunk: int = 100_000, strict: bool = False
) -> Iterator[list]:
    """Read offsets [start, end) of one partition: lists of up to `chunk` confluent-kafka messages, in log order.

    Offsets may be missing inside the range (compaction, transaction markers), so the loop ends on the
    consumer position, not on a message count. A read whose position moves no further for `stall_ms` fails the task
    (Spark retries it, and nothing is silently skipped); a range that keeps moving takes as long as it needs (1M
    offsets of 10 KB records outlast any deadline on the whole range). Per message only what Kafka itself costs:
    callers take the fields they need with one comprehension each.

    `strict`: offsets of the range deleted before they are read fail the read (a compaction must never skip records
    the source's retention took: what they replaced or deleted would come back); otherwise the read goes on from the
    log start, as a stream does.
    """
    from confluent_kafka import KafkaError, TopicPartition

    from compactd.kafka.config import new_consumer

    # a private group id: progress lives in Spark's checkpoint, nothing is committed
    consumer = new_consumer(
        {
            **conf,
            "group.id": f"compactd-read-{uuid.uuid4()}",
            "auto.offset.reset": "error" if strict else "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    pending: list = []
    progressed = time.monotonic()
    position = rng.start
    try:
        while position < rng.end:
            if time.monotonic() - progressed > stall_ms / 1000:
                raise SourceReadError(
                    f"{rng.topic}/{rng.partition}: read stalled at {position} of [{rng.start},{rng.end}): "
                    f"no progress for {stall_ms} ms"
                )
            before = position
            # consume() waits for num_messages or the timeout: never ask for more than the range still holds (an
            # end-of-partition event also counts), or every task pays the whole timeout on its last call
            msgs = consumer.consume(num_messages=max(1, min(10_000, rng.end - position)), timeout=0.5)
            good = [m for m in msgs if m.error() is None]
            if len(good) != len(msgs):
                for m in msgs:
                    err = m.error()
                    if err is None:
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise SourceReadError(
                            f"{rng.topic}/{rng.partition}: offsets from {position} were deleted before they were read "
                            "(the topic's retention, or a deleteRecords)"
                        )
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise SourceReadError(f"{rng.topic}/{rng.partition}: {err.str()}")
                    position = max(position, m.offset())
            if good:
                if good[-1].offset() >= rng.end:
                    good = [m for m in good if m.offset() < rng.end]
                    position = rng.end
                else:
                    position = good[-1].offset() + 1
                pending.extend(good)
                if len(pending) >= chunk:
                    yield pending
                    pending = []
            if not msgs:
                pos = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
                if pos >= 0:
                    position = max(position, pos)
            if position > before:
                progressed = time.monotonic()
        if pending:
            yield pending
    finally:
        consumer.close()
