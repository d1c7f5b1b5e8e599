"""Real consumer groups for the tests: a member that subscribes, reads and commits, as an application does."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition


def consume_and_commit(bootstrap: str, group: str, topic: str, upto: int, protocol: str = "classic") -> None:
    """A member of `group` (`protocol`: "classic", or "consumer" for KIP-848) subscribes to `topic` (one partition),
    reads up to `upto` from where the group stands and commits that position, then leaves."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": protocol,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([topic])
        position, deadline = -1, time.monotonic() + 60
        while position + 1 < upto:
            assert time.monotonic() < deadline, f"{group} did not read {topic} up to {upto}"
            for m in c.consume(100, timeout=0.5):
                if m.error() is None and m.offset() < upto:
                    position = max(position, m.offset())
        c.commit(offsets=[TopicPartition(topic, 0, upto)], asynchronous=False)
    finally:
        c.close()
