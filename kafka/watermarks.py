"""A partition's watermarks, asked of its leader, through a moment of leadership change.

Apache Kafka answers a ListOffsets with NOT_LEADER_OR_FOLLOWER or LEADER_NOT_AVAILABLE while a partition's leader is
being elected: right after the topic is created, and while a broker restarts. The answer a moment later is the real
one, so those errors are asked again until the caller's timeout; any other error is the caller's to judge.

A caller that has just created the topic asks with `newborn_s` (NEWBORN_S): UNKNOWN_TOPIC_OR_PART is then asked
again for that long. On a KRaft cluster each broker learns a new topic from the metadata log on its own, so a client
told the topic's leader by one broker can reach that leader before it has applied the record and be answered
"unknown" (three nodes, CI: the first compaction run's view writer, a moment after the view was created). Kafka's
Java client takes the error as retriable for the same reason. Every other caller takes "unknown" at once: the topic
is gone (a delete aimed at each partition of a deleted topic must not wait 10 s apiece).
"""

from __future__ import annotations

import time
from typing import Any

# librdkafka's names for the leadership errors of KIP-320 / KIP-392 and their older forms
LEADER_MOVING = frozenset(
    {
        "NOT_LEADER_FOR_PARTITION",
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "OFFSET_NOT_AVAILABLE",
    }
)

# The errors of a client whose metadata no longer matches the cluster: a leader moving, and what librdkafka answers
# from a cache that still names a dead or moved broker. On three nodes it answered "Local: Unknown partition" for
# minutes after a restart, FENCED_LEADER_EPOCH for 150 s, and "No leaders found" (_NOENT) after a kill: a client that
# meets one of these is made again (sinks/kafka_admin.py). "Broker handle destroyed" (_DESTROY_BROKER) is a request
# that was waiting on a node the client has just dropped from its metadata (a node that stopped).
STALE_METADATA = LEADER_MOVING | {
    "_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_NOENT",
    "_DESTROY_BROKER",
}  # fmt: skip

UNKNOWN = "UNKNOWN_TOPIC_OR_PART"
NEWBORN_S = 10.0  # how long "unknown" may mean "not applied yet" (KRaft brokers apply a new topic within ms)


def _again(name: str, started: float, deadline: float, newborn_s: float) -> bool:
    """Whether an error named `name`, seen now, is asked again."""
    now = time.monotonic()
    if now >= deadline:
        return False
    return name in LEADER_MOVING or (name == UNKNOWN and now - started < newborn_s)


def watermarks(consumer: Any, topic: str, partition: int, timeout_s: float, newborn_s: float = 0.0) -> tuple[int, int]:
    """(low, high) of `topic`/`partition`; raises KafkaException as the client does once `timeout_s` is spent or
    for an error that is not a leader moving (nor, for `newborn_s`, an unknown topic: see the module's doc)."""
    from confluent_kafka import KafkaException, TopicPartition

    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        left = max(deadline - time.monotonic(), 0.1)
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=left, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            if not _again(exc.args[0].name(), started, deadline, newborn_s):
                raise
            time.sleep(0.1)


def list_offsets(
    admin: Any,
    request: dict[Any, Any],
    isolation_level: Any,
    timeout_s: float,
    epochs: dict[Any, int] | None = None,
    newborn_s: float = 0.0,
) -> dict[Any, int]:
    """ListOffsets through the Admin API, {TopicPartition: OffsetSpec} -> {TopicPartition: offset}; the partitions
    whose leader is being elected are asked again until `timeout_s` (any other error raises KafkaException).
    `epochs`, when given, gets each answer's leader epoch (-1: none): for a latest offset, the partition's leader
    epoch now."""
    from confluent_kafka import KafkaException

    started = time.monotonic()
    deadline = started + timeout_s
    out: dict[Any, int] = {}
    pending = dict(request)
    while pending:
        futures = admin.list_offsets(pending, isolation_level=isolation_level, request_timeout=timeout_s)
        again = {}
        for tp, fut in futures.items():
            try:
                got = fut.result(timeout=timeout_s)
                out[tp] = got.offset
                if epochs is not None:
                    epochs[tp] = got.leader_epoch if got.leader_epoch is not None else -1
            except KafkaException as exc:
                if not _again(exc.args[0].name(), started, deadline, newborn_s):
                    raise
                again[tp] = pending[tp]
        pending = again
        if pending:
            time.sleep(0.1)
    return out
