"""Acts on a real Kafka cluster through the AdminClient.

- delete_records: KIP-107 DeleteRecords, only on topics whose `cleanup.policy` has `delete`. An offset past the
  high watermark is never clamped and sent: only a state describing another log (a re-created topic) asks for it,
  so the record is skipped with `detail.stale` and the controller resets the topic (control/identity.py).
- compact: Kafka has no "compact now" call, so the topic config named by `compaction.nudge` is set to a
  value that makes the cleaner pick the log up at once; the value it replaced is remembered (Redis, and the nudge
  ledger topic before the alter: sinks/nudge_ledger.py) and put back (restore_config) once the partition shows up
  compacted, or after `compaction.nudge.max.ms` whatever the cleaner did.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from compactd.clock import now_ms
from compactd.kafka.admin import admin_client, retire
from compactd.kafka.config import KafkaConnection, new_consumer
from compactd.kafka.watermarks import STALE_METADATA, watermarks
from compactd.model import ActionRecord, Nudge
from compactd.policy.identity import STALE
from compactd.sinks.nudge_ledger import NudgeLedger, ledger_key
from compactd.state.protocols import NudgeMemory

log = logging.getLogger("compactd.sinks")
# Values that make KIP-354's check fire immediately, or make the cleaner see the log as dirty enough.
NUDGE_VALUES = {"max.compaction.lag.ms": "1", "min.cleanable.dirty.ratio": "0", "segment.ms": "1000"}
# Only a value set on the topic itself is the topic's own: one from the broker (static, dynamic per broker or
# cluster-wide) is the broker's, and a topic without an override follows it, changes included. Taking it for the
# topic's and SETting it back at the restore would pin it onto the topic.
_TOPIC_OWN = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
ALTER_SEEN_POLL_S = 0.05  # how often a config just altered is described again until the broker shows it
# A topic's cleanup.policy is read from the cluster and kept this long: a changed policy is seen within a minute.
POLICY_TTL_S = 60.0


def nudge_value(key: str, entries: Mapping[str, Any]) -> str:
    """The value a nudge sets: NUDGE_VALUES', raised where the topic's own configs forbid it. Kafka refuses a
    `max.compaction.lag.ms` below the topic's `min.compaction.lag.ms` (the nudge would fail at every retry), and
    the smallest it allows is that value: records older than it are due at once, all the cleaner may take anyway."""
    value = NUDGE_VALUES[key]
    if key == "max.compaction.lag.ms":
        floor = entries.get("min.compaction.lag.ms")
        if floor is not None and floor.value is not None and int(floor.value) > int(value):
            return str(int(floor.value))
    return value


class KafkaAdminSink:
    name = "kafka_admin"

    def __init__(
        self,
        conn: KafkaConnection,
        state: NudgeMemory,
        timeout_s: float = 10.0,
        policy_ttl_s: float = POLICY_TTL_S,
        ledger: NudgeLedger | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        """`ledger`: where each nudge's original value is kept beyond Redis (None: Redis only, for tests)."""
        self.conn = conn
        self.state = state
        self.ledger = ledger
        self.clock = clock
        self.timeout_s = timeout_s
        self.policy_ttl_s = policy_ttl_s
        self._policies: dict[str, tuple[float, str]] = {}
        self.admin: Any = None
        self._watermarks: Any = None

    def start(self) -> None:
        if self.admin is None:
            self.admin = admin_client(self.conn, self.timeout_s)
            # the log end a delete is checked against is the high watermark (DeleteRecords' own bound), not the
            # last stable offset a read_committed client gets below an open transaction
            self._watermarks = new_consumer(
                self.conn.client(
                    "consumer", forced={"group.id": "compactd-admin-watermarks", "isolation.level": "read_uncommitted"}
                )
            )

    def execute(self, rec: ActionRecord) -> ActionRecord:
        try:
            self.start()
            if rec.action == "delete_records":
                return self._delete_records(rec)
            if rec.action == "compact":
                return self._nudge(rec)
            if rec.action == "restore_config":
                return self._restore(rec)
            return rec.with_status("skipped", why=f"unknown action {rec.action}")
        except KafkaException as exc:
            if exc.args[0].name() in STALE_METADATA:
                self._drop_clients()
            return rec.with_status("failed", error=str(exc.args[0]))
        except Exception as exc:  # a sink must answer with a status, never take the job down
            return rec.with_status("failed", error=f"{type(exc).__name__}: {exc}")

    def _delete_records(self, rec: ActionRecord) -> ActionRecord:
        assert rec.before_offset is not None
        if rec.topic.startswith("__"):
            return rec.with_status("skipped", why="internal topic")
        policy = self.cleanup_policy(rec.topic)
        if "delete" not in policy.split(","):
            return rec.with_status("skipped", why=f"cleanup.policy={policy} has no delete")
        low, high = watermarks(self._watermarks, rec.topic, rec.partition, self.timeout_s)
        before = rec.before_offset
        if before > high:
            stale = f"a delete to offset {before} is past the log end {high}"
            return rec.with_status("skipped", why=f"{STALE}: {stale}", stale=stale, high_watermark=high)
        if before <= low:
            return rec.with_status("sent", low_watermark=low, why="already below log start")
        futures = self.admin.delete_records(
            [TopicPartition(rec.topic, rec.partition, before)], request_timeout=self.timeout_s
        )
        for fut in futures.values():
            try:
                result = fut.result(timeout=self.timeout_s)
            except (KafkaException, concurrent.futures.TimeoutError) as exc:
                return self._unanswered(rec, before, exc)
            return rec.with_status("sent", low_watermark=getattr(result, "low_watermark", None))
        return rec.with_status("failed", error="no result from delete_records")

    def _unanswered(self, rec: ActionRecord, before: int, exc: Exception) -> ActionRecord:
        """A DeleteRecords without an answer may still have happened: the leader moves its log start at once and
        answers only when every in-sync follower has moved its own, so a stalled follower (until it leaves the ISR,
        `replica.lag.time.max.ms`) times the request out after the delete. The log start says which: at `before` or
        past it, the delete is done and audited as sent, saying so; below, it failed and is retried (the same
        offset: a retry never deletes more than was decided).

        An answer of the client's own metadata ("No leaders found": its cache still names a leader that left the
        cluster, a stopped node) means nothing was sent, and librdkafka neither asks again nor drops that entry
        before `metadata.max.age.ms` (30 s): every delete on a moved partition failed that long in a rolling restart.
        The next try asks with new clients, as after a request that had no answer at all (its client may still send
        to the stopped node: 10 s each try)."""
        name = exc.args[0].name() if isinstance(exc, KafkaException) else None
        unsent = name == "_NOENT"  # the client found no leader to send it to
        answer = str(exc.args[0]) if isinstance(exc, KafkaException) else f"no answer within {self.timeout_s:g} s"
        try:
            low, _ = watermarks(self._watermarks, rec.topic, rec.partition, self.timeout_s)
        except KafkaException:
            low = None
        if name is None or name in STALE_METADATA:  # no answer at all: a node that stopped may hold the request
            self._drop_clients()
        if low is None:
            return rec.with_status("failed", error=answer)
        if low >= before:
            why = (
                "already below log start"
                if unsent
                else (f"the broker moved the log start to {low}; its answer timed out waiting for in-sync followers")
            )
            return rec.with_status("sent", low_watermark=low, why=why, answer=answer)
        return rec.with_status("failed", error=answer, low_watermark=low)

    def cleanup_policy(self, topic: str) -> str:
        """The topic's cleanup.policy as the cluster has it, cached for `policy_ttl_s`."""
        now = time.monotonic()
        cached = self._policies.get(topic)
        if cached is not None and now - cached[0] < self.policy_ttl_s:
            return cached[1]
        entry = self._describe(topic).get("cleanup.policy")
        policy = "delete" if entry is None or entry.value is None else str(entry.value).replace(" ", "")
        self._policies[topic] = (now, policy)
        return policy

    def _describe(self, topic: str) -> dict[str, Any]:
        res = ConfigResource(ResourceType.TOPIC, topic)
        entries = self.admin.describe_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)
        return entries

    def _alter(self, topic: str, key: str, value: str | None) -> None:
        """Set `key` (None: remove the topic's own value), and return once DescribeConfigs shows it. KRaft answers the
        alter once the controller has it; a broker's DescribeConfigs shows it a moment later. A nudge read in that
        moment right after a restore saw compactd's own value still there, took it for a nudge Redis had lost, and
        remembered the broker's default as the original: the operator's override was removed at the next restore
        (a generated history of test_every_nudge_is_eventually_put_back, once)."""
        op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
        res = ConfigResource(
            ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(key, value, incremental_operation=op)]
        )
        self.admin.incremental_alter_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        while not self._shows(topic, key, value):
            if time.monotonic() >= deadline:
                log.warning("%s: %s altered, but DescribeConfigs does not show it after %gs", topic, key,
                            self.timeout_s)  # fmt: skip
                return
            time.sleep(ALTER_SEEN_POLL_S)

    def _shows(self, topic: str, key: str, value: str | None) -> bool:
        entry = self._describe(topic).get(key)
        own = entry is not None and entry.source == _TOPIC_OWN
        return (own and entry.value == value) if value is not None else not own

    def _nudge(self, rec: ActionRecord) -> ActionRecord:
        policy = self.cleanup_policy(rec.topic)
        if "compact" not in policy.split(","):
            return rec.with_status("skipped", why=f"cleanup.policy={policy} has no compact")
        resting = self.state.nudges_rest(rec.topic)
        if resting:
            why = (
                f"the cleaner did not answer the last nudge within compaction.nudge.max.ms; next in {resting // 1000}s"
            )
            return rec.with_status("skipped", why=why)
        key = rec.detail.get("nudge", "max.compaction.lag.ms")
        entries = self._describe(rec.topic)
        value = nudge_value(key, entries)
        entry = entries.get(key)
        current = entry.value if entry is not None and entry.source == _TOPIC_OWN else None
        # compactd's own value on the topic is never taken for an operator's: its original is the one remembered
        # (Redis, else the ledger), and where neither has it the broker's default goes back. A value raised to the
        # topic's floor (nudge_value) is compactd's only where a nudge of it is remembered: it may be the operator's.
        remembered = key in self.state.nudged(rec.topic) or (
            self.ledger is not None and any((n.topic, n.key) == (rec.topic, key) for n in self.ledger.load())
        )
        ours = current == value and (value == NUDGE_VALUES[key] or remembered)
        candidate = Nudge(rec.topic, key, None if ours else current, value, self.clock())
        if ours and self.ledger is not None and not self.state.nudged(rec.topic).get(key):
            candidate = next((n for n in self.ledger.load() if (n.topic, n.key) == (rec.topic, key)), candidate)
        # a second nudge of the same topic sees our own value: the first remembered one is kept
        nudge = self.state.remember_config(candidate)
        if self.ledger is not None:
            self.ledger.record(nudge)  # acknowledged before the alter: a lost Redis cannot lose the original
        if current != value:
            self._alter(rec.topic, key, value)
        floor = {"floor": "min.compaction.lag.ms"} if value != NUDGE_VALUES[key] else {}  # for explain
        return rec.with_status("sent", nudge=key, value=value, previous=nudge.original, **floor)

    def _restore(self, rec: ActionRecord) -> ActionRecord:
        """Put each nudged config back: the original override, or none (the broker's value). Only where compactd's
        own value is still on the topic: a value an operator set while the nudge was on is theirs and stays."""
        restored, kept = {}, {}
        nudges = {n.key: n for n in self.state.nudges() if n.topic == rec.topic}
        entries = self._describe(rec.topic) if nudges else {}
        for key, nudge in nudges.items():
            previous, entry = nudge.original, entries.get(key)
            ours = entry is not None and entry.source == _TOPIC_OWN and entry.value == nudge.value
            if ours:
                self._alter(rec.topic, key, previous)
                restored[key] = previous
            else:
                kept[key] = None if entry is None or entry.source != _TOPIC_OWN else entry.value
            if self.ledger is not None:
                self.ledger.clear(rec.topic, key)
            self.state.forget_config(rec.topic, key)
        if kept:
            log.info("%s: %s changed while nudged; left as it is now", rec.topic, ", ".join(sorted(kept)))
        return rec.with_status("sent", restored=restored, **({"kept": kept} if kept else {}))

    def recover_nudges(self) -> int:
        """At start and after a rebuild: the nudges the ledger holds that Redis lost come back into Redis (so they
        are put back), and those only Redis holds (made before the ledger existed) go onto the ledger. Returns how
        many nudges are on."""
        if self.ledger is None:
            return len(self.state.nudges())
        on_ledger = self.ledger.load()
        for nudge in on_ledger:
            self.state.remember_config(nudge)
        known = {ledger_key(n.topic, n.key) for n in on_ledger}
        for nudge in self.state.nudges():
            if ledger_key(nudge.topic, nudge.key) not in known:
                self.ledger.record(nudge)
        return len(self.state.nudges())

    def _drop_clients(self) -> None:
        """The next action starts with new clients, which ask the cluster where its leaders are from scratch."""
        # retired, not closed: a DeleteRecords or ListOffsets of them may still be out; freed once it has its answer
        retire(self._watermarks)
        retire(self.admin)
        self.admin = self._watermarks = None

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
        self._drop_clients()
