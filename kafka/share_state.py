"""Share groups' positions, read from `__share_group_state` (KIP-932), for consumed retention.

A share group's progress never reaches `__consumer_offsets`; the share coordinator keeps it in its own compacted
internal topic, keyed by (group, topic ID, partition). This tail reads that topic from its start once, then on each
`read()` up to the end it has now, and keeps per share-partition the latest snapshot with the updates after it. A
position is the offset below which every record is acknowledged or archived (codec/share_state.py `advance`); a
share-partition not initialized yet has none (unknown: it holds the partition).

What the tail cannot see it says: the topic not readable (ACLs: Describe and Read on `__share_group_state`), or
not read to its end in time. Then every share group is blind, and the caller holds consumed retention on every
topic (a share group may read any of them). A cluster where `__share_group_state` does not exist has never had a
share group with state: nothing to hold.

The share coordinator prunes its topic (deleteRecords below its latest snapshots). A tail whose next fetch falls
below the new log start reads that partition again from its start, its state from there dropped first: jumping to
the end would skip snapshots (done ranges of an older state epoch kept) and tombstones (a deleted share group held
for ever).

Topic IDs are named through DescribeTopics (kafka/topics.py); an ID no topic has any more is a deleted topic's
state, which holds nothing, and it is asked again every NAMES_TTL_S (a topic the cluster did not show yet is not a
deleted one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from compactd.codec.share_state import SNAPSHOT, advance, decode_key, decode_value
from compactd.errors import DecodeError
from compactd.kafka.config import KafkaConnection, new_consumer
from compactd.kafka.topics import ClusterTopics
from compactd.policy.identity import topic_id_bytes

log = logging.getLogger("compactd.readers")

STATE_TOPIC = "__share_group_state"
# after a naming round, IDs it did not find are asked again this long later; after a failed one, the next waits
# this long (the share groups are blind meanwhile)
NAMES_TTL_S = 10.0


@dataclass
class _Partition:
    start: int = -1
    epoch: int | None = None
    done: list[tuple[int, int]] = field(default_factory=list)
    source: int = -1  # the partition of STATE_TOPIC its records are in

    def position(self) -> int | None:
        return None if self.start < 0 else advance(self.start, self.done)


@dataclass(frozen=True)
class SharePositions:
    """group -> topic -> partition -> position (None: not initialized), or `blind`: why nothing can be said."""

    groups: dict[str, dict[str, dict[int, int | None]]] = field(default_factory=dict)
    blind: str = ""
    undecodable: int = 0  # records skipped as undecodable since the tail started


class ShareStateTail:
    """Reads `__share_group_state` into share groups' positions; one per process, thread-safe."""

    def __init__(
        self,
        conn: KafkaConnection,
        topics: ClusterTopics | None = None,
        timeout_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self.topics = topics or ClusterTopics(conn, timeout_s)
        self.monotonic = monotonic
        self._consumer: Any = None
        self._assigned: int = 0
        self._state: dict[tuple[str, bytes, int], _Partition] = {}
        self._names: dict[bytes, str] = {}
        self._names_at = -NAMES_TTL_S
        self._unnamed: set[bytes] = set()  # IDs no topic had at the last naming round (asked again after NAMES_TTL_S)
        self._naming_error = ""  # why the last naming round failed ("" when it did not)
        self._undecodable = 0
        self._lock = threading.Lock()

    def read(self) -> SharePositions:
        """The share groups' positions as of the topic's end now."""
        with self._lock:
            try:
                exists = self._exists()
            except Exception as exc:
                return SharePositions(blind=f"cannot describe {STATE_TOPIC}: {exc}")
            if not exists:
                return SharePositions()
            try:
                self._drain()
            except Exception as exc:
                return SharePositions(blind=f"cannot read {STATE_TOPIC}: {_text(exc)}")
            try:
                return SharePositions(self._positions(), undecodable=self._undecodable)
            except Exception as exc:
                return SharePositions(blind=_text(exc))

    def _exists(self) -> bool:
        now = self.topics.describe([STATE_TOPIC])
        if STATE_TOPIC in now.unknown:
            raise RuntimeError(now.unknown[STATE_TOPIC])
        return STATE_TOPIC in now.ids

    def _drain(self) -> None:
        """Read every partition of the topic up to its high watermark as of now."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        if self._consumer is None:  # out of range: told (`_reread`), and read again from the start
            self._consumer = tail_consumer(self.conn, "compactd-share-state", "error")
        meta = self._consumer.list_topics(STATE_TOPIC, timeout=self.timeout_s).topics.get(STATE_TOPIC)
        if meta is None or meta.error is not None:
            raise KafkaException(meta.error) if meta is not None else RuntimeError("no metadata")
        n = len(meta.partitions)
        if n != self._assigned:
            self._consumer.assign([TopicPartition(STATE_TOPIC, p, OFFSET_BEGINNING) for p in range(n)])
            self._assigned = n
        read_to_ends(self._consumer, STATE_TOPIC, range(n), self._apply, self.timeout_s, self.monotonic, self._reread)

    def _reread(self, partition: int, why: str) -> None:
        """The tail's next record of `partition` was pruned: forget what that partition said and read it again from
        its start (its state as of the new log start: snapshots, the updates after them, no deleted share group)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        log.warning("%s[%d] pruned past the tail (%s): read again from its start", STATE_TOPIC, partition, why)
        self._state = {slot: part for slot, part in self._state.items() if part.source != partition}
        # a partition stopped by the reset error takes no seek ("Erroneous state"): it is assigned again
        self._consumer.incremental_unassign([TopicPartition(STATE_TOPIC, partition)])
        self._consumer.incremental_assign([TopicPartition(STATE_TOPIC, partition, OFFSET_BEGINNING)])

    def _apply(self, source: int, key: bytes | None, value: bytes | None) -> None:
        try:
            k = decode_key(key or b"")
            slot = (k.group, k.topic_id.bytes, k.partition)
            if value is None:
                self._state.pop(slot, None)
                return
            v = decode_value(k.kind, value)
        except DecodeError:
            self._undecodable += 1
            return
        part = self._state.get(slot)
        if k.kind == SNAPSHOT or part is None:
            # a snapshot is the whole state: an update before any snapshot (compacted away) starts one too
            self._state[slot] = _Partition(v.start_offset, v.state_epoch, list(v.done), source)
            return
        if v.start_offset >= 0:
            part.start = v.start_offset
        part.done.extend(v.done)
        part.done[:] = [(a, b) for a, b in part.done if b >= part.start]  # below the start: settled, forgotten

    def _positions(self) -> dict[str, dict[str, dict[int, int | None]]]:
        wanted = {tid for _, tid, _ in self._state}
        missing = wanted - self._names.keys()
        # a round runs for a new ID at once; an ID the last round did not find (a deleted topic's, or one the cluster
        # did not show yet: just created, not Describe-able yet) is asked again, and a failed round is retried, once
        # NAMES_TTL_S has passed
        if missing:
            new = missing - self._unnamed
            if (new and not self._naming_error) or self.monotonic() - self._names_at >= NAMES_TTL_S:
                self._names_at = self.monotonic()
                try:
                    self._refresh_names()
                    self._naming_error = ""
                except Exception as exc:
                    self._naming_error = f"cannot name the share groups' topics: {_text(exc)}"
                else:
                    self._unnamed = wanted - self._names.keys()
            if self._naming_error:  # a share group's topic may be among those not named: blind, never dropped
                raise RuntimeError(self._naming_error)
        out: dict[str, dict[str, dict[int, int | None]]] = {}
        for (group, tid, partition), part in self._state.items():
            topic = self._names.get(tid)
            if topic is not None:  # a deleted topic's state holds nothing
                out.setdefault(group, {}).setdefault(topic, {})[partition] = part.position()
        return out

    def _refresh_names(self) -> None:
        now = self.topics.describe(self.topics.names())
        if now.unknown:  # a topic the cluster would not describe may be the one an ID names: nothing is concluded
            topic, why = sorted(now.unknown.items())[0]
            raise RuntimeError(f"{topic}: {why}")
        self._names = {raw: t for t, i in now.ids.items() if (raw := topic_id_bytes(i)) is not None}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def tail_consumer(conn: KafkaConnection, group: str, reset: str) -> Any:
    """A consumer of one of Kafka's internal topics, read to its end now and then (`read_to_ends`): it commits nothing
    (`group` only names it), reads committed records, and its fetch at the end returns at once (10 ms: a drain to the
    end, not a wait for new records). `reset`: what falling out of range does."""
    return new_consumer(
        conn.client(
            "consumer",
            forced={"group.id": group, "enable.auto.commit": False, "isolation.level": "read_committed",
                    "enable.partition.eof": False, "fetch.wait.max.ms": 10, "auto.offset.reset": reset},
        )
    )  # fmt: skip


def read_to_ends(
    consumer: Any,
    topic: str,
    partitions: Iterable[int],
    apply: Callable[[int, bytes | None, bytes | None], None],
    timeout_s: float,
    monotonic: Callable[[], float] = time.monotonic,
    reread: Callable[[int, str], None] | None = None,
) -> None:
    """Feed `apply(partition, key, value)` every record of `partitions` (assigned to `consumer`) from where it stands
    up to each one's high watermark as of now (TimeoutError past `timeout_s`). `reread(partition, why)`: a partition
    out of range (`auto.offset.reset` error) is handed to it, and read on to the end from where it puts it."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    parts = list(partitions)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in parts}
    position = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in parts])}
    behind = {p for p, end in ends.items() if end > 0 and position.get(p, -1) < end}
    deadline = monotonic() + timeout_s
    while behind:
        if monotonic() > deadline:
            raise TimeoutError(f"not read to its end within {timeout_s:.0f}s")
        for msg in consumer.consume(1000, timeout=0.5):
            if msg.error() is not None:
                if reread is None or msg.error().code() != KafkaError._AUTO_OFFSET_RESET:
                    raise KafkaException(msg.error())
                reread(msg.partition(), msg.error().str())
                behind.add(msg.partition())
                continue
            apply(msg.partition(), msg.key(), msg.value())
            if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                behind.discard(msg.partition())
        if behind:  # transaction markers and compacted gaps: a partition may end without a last record
            got = consumer.position([TopicPartition(topic, p) for p in behind])
            behind -= {tp.partition for tp in got if tp.offset >= ends[tp.partition]}


def _text(exc: Exception) -> str:
    cause = exc.args[0] if exc.args else exc
    return cause.str() if hasattr(cause, "str") else str(cause)
