"""Topics deleted and created again under a running job: find out, reset, forget.

The rule (`policy.identity.identity_changed`) is pure; this applies it where the cluster can be asked:
- right before an action goes to the cluster (`check`): the action's topic ID and the partition's watermarks. A state
  that describes another log skips the action as stale and resets the topic;
- on a log whose topic ID is unchanged, a high watermark below what the state holds is a follower catching up: a
  delete past it waits (`BehindHighWatermark`), and the state is kept. The gap lasting TRUNCATION_GRACE_MS means the
  log was truncated (a failover with `acks=1`, an unclean leader election): the topic is reset then;
- every `topic_check_interval_ms` over every known topic (`sweep`): one DescribeTopics round. A changed topic ID resets
  the topic; a topic missing from two sweeps in a row is forgotten (its state goes, its metrics stop).

A reset keeps which groups hold the topic: on the new log they have no position yet, so consumed retention waits
for their commits, as it does for a group that never committed (KIP-68's -1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from compactd.control.metrics import Metrics
from compactd.kafka.topics import TopicsNow
from compactd.model import ActionRecord, PartitionView
from compactd.policy.identity import (
    STALE,
    TRUNCATED,
    LogFacts,
    behind_high_watermark,
    identity_changed,
    known_id,
    same_log,
)
from compactd.state.protocols import TopicStore

log = logging.getLogger("compactd.lifecycle")

# How long a high watermark may stay below what the state holds before the log counts as truncated. A follower
# stalled in the ISR holds the high watermark back for at most `replica.lag.time.max.ms` (30 s by Kafka's default),
# then leaves the ISR and the high watermark catches up with the leader's log end; four times that is no longer a
# follower catching up.
TRUNCATION_GRACE_MS = 120_000


class BehindHighWatermark(Exception):
    """A delete past the partition's high watermark on the log the state describes: it waits in the outbox, as a
    delete over the rate cap does, until the followers have caught up."""


class TopicReader(Protocol):
    def describe(self, topics: Iterable[str]) -> TopicsNow: ...

    def facts(self, topic: str, partition: int) -> LogFacts | None: ...

    def leader_epoch(self, topic: str, partition: int) -> tuple[int, int]:
        """(high watermark, current leader epoch) of the partition."""

    def last_record_below(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """(offset, leader epoch) of the last record below `offset` in the log now."""


class Records(Protocol):
    """What a state loss must not take, kept beyond Redis (the application's ledger topic)."""

    def record_reset(self, topic: str, why: str, now: int) -> None:
        """The topic's state was reset: where the sources stand now (a rebuild drops the events before)."""

    def forget_nudges(self, topic: str) -> None:
        """A topic deleted for good: its nudges' originals go, so that a topic created later under the name is never
        given the old one's."""

    def record_ids(self, ids: Mapping[str, str | None]) -> None:
        """The incarnations the state is bound to (None: the topic was forgotten). A rebuild binds its state to them
        before it reads a source again: a topic re-created since is then found stale, not taken for the one the
        replayed events describe."""


class Lifecycle:
    """`reader`: the cluster (None: only what the sink reports, `stale`). `on_change(topic, partitions)`: the
    controller forgets what it remembers of them (metrics, deadlines). `records`: resets and bound topic IDs are
    written there too, before Redis (None: Redis only, for tests of one process).

    An action found stale is skipped first and its topic reset after (`settle`), once the round's records are
    written: a reset drops the topic's live records, and a skipped record written after it would come back."""

    def __init__(
        self,
        state: TopicStore,
        reader: TopicReader | None,
        metrics: Metrics,
        on_change: Callable[[str, list[int]], None],
        records: Records | None = None,
    ) -> None:
        self.records = records
        self.state = state
        self.reader = reader
        self.metrics = metrics
        self.on_change = on_change
        self._missing_once: set[str] = set()
        # topic -> (why, gone, its ID now) to reset (or forget) at `settle`
        self._pending: dict[str, tuple[str, bool, str | None]] = {}
        self._learned: set[str] = set()  # topics whose ID this process recorded or found recorded (or none reported)
        # (topic, partition) -> when its high watermark was first seen below what the state holds (this process)
        self._behind: dict[tuple[str, int], int] = {}

    def learn(self, topics: Iterable[str]) -> None:
        """Bind the state of topics just merged to the incarnation the cluster holds now: the topic ID of each topic
        this process has not seen yet is recorded (one DescribeTopics for all of them). Recorded only at the first
        check, a topic re-created before it would be taken for the one its state describes."""
        if self.reader is None:
            return
        new = [t for t in topics if t not in self._learned]
        if not new:
            return
        unknown = [t for t, known in zip(new, self.state.topic_ids(new), strict=True) if known is None]
        if unknown:
            seen = self.reader.describe(unknown)
            self._bind({t: now_id for t, topic_id in seen.ids.items() if (now_id := known_id(topic_id)) is not None})
            new = [t for t in new if t not in seen.unknown]  # asked again at the next batch
        self._learned.update(new)

    def forget_learned(self) -> None:
        """The state was wiped (a rebuild): the IDs this process recorded went with it."""
        self._learned.clear()

    def restore(self, ids: Mapping[str, str]) -> None:
        """A rebuild binds the empty state to the incarnations recorded beyond Redis before any event is read again:
        the events replayed describe them, whatever the cluster holds now. A topic re-created since (no sweep saw it
        before the state went) is then found stale at its first action, and reset, instead of its old log's events
        being taken for the new log's (the lifecycle property found a forced delete to 600 where 349 was due)."""
        self.state.set_topic_ids(dict(ids))

    def _bind(self, ids: Mapping[str, str | None]) -> None:
        """Record the incarnation each topic's state describes: beyond Redis first, then in it (None: forgotten)."""
        if not ids:
            return
        if self.records is not None:
            self.records.record_ids(ids)
        self.state.set_topic_ids({t: i for t, i in ids.items() if i is not None})

    def check(self, rec: ActionRecord, view: PartitionView | None, now: int) -> str | None:
        """Why `rec` must not go because its topic is not the log its state describes (None: it may go); the topic
        is reset (or forgotten, when it no longer exists) at the next `settle`. Raises BehindHighWatermark for a
        delete that must wait for the followers, and the reader's error when the cluster cannot answer."""
        if rec.topic in self._pending:
            return f"{STALE}: {self._pending[rec.topic][0]}"
        if self.reader is None:
            return None
        facts = self.reader.facts(rec.topic, rec.partition)
        if facts is None:
            return self.stale(rec.topic, f"topic {rec.topic} no longer exists", gone=True)
        stored = self.state.topic_id(rec.topic)
        now_id = known_id(facts.topic_id)
        if view is not None:
            before = rec.before_offset if rec.action == "delete_records" else None
            why = identity_changed(view, facts, stored, before)
            if why is None and same_log(facts, stored):
                why = self._behind_high_watermark(rec, view, facts, before, now)
        else:
            why = f"topic ID {stored} is now {now_id}" if None not in (now_id, stored) and now_id != stored else None
        if why is not None:
            return self.stale(rec.topic, f"{rec.topic}/{rec.partition}: {why}", now_id=now_id)
        if stored is None and now_id is not None:
            self._bind({rec.topic: now_id})
        return None

    def _behind_high_watermark(
        self, rec: ActionRecord, view: PartitionView, facts: LogFacts, before: int | None, now: int
    ) -> str | None:
        """On the log the state describes: None when the high watermark is at or past what the state holds and
        where the delete goes. Below it for TRUNCATION_GRACE_MS: why the log counts as truncated (the topic is
        reset). Below it for less: a delete past it raises BehindHighWatermark, one below it may go."""
        key = (rec.topic, rec.partition)
        behind = behind_high_watermark(view, facts, before)
        if behind is None:
            self._behind.pop(key, None)
            return None
        since = self._behind.setdefault(key, now)
        if now - since >= TRUNCATION_GRACE_MS:
            self._behind.pop(key, None)
            held_for = f"{(now - since) / 1000:.0f} s"
            return f"{behind} for {held_for}: {TRUNCATED} (a failover with acks=1, an unclean leader election)"
        if before is not None and before > facts.high:
            raise BehindHighWatermark(f"{rec.topic}/{rec.partition}: {behind}: the followers are catching up")
        return None

    def stale(self, topic: str, why: str, gone: bool = False, now_id: str | None = None) -> str:
        """Mark `topic` for a reset (a forget when `gone`) at the next `settle`, bound to `now_id` if the cluster
        reported it; returns the skip reason."""
        self._pending.setdefault(topic, (why, gone, now_id))
        return f"{STALE}: {why}"

    def settle(self, now: int) -> None:
        """Reset or forget the topics found stale since the last call."""
        pending, self._pending = self._pending, {}
        for topic, (why, gone, now_id) in pending.items():
            if gone:
                self.forget(topic, why)
            else:
                self.reset(topic, why, now)
                if now_id is not None:
                    try:
                        self._bind({topic: now_id})
                    except Exception as exc:  # the reset holds; the next check or sweep binds the ID again
                        log.warning("topic %s: its new topic ID not recorded yet: %s", topic, exc)

    def sweep(self, now: int) -> None:
        """One DescribeTopics round over the known topics: record new IDs, reset re-created topics, forget topics
        missing twice in a row (a topic being re-created may be missing for a moment)."""
        topics = self.state.topics()
        if self.reader is None or not topics:
            return
        seen = self.reader.describe(topics)
        for topic, topic_id in seen.ids.items():
            now_id = known_id(topic_id)
            if now_id is None:
                continue
            stored = self.state.topic_id(topic)
            if stored != now_id:
                if stored is not None:
                    self.reset(topic, f"topic ID {stored} is now {now_id}", now)
                self._bind({topic: now_id})
        for topic in seen.missing & self._missing_once:
            self.forget(topic, "deleted: missing from two topic checks in a row")
        self._missing_once = set(seen.missing)

    def reset(self, topic: str, why: str, now: int) -> None:
        if self.records is not None:
            self.records.record_reset(topic, why, now)
        parts = self.state.reset_topic(topic, why, now)
        self._learned.discard(topic)
        self._behind = {k: v for k, v in self._behind.items() if k[0] != topic}
        self.metrics.topic_resets.inc()
        self.on_change(topic, parts)
        log.error(
            "%s: %s (%s); its state was reset: %d partitions re-learn from their next events, "
            "and no delete goes there until they have",
            "log truncated" if TRUNCATED in why else "topic re-created",
            topic,
            why,
            len(parts),
        )

    def forget(self, topic: str, why: str) -> None:
        parts = self.state.forget_topic(topic)
        if self.records is not None:
            self.records.record_ids({topic: None})
            self.records.forget_nudges(topic)
        self._learned.discard(topic)
        self._missing_once.discard(topic)
        self.metrics.topics_forgotten.inc()
        self.on_change(topic, parts)
        log.warning("topic %s forgotten (%s): its state and metrics are gone", topic, why)
