"""Which log a topic is right now, as the cluster says: its topic ID (KIP-516), whether it exists, and a partition's
watermarks. Read right before an action goes (control/identity.py) and by a periodic sweep of the known topics.

DescribeTopics asks by name: unlike a whole-cluster Metadata request, which silently leaves out the topics the
principal may not Describe, it answers UNKNOWN_TOPIC_OR_PART only for a topic that does not exist, and an
authorization error for one it may not see (never mistaken for a deleted topic).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from compactd.kafka.admin import admin_client, retire
from compactd.kafka.config import KafkaConnection, new_consumer
from compactd.kafka.watermarks import watermarks
from compactd.policy.identity import LogFacts

DESCRIBE_CHUNK = 1000  # topics per DescribeTopics request


@dataclass
class TopicsNow:
    """One DescribeTopics round: topic -> its ID ("" when the broker reports none), the topics that do not exist,
    and those the cluster did not answer for (unknown: nothing is concluded about them)."""

    ids: dict[str, str] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    unknown: dict[str, str] = field(default_factory=dict)  # topic -> error


class ClusterTopics:
    """Topic IDs and watermarks from the cluster; constructed unconnected, connected on first use."""

    def __init__(self, conn: KafkaConnection, timeout_s: float = 10.0) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self._admin: Any = None
        self._consumer: Any = None

    def _clients(self) -> tuple[Any, Any]:
        if self._admin is None:
            self._admin = admin_client(self.conn, self.timeout_s)
            # read_uncommitted: the log's end is its high watermark. A read_committed client gets the last stable
            # offset, which an open transaction holds below segments the log has (issue 39: read as a re-creation)
            self._consumer = new_consumer(
                self.conn.client(
                    "consumer", forced={"group.id": "compactd-topic-check", "isolation.level": "read_uncommitted"}
                )
            )
        return self._admin, self._consumer

    def describe(self, topics: Iterable[str]) -> TopicsNow:
        """IDs of `topics`, in requests of DESCRIBE_CHUNK names."""
        from confluent_kafka import KafkaError, KafkaException, TopicCollection

        admin, _ = self._clients()
        names = sorted(set(topics))
        out = TopicsNow()
        for start in range(0, len(names), DESCRIBE_CHUNK):
            futures = admin.describe_topics(
                TopicCollection(names[start : start + DESCRIBE_CHUNK]), request_timeout=self.timeout_s
            )
            for topic, fut in futures.items():
                try:
                    desc = fut.result(self.timeout_s)
                except TimeoutError:
                    # no answer: a request may sit on a node that stopped answering (a stalled broker the client
                    # still counts among the cluster's); the next call asks with new clients
                    self.close()
                    raise
                except KafkaException as exc:
                    err = exc.args[0]
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        out.missing.add(topic)
                    else:
                        out.unknown[topic] = err.str()
                    continue
                out.ids[topic] = str(desc.topic_id) if desc.topic_id is not None else ""
        if out.unknown:  # e.g. "Timed out waiting for controller": the next call asks with new clients
            self.close()
        return out

    def names(self) -> list[str]:
        """Every topic the principal may see, internal ones left out (one Metadata request)."""
        admin, _ = self._clients()
        return sorted(t for t in admin.list_topics(timeout=self.timeout_s).topics if not t.startswith("__"))

    def facts(self, topic: str, partition: int) -> LogFacts | None:
        """The topic's ID and the partition's watermarks now; None when the topic (or the partition) does not exist.
        Other errors raise KafkaException: the caller cannot vouch for the action and holds it."""
        from confluent_kafka import KafkaError, KafkaException

        now = self.describe([topic])
        if topic in now.missing:
            return None
        if topic in now.unknown:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN, now.unknown[topic]))
        _, consumer = self._clients()
        try:
            low, high = watermarks(consumer, topic, partition, self.timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            self.close()  # a leader that moved: the next call asks with new clients
            raise
        return LogFacts(now.ids.get(topic) or None, low, high)

    def close(self) -> None:
        # retired, not closed: a request of either may still be out, or another thread inside a call on it; freed
        # once the last reference goes
        retire(self._admin)
        retire(self._consumer)
        self._admin = self._consumer = None
