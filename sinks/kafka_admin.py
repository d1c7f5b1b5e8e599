"""Acts on a real Kafka cluster through the AdminClient.

- delete_records: KIP-107 DeleteRecords, only on topics whose `cleanup.policy` has `delete`. An offset past the
  high watermark is never clamped and sent: only a state describing another log (a re-created topic) asks for it,
  so the record is skipped with `detail.stale` and the controller resets the topic (control/lifecycle.py).
- compact: Kafka has no "compact now" call, so the topic config named by `compaction.nudge` is set to a
  value that makes the cleaner pick the log up at once; the value it replaced is remembered and put
  back (restore_config) once the partition shows up compacted.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from compactd.kafka.admin import admin_client
from compactd.kafka.config import KafkaConnection
from compactd.model import ActionRecord
from compactd.policy.identity import STALE
from compactd.state.protocols import NudgeMemory

# Values that make KIP-354's check fire immediately, or make the cleaner see the log as dirty enough.
NUDGE_VALUES = {"max.compaction.lag.ms": "1", "min.cleanable.dirty.ratio": "0", "segment.ms": "1000"}
_DEFAULT_SOURCES = {ConfigSource.DEFAULT_CONFIG.value, ConfigSource.STATIC_BROKER_CONFIG.value}
# A topic's cleanup.policy is read from the cluster and kept this long: a changed policy is seen within a minute.
POLICY_TTL_S = 60.0


class KafkaAdminSink:
    name = "kafka_admin"

    def __init__(
        self, conn: KafkaConnection, state: NudgeMemory, timeout_s: float = 10.0, policy_ttl_s: float = POLICY_TTL_S
    ) -> None:
        self.conn = conn
        self.state = state
        self.timeout_s = timeout_s
        self.policy_ttl_s = policy_ttl_s
        self._policies: dict[str, tuple[float, str]] = {}
        self.admin: Any = None
        self._watermarks: Any = None

    def start(self) -> None:
        if self.admin is None:
            self.admin = admin_client(self.conn, self.timeout_s)
            self._watermarks = Consumer(self.conn.client("consumer", forced={"group.id": "compactd-admin-watermarks"}))

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
        low, high = self._watermarks.get_watermark_offsets(
            TopicPartition(rec.topic, rec.partition), timeout=self.timeout_s, cached=False
        )
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
            result = fut.result(timeout=self.timeout_s)
            return rec.with_status("sent", low_watermark=getattr(result, "low_watermark", None))
        return rec.with_status("failed", error="no result from delete_records")

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
        op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
        res = ConfigResource(
            ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(key, value, incremental_operation=op)]
        )
        self.admin.incremental_alter_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)

    def _nudge(self, rec: ActionRecord) -> ActionRecord:
        policy = self.cleanup_policy(rec.topic)
        if "compact" not in policy.split(","):
            return rec.with_status("skipped", why=f"cleanup.policy={policy} has no compact")
        key = rec.detail.get("nudge", "max.compaction.lag.ms")
        value = NUDGE_VALUES[key]
        entry = self._describe(rec.topic).get(key)
        current = None if entry is None or entry.source in _DEFAULT_SOURCES else entry.value
        # A second nudge of the same topic sees our own value: the first remembered one is kept.
        previous = self.state.remember_config(rec.topic, key, current)
        if current != value:
            self._alter(rec.topic, key, value)
        return rec.with_status("sent", nudge=key, value=value, previous=previous)

    def _restore(self, rec: ActionRecord) -> ActionRecord:
        restored = {}
        for key, previous in self.state.nudged(rec.topic).items():
            self._alter(rec.topic, key, previous)
            self.state.forget_config(rec.topic, key)
            restored[key] = previous
        return rec.with_status("sent", restored=restored)

    def close(self) -> None:
        if self._watermarks is not None:
            self._watermarks.close()
        # the admin handle, and its broker connections, go with the last reference
        self.admin = self._watermarks = None
