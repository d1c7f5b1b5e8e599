"""What every compaction nudge replaced, kept on a compacted Kafka topic, so that a nudge is put back whatever
happens to Redis (before: a flush while a nudge was on left `max.compaction.lag.ms=1` on a topic for good).

Redis keeps the working copy (`NudgeMemory`); this topic is the copy a state loss cannot take. An entry is written,
and acknowledged, before the topic's config is altered, and removed (a tombstone) only after the original is back:
a crash between any two steps leaves an entry whose restore is harmless to repeat. Kafka refuses unknown topic
configs, so the marker cannot live on the nudged topic itself.

Key `<topic>|<config key>`; value `{"topic", "key", "original" (null: the broker's default), "value", "at"}`.

The same topic keeps the other thing a state loss must not take: each topic's last reset (a re-created topic,
control/identity.py), key `reset/<topic>` ('/' is in no topic name), value `{"topic", "at", "why", "positions":
{source topic: {partition: offset}}}`: where the sources stood when the reset dropped what their earlier events had
built. A rebuild reads the sources again from their start and drops those events too (streaming/decode.py).

And the topic ID each topic's state is bound to (control/identity.py), key `id/<topic>`, value `{"topic", "id"}`
(a tombstone once the topic is forgotten): a rebuild binds its empty state to them before it reads the sources
again, so that a topic re-created while nothing watched is found stale instead of taken for its old log.

And each retention takeover of the compaction service (compaction/takeover.py), key `takeover/<topic>`, value
`{"topic", "original" (null: the broker's default), "applies_ms", "at"}`: written before the topic's retention.ms is
set to -1, removed once the original is back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from compactd.kafka.config import KafkaConnection
from compactd.kafka.reader import read_to_end
from compactd.kafka.writer import JsonTopicWriter
from compactd.model import Nudge

RESET = "reset/"
TOPIC_ID = "id/"
TAKEOVER = "takeover/"


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

    def record_reset(self, topic: str, at: int, why: str, positions: dict[str, dict[str, int]]) -> None:
        """A topic's state was reset at these source positions (durable before the caller goes on)."""
        value = {"topic": topic, "at": at, "why": why, "positions": positions}
        self._writer.write(f"{RESET}{topic}", value)
        self._writer.flush(self.timeout_s)

    def record_ids(self, ids: Mapping[str, str | None]) -> None:
        """The incarnations topics' state is bound to (None: forgotten), durable before Redis records them."""
        for topic, topic_id in ids.items():
            self._writer.write(f"{TOPIC_ID}{topic}", None if topic_id is None else {"topic": topic, "id": topic_id})
        self._writer.flush(self.timeout_s)

    def load_ids(self) -> dict[str, str]:
        """topic -> the topic ID its state was last bound to."""
        return {
            value["topic"]: value["id"]
            for key, value in self._live().items()
            if key.startswith(TOPIC_ID.encode()) and isinstance(value, dict) and isinstance(value.get("id"), str)
        }

    def record_takeover(self, topic: str, value: dict[str, Any]) -> None:
        """What a retention takeover replaced (durable before the alter it describes)."""
        self._writer.write(f"{TAKEOVER}{topic}", value)
        self._writer.flush(self.timeout_s)

    def clear_takeover(self, topic: str) -> None:
        self._writer.write(f"{TAKEOVER}{topic}", None)
        self._writer.flush(self.timeout_s)

    def load_takeovers(self) -> dict[str, dict[str, Any]]:
        """topic -> the takeover record the topic holds for it, as `record_takeover` wrote it (compaction/takeover.py
        reads it back: the ledger keeps records, it does not know the compaction service's types)."""
        out = {}
        for key, value in self._live().items():
            if key.startswith(TAKEOVER.encode()) and isinstance(value, dict):
                out[key.decode()[len(TAKEOVER) :]] = value
        return out

    def load(self) -> list[Nudge]:
        """Every nudge not yet put back, as the topic holds them (last record per key; a tombstone removes it)."""
        out = []
        for key, value in self._live().items():
            try:
                if not key.startswith((RESET.encode(), TAKEOVER.encode())):
                    out.append(msgspec.convert(value, Nudge))
            except msgspec.ValidationError:
                continue  # not ours: a record someone else wrote to the topic
        return out

    def load_resets(self) -> dict[str, dict[str, Any]]:
        """topic -> its last reset: {"at", "why", "positions"}."""
        return {
            value["topic"]: value
            for key, value in self._live().items()
            if key.startswith(RESET.encode()) and isinstance(value, dict) and "positions" in value
        }

    def _live(self) -> dict[bytes, Any]:
        """The topic's records, the last per key (a tombstone removes it), as JSON."""
        live: dict[bytes, Any] = {}
        for key, value in read_to_end(self.conn, self.topic, self.timeout_s * 3):
            if key is None:
                continue
            if value is None:
                live.pop(key, None)
                continue
            try:
                live[key] = json.loads(value)
            except ValueError:
                continue
        return live

    def close(self) -> None:
        self._writer.close()


class LifecycleRecords:
    """The ledger as control/identity.py's `Records`: a reset is recorded with where the sources stand
    (`positions()`: the planned end of the latest batch)."""

    def __init__(self, ledger: NudgeLedger, positions: Callable[[], dict[str, dict[str, int]]]) -> None:
        self.ledger = ledger
        self.positions = positions

    def record_reset(self, topic: str, why: str, now: int) -> None:
        self.ledger.record_reset(topic, now, why, self.positions())

    def record_ids(self, ids: Mapping[str, str | None]) -> None:
        self.ledger.record_ids(ids)

    def forget_nudges(self, topic: str) -> None:
        """Every nudge of the topic the ledger holds goes (Redis lost them with the topic's state already)."""
        for nudge in self.ledger.load():
            if nudge.topic == topic:
                self.ledger.clear(topic, nudge.key)
