"""Dead-letter queue: rejected input with its reason and the original bytes (base64)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Producer

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
    def __init__(self, bootstrap_servers: str, topic: str, extra: Mapping[str, str] | None = None) -> None:
        self.topic = topic
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5, **(extra or {})})

    def publish(self, rows: Iterable[Mapping[str, Any]], now: int) -> int:
        """Send and wait: a batch is merged only after its rejects are durable, so nothing is lost."""
        n = 0
        for row in rows:
            record = dlq_record(row, now)
            self._producer.produce(self.topic, key=row.get("raw_key"), value=json.dumps(record).encode())
            n += 1
        if n and self._producer.flush(30):
            raise RuntimeError("DLQ records not delivered within 30s")
        return n

    def close(self) -> None:
        self._producer.flush(30)
        del self._producer
