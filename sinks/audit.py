"""Audit log: every decision, dry-run or not, as one JSON record on the actions topic."""

from __future__ import annotations

import json
from collections.abc import Mapping

from confluent_kafka import Producer

from policy.model import ActionRecord


class AuditLog:
    """At-least-once: a crash between send and outbox completion repeats a record with the same `id`."""

    def __init__(self, bootstrap_servers: str, topic: str, extra: Mapping[str, str] | None = None) -> None:
        self.topic = topic
        self._producer: Producer | None = Producer(
            {"bootstrap.servers": bootstrap_servers, "enable.idempotence": False, "linger.ms": 5, **(extra or {})}
        )

    def publish(self, rec: ActionRecord) -> None:
        assert self._producer is not None, "audit log is closed"
        self._producer.produce(
            self.topic,
            key=f"{rec.topic}/{rec.partition}".encode(),
            value=json.dumps(rec.audit(), sort_keys=True, separators=(",", ":")).encode(),
        )

    def flush(self, timeout: float = 30.0) -> None:
        left = self._producer.flush(timeout) if self._producer is not None else 0
        if left:
            raise RuntimeError(f"audit log: {left} action records not delivered within {timeout}s")

    def close(self) -> None:
        """Deliver what is queued, then let librdkafka destroy the handle (and its broker connections)."""
        self.flush()
        self._producer = None
