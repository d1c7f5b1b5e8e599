"""Dead-letter queue: rejected input with its reason and the original bytes (base64)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

from compactd.kafka.config import KafkaConnection
from compactd.kafka.writer import JsonTopicWriter

# Keep DLQ records well under a broker's default message.max.bytes even for oversized input.
MAX_DLQ_VALUE_BYTES = 256 * 1024


def dlq_record(row: Mapping[str, Any], now: int) -> dict[str, Any]:
    raw_value: bytes | None = row.get("raw_value")
    raw_key: bytes | None = row.get("raw_key")
    truncated = raw_value is not None and len(raw_value) > MAX_DLQ_VALUE_BYTES
    return {
        "reason": row["error"],
        "message": row.get("message"),
        "stream": row.get("stream"),
        "source_topic": row["src_topic"],
        "source_partition": row["src_partition"],
        "source_offset": row["src_offset"],
        "key_b64": None if raw_key is None else base64.b64encode(raw_key).decode(),
        "value_b64": None if raw_value is None else base64.b64encode(raw_value[:MAX_DLQ_VALUE_BYTES]).decode(),
        "value_truncated": truncated,
        "value_size": None if raw_value is None else len(raw_value),
        "rejected_at": now,
    }


class DeadLetters:
    def __init__(self, conn: KafkaConnection, topic: str, cluster: str = "default") -> None:
        self.topic = topic
        self.cluster = cluster
        self._writer = JsonTopicWriter(conn, topic, what="DLQ records")

    def start(self) -> None:
        self._writer.start()

    def publish(self, rows: Iterable[Mapping[str, Any]], now: int) -> int:
        """Send and wait: a batch is merged only after its rejects are durable, so nothing is lost."""
        n = 0
        for row in rows:
            self._writer.write(row.get("raw_key"), {**dlq_record(row, now), "cluster": self.cluster})
            n += 1
        if n:
            self._writer.flush(30)
        return n

    def close(self) -> None:
        self._writer.close()
