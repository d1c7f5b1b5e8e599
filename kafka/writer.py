"""One JSON topic writer for everything compactd produces: audit records, DLQ records, segment events.

The producer is created on the first write (constructors only configure). `flush` waits for every record's
delivery report and raises `DeliveryTimeout` if any is missing or refused, so callers only move on (leave the
outbox, merge a batch) once what they wrote is durable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from compactd.errors import DeliveryTimeout
from compactd.kafka.config import KafkaConnection, KafkaValue, new_producer


class JsonTopicWriter:
    def __init__(
        self, conn: KafkaConnection, topic: str, defaults: Mapping[str, KafkaValue] | None = None, what: str = "records"
    ) -> None:
        self.conn = conn
        self.topic = topic
        self.what = what
        self._defaults = dict(defaults or {})
        self._producer: Any = None
        self._failed: list[str] = []

    def start(self) -> None:
        if self._producer is None:
            self._producer = new_producer(self.conn.client("producer", self._defaults))

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._failed.append(str(err))

    def write(self, key: str | bytes | None, value: Mapping[str, Any] | None) -> None:
        """One record; `value` None writes a tombstone (a compacted topic then forgets the key)."""
        self.start()
        raw = None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
        k = key.encode() if isinstance(key, str) else key
        while True:
            try:
                self._producer.produce(self.topic, key=k, value=raw, on_delivery=self._delivered)
                return
            except BufferError:  # local queue full: let deliveries drain, then try again
                self._producer.poll(0.1)

    def flush(self, timeout_s: float = 30.0) -> None:
        if self._producer is None:
            return
        left = self._producer.flush(timeout_s)
        failed, self._failed = self._failed, []
        if left:
            raise DeliveryTimeout(f"{left} {self.what} not delivered to {self.topic} within {timeout_s:g}s")
        if failed:
            raise DeliveryTimeout(f"{len(failed)} {self.what} refused by {self.topic}: {failed[0]}")

    def close(self) -> None:
        """Deliver what is queued, then let librdkafka destroy the handle (and its broker connections)."""
        try:
            self.flush()
        finally:
            self._producer = None
