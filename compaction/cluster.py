"""What a compaction run asks of the Kafka cluster: partition counts, offsets (by position and by time), the view
topic's creation, and deleteRecords on the view for garbage collection."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from compactd.errors import CompactdError
from compactd.kafka.admin import admin_client
from compactd.kafka.config import KafkaConnection
from compactd.kafka.watermarks import NEWBORN_S, list_offsets

# How a view stamps and accepts its records' timestamps, whatever the broker's defaults. A view record carries its
# winner's own timestamp: under `compaction.strategy: timestamp` it is the rank the next run compares, so a broker's
# `LogAppendTime` (the time of writing) would make every view record outrank the newer source records produced
# before it. And a winner stays in the view for ever, written again by every rewrite: a bound the source's records
# met once (`message.timestamp.before.max.ms`, a broker's default of days) would refuse them later, and every run
# would fail. The view accepts every timestamp the source once accepted: no bound either way.
VIEW_TIMESTAMP_CONFIG = {
    "message.timestamp.type": "CreateTime",
    "message.timestamp.before.max.ms": str(2**63 - 1),
    "message.timestamp.after.max.ms": str(2**63 - 1),
}
# Before Kafka 3.6 (KIP-937) one setting bounded a record's timestamp both ways; 2.8 to 3.5 refuse a topic config
# they do not know ("Unknown topic config name"), so a view there gets this one instead.
LEGACY_TIMESTAMP_BOUND = "message.timestamp.difference.max.ms"


def view_timestamp_config(known: Collection[str] = ()) -> dict[str, str]:
    """VIEW_TIMESTAMP_CONFIG in the terms of a broker whose topic configs are `known` (the names DescribeConfigs
    lists; empty: the newest broker's)."""
    if not known or "message.timestamp.before.max.ms" in known:
        return dict(VIEW_TIMESTAMP_CONFIG)
    out = {"message.timestamp.type": "CreateTime"}
    if LEGACY_TIMESTAMP_BOUND in known:
        out[LEGACY_TIMESTAMP_BOUND] = str(2**63 - 1)
    return out


# Only compactd removes generations: no time or size retention on a view.
VIEW_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
# A view record is its winner plus compactd's headers: the view takes batches this much larger than its source does
# (`max.message.bytes`), and the run's producers send them. With the broker's default (1 MiB) a source allowing 2 MiB
# records could never be compacted: every run failed on RecordTooLargeException (issue 64).
VIEW_RECORD_HEADROOM = 64 << 10
BROKER_MESSAGE_BYTES = 1_048_588  # Kafka's default `message.max.bytes`, for a source that reports none
TIMEOUT_S = 30.0
log = logging.getLogger("compactd.compaction")


class ClusterError(CompactdError):
    """The cluster refused or did not answer a compaction's request."""


class CompactionCluster:
    """Constructed unconnected: its Admin client is made at the first request, so the job can hand one instance to
    the compaction service and the retention takeovers while it wires them, before anything is started."""

    def __init__(self, conn: KafkaConnection, timeout_s: float = TIMEOUT_S, replication_factor: int = -1) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        # -1: the cluster's default.replication.factor (and its min.insync.replicas): below the horizon the view is
        # the only copy of the data, never on one broker of a cluster that replicates
        self.replication_factor = replication_factor
        self._admin: Any = None
        self._topics: Any = None  # kafka.topics.ClusterTopics, made on first use
        # topics `ensure_topic` found or made, and ("config", view) for views `ensure_view_config` checked
        self._ensured: set[str | tuple[str, str]] = set()  # `forget` after a failure
        self.topic_config_names: frozenset[str] = frozenset()  # the topic configs the broker lists (source_configs)

    @property
    def log(self) -> Any:
        """kafka.topics.ClusterTopics: the log's own records (their leader epochs), as the delete checks read them."""
        from compactd.kafka.topics import ClusterTopics

        if self._topics is None:
            self._topics = ClusterTopics(self.conn, self.timeout_s)
        return self._topics

    @property
    def admin(self) -> Any:
        if self._admin is None:
            self._admin = admin_client(self.conn, self.timeout_s)
        return self._admin

    def topic_id(self, topic: str) -> str | None:
        """The topic's ID (KIP-516), None where the broker reports none or cannot say."""
        from compactd.policy.identity import known_id

        try:  # one ClusterTopics for the cluster's life: the job asks every check of every viewed topic
            return known_id(self.log.describe([topic]).ids.get(topic))
        except Exception:  # an older broker without DescribeTopics: the log's own evidence decides
            return None

    def topic_config(self, topic: str) -> tuple[str | None, int | None, str]:
        """(the topic's own retention.ms or None for the broker's default, the effective value in ms or None for no
        time retention, cleanup.policy): one DescribeConfigs. Time retention is what deletes under a view every week
        by default; `retention.bytes` has no time a run could beat."""
        from compactd.compaction.takeover import TopicConfig

        return TopicConfig(self.admin, self.timeout_s).read(topic)

    def source_configs(self, topic: str) -> tuple[str, int]:
        """(cleanup.policy, the record batch size the view must take: the source's `max.message.bytes` plus
        VIEW_RECORD_HEADROOM), one DescribeConfigs."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource, ResourceType

        res = ConfigResource(ResourceType.TOPIC, topic)
        try:
            have = self.admin.describe_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)
        except KafkaException as exc:
            raise ClusterError(f"cannot describe the configs of {topic}: {exc.args[0].str()}") from None
        self.topic_config_names = frozenset(have)  # what this broker's topics can be given (create_view)
        policy = have.get("cleanup.policy")
        size = have.get("max.message.bytes")
        source_bytes = int(size.value) if size is not None and str(size.value or "").isdigit() else 0
        view_bytes = max(source_bytes, BROKER_MESSAGE_BYTES) + VIEW_RECORD_HEADROOM
        return str(policy.value if policy is not None and policy.value else "delete"), view_bytes

    def set_retention(self, topic: str, value: str | None) -> None:
        """Set the topic's retention.ms (None: remove the topic's own value, the broker's default applies)."""
        from compactd.compaction.takeover import TopicConfig

        TopicConfig(self.admin, self.timeout_s).alter(topic, value)

    def add_partitions(self, topic: str, count: int) -> None:
        """Grow `topic` to `count` partitions (CreatePartitions): the view of a source that grew."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewPartitions

        futures = self.admin.create_partitions([NewPartitions(topic, count)], request_timeout=self.timeout_s)
        for fut in futures.values():
            try:
                fut.result(self.timeout_s)
            except KafkaException as exc:
                raise ClusterError(f"cannot add partitions to {topic}: {exc.args[0].str()}") from None
        deadline = time.monotonic() + self.timeout_s
        while (self.partitions(topic) or 0) < count:  # the client's metadata learns them (ListOffsets needs it)
            if time.monotonic() > deadline:
                raise ClusterError(f"{topic}: the partitions added are not in the cluster's metadata yet")
            time.sleep(0.1)

    def partitions(self, topic: str) -> int | None:
        """The topic's partition count; None when it does not exist."""
        md = self.admin.list_topics(timeout=self.timeout_s).topics.get(topic)
        if md is None or md.error is not None:
            return None
        return len(md.partitions)

    def offsets(
        self,
        topic: str,
        spec: str | int,
        count: int,
        committed: bool = True,
        epochs: dict[int, int] | None = None,
        newborn: bool = False,
    ) -> dict[int, int]:
        """Per partition: "earliest", "latest" (the last stable offset under read_committed), or the first offset
        whose timestamp is ≥ an epoch-ms value (-1 where none is). `epochs`, when given, gets each partition's
        leader epoch as the answer carries it (for "latest": the leader's epoch now). `newborn`: the topic was just
        created, an unknown topic is asked again for a while (kafka/watermarks.py)."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if spec == "earliest":
            ospec = OffsetSpec.earliest()
        elif spec == "latest":
            ospec = OffsetSpec.latest()
        else:
            ospec = OffsetSpec.for_timestamp(int(spec))
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        request = {TopicPartition(topic, p): ospec for p in range(count)}
        out: dict[int, int] = {}
        got: dict[Any, int] | None = {} if epochs is not None else None
        try:
            newborn_s = NEWBORN_S if newborn else 0.0
            for tp, offset in list_offsets(self.admin, request, level, self.timeout_s, got, newborn_s).items():
                out[tp.partition] = offset
            if epochs is not None and got is not None:
                epochs.update({tp.partition: e for tp, e in got.items()})
        except KafkaException as exc:
            raise ClusterError(f"cannot list offsets of {topic}: {exc.args[0].str()}") from None
        return out

    def create_view(self, view: str, partitions: int, record_bytes: int = BROKER_MESSAGE_BYTES) -> None:
        """The view topic: VIEW_TOPIC_CONFIG and the timestamp settings (`view_timestamp_config`, in the terms of the
        broker `source_configs` described the source on), taking batches of `record_bytes` (`source_configs`)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        config = {**VIEW_TOPIC_CONFIG, **view_timestamp_config(self.topic_config_names),
                  "max.message.bytes": str(record_bytes)}  # fmt: skip
        futures = self.admin.create_topics(
            [NewTopic(view, partitions, self.replication_factor, config=config)],
            request_timeout=self.timeout_s,
        )
        for fut in futures.values():
            try:
                fut.result(self.timeout_s)
            except KafkaException as exc:
                raise ClusterError(f"cannot create view topic {view}: {exc.args[0].str()}") from None
        self._wait_led(view, partitions)

    def _wait_led(self, topic: str, partitions: int) -> None:
        """Until every partition of a topic just created has a leader that answers ListOffsets: each broker applies
        a new topic on its own time, and the view writer's first ListOffsets met one that had not (three nodes,
        kafka/watermarks.py NEWBORN_S). The metadata is asked for the topic by name first: librdkafka answers
        ListOffsets for a topic its cache does not hold yet with "No leaders found", without asking."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            md = self.admin.list_topics(topic=topic, timeout=self.timeout_s).topics.get(topic)
            led = (
                md is not None
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.error is None and p.leader >= 0 for p in md.partitions.values())
            )
            if led:
                try:
                    self.offsets(topic, "latest", partitions, committed=False, newborn=True)
                    return
                except ClusterError:
                    if time.monotonic() > deadline:
                        raise
            elif time.monotonic() > deadline:
                raise ClusterError(f"{topic}: created, but its partitions have no leader after {self.timeout_s:g} s")
            time.sleep(0.1)

    def ensure_view_config(self, view: str, record_bytes: int = BROKER_MESSAGE_BYTES) -> None:
        """A view created before `VIEW_TIMESTAMP_CONFIG` (or altered since) gets it, and takes batches of
        `record_bytes` (a source allowed larger records since): checked once per process and size, as
        `ensure_topic` checks, and again after a failed run."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        if ("config", f"{view}@{record_bytes}") in self._ensured:
            return
        res = ConfigResource(ResourceType.TOPIC, view)
        try:
            have = self.admin.describe_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)
            want = {**view_timestamp_config(have), "max.message.bytes": str(record_bytes)}
            wrong = {k: v for k, v in want.items() if k not in have or have[k].value != v}
            if wrong:
                log.info("view topic %s: setting %s", view, ", ".join(f"{k}={v}" for k, v in sorted(wrong.items())))
                entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in wrong.items()]
                alter = ConfigResource(ResourceType.TOPIC, view, incremental_configs=entries)
                self.admin.incremental_alter_configs([alter], request_timeout=self.timeout_s)[alter].result(
                    self.timeout_s
                )
        except KafkaException as exc:
            raise ClusterError(f"cannot set the configs of view topic {view}: {exc.args[0].str()}") from None
        self._ensured.add(("config", f"{view}@{record_bytes}"))

    def forget(self) -> None:
        """After a failed run: the next one checks its topics again (one may have been deleted meanwhile), with a
        new client: the old one's cache may name a leader that left the cluster, which librdkafka keeps for
        `metadata.max.age.ms` and answers "No leaders found" from, never asking again (sinks/kafka_admin.py)."""
        from compactd.kafka.admin import retire

        self._ensured.clear()
        retire(self._admin)  # a request of it may still be out: freed once that has had its answer
        self._admin = None

    def ensure_topic(self, topic: str, config: Mapping[str, str]) -> None:
        """Create the topic when missing; once it exists, later calls ask nothing (every run calls it)."""
        from compactd.kafka.admin import ensure_topics

        if topic in self._ensured:
            return
        ensure_topics(self.conn, [topic], 1, self.timeout_s, {topic: dict(config)}, self.replication_factor, self.admin)
        self._ensured.add(topic)

    def delete_below(self, topic: str, below: Mapping[int, int]) -> dict[int, int]:
        """deleteRecords up to each offset (never past the high watermark); the new low watermarks."""
        from confluent_kafka import KafkaException, TopicPartition

        if not below:
            return {}
        high = self.offsets(topic, "latest", max(below) + 1, committed=False)
        low = self.offsets(topic, "earliest", max(below) + 1, committed=False)
        request = [
            TopicPartition(topic, p, min(off, high.get(p, 0))) for p, off in below.items() if off > low.get(p, 0)
        ]
        if not request:
            return {p: low.get(p, 0) for p in below}
        out = {p: low.get(p, 0) for p in below}
        try:
            for tp, fut in self.admin.delete_records(request, request_timeout=self.timeout_s).items():
                out[tp.partition] = fut.result(timeout=self.timeout_s).low_watermark
        except KafkaException as exc:
            raise ClusterError(f"cannot delete records of {topic}: {exc.args[0].str()}") from None
        return out
