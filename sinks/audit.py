"""Audit log: every decision, dry-run or not, as one JSON record on the actions topic."""

from __future__ import annotations

from compactd.kafka.config import KafkaConnection
from compactd.kafka.writer import JsonTopicWriter
from compactd.keys import partition_key
from compactd.model import ActionRecord


class AuditLog:
    """At-least-once: a crash between send and outbox completion repeats a record with the same `id`."""

    def __init__(self, conn: KafkaConnection, topic: str, timeout_s: float = 30.0, cluster: str = "default") -> None:
        self.topic = topic
        self.cluster = cluster
        self.timeout_s = timeout_s
        self._writer = JsonTopicWriter(conn, topic, {"enable.idempotence": False}, what="action records")

    def start(self) -> None:
        self._writer.start()

    def publish(self, rec: ActionRecord) -> None:
        self._writer.write(partition_key(rec.topic, rec.partition), {**rec.audit(), "cluster": self.cluster})

    def flush(self, timeout_s: float | None = None) -> None:
        self._writer.flush(self.timeout_s if timeout_s is None else timeout_s)

    def close(self) -> None:
        self._writer.close()
