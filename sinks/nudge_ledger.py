"""What every compaction nudge replaced, kept on a compacted Kafka topic, so that a nudge is put back whatever
happens to Redis (issue 26: a flush while a nudge was on left `max.compaction.lag.ms=1` on a topic for good).

Redis keeps the working copy (`NudgeMemory`); this topic is the copy a state loss cannot take. An entry is written,
and acknowledged, before the topic's config is altered, and removed (a tombstone) only after the original is back:
a crash between any two steps leaves an entry whose restore is harmless to repeat. Kafka refuses unknown topic
configs, so the marker cannot live on the nudged topic itself.

Key `<topic>|<config key>`; value `{"topic", "key", "original" (null: the broker's default), "value", "at"}`.
"""

from __future__ import annotations

import json

import msgspec

from compactd.kafka.config import KafkaConnection
from compactd.kafka.reader import read_to_end
from compactd.kafka.writer import JsonTopicWriter
from compactd.model import Nudge


def ledger_key(topic: str, key: str) -> str:
    return f"{topic}|{key}"


class NudgeLedger:
    def __init__(self, conn: KafkaConnection, topic: str, timeout_s: float = 10.0) -> None:
        self.conn = conn
        self.topic = topic
        self.timeout_s = timeout_s
        self._writer = JsonTopicWriter(conn, topic, {"enable.idempotence": True}, what="nudge records")

    def start(self) -> None:
        self._writer.start()

    def record(self, nudge: Nudge) -> None:
        """Durable before the alter it describes (DeliveryTimeout otherwise: the nudge is not made)."""
        self._writer.write(ledger_key(nudge.topic, nudge.key), msgspec.to_builtins(nudge))
        self._writer.flush(self.timeout_s)

    def clear(self, topic: str, key: str) -> None:
        """The original is back on the topic: forget the entry."""
        self._writer.write(ledger_key(topic, key), None)
        self._writer.flush(self.timeout_s)

    def load(self) -> list[Nudge]:
        """Every nudge not yet put back, as the topic holds them (last record per key; a tombstone removes it)."""
        live: dict[bytes, Nudge] = {}
        for key, value in read_to_end(self.conn, self.topic, self.timeout_s * 3):
            if key is None:
                continue
            if value is None:
                live.pop(key, None)
                continue
            try:
                live[key] = msgspec.convert(json.loads(value), Nudge)
            except (ValueError, msgspec.ValidationError):
                continue  # not ours: a record someone else wrote to the topic
        return list(live.values())

    def close(self) -> None:
        self._writer.close()
