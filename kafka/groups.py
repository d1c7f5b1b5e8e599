"""Consumer groups' committed offsets as the cluster itself has them (ListGroups + OffsetFetch).

The last word on what a real Kafka group has read: right before a consumed-retention delete is sent, the
controller compares it with these offsets, so no fault in compactd's own state (Redis losing writes, a bug, a
decoder missing a record) can delete what a group has not committed past — KAFKA-17635's lesson.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from compactd.errors import DependencyUnavailable
from compactd.kafka.admin import admin_client
from compactd.kafka.config import KafkaConnection

# group -> partition -> committed offset, for one topic
TopicCommits = dict[str, dict[int, int]]


class ClusterGroupOffsets:
    """Every group's committed offsets, fetched in one round of requests and kept `ttl_s` seconds.

    One OffsetFetch per group (librdkafka asks one group per request), all in flight at once. Any failure — the
    cluster unreachable, a group that cannot be read — raises `DependencyUnavailable`: the caller must then send
    no delete. compactd's principal needs Describe on the groups: a group it may not see cannot be checked.
    """

    def __init__(
        self,
        conn: KafkaConnection,
        ttl_s: float = 5.0,
        timeout_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conn = conn
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.monotonic = monotonic
        self._admin: Any = None
        self._snapshot: dict[str, dict[tuple[str, int], int]] | None = None
        self._taken = 0.0
        self._lock = threading.Lock()
        self.fetches = 0  # how many snapshots were taken from the cluster (tests and metrics read it)

    def committed(self, topic: str) -> TopicCommits:
        """Groups with a committed offset on `topic`, and their offset on each partition they committed."""
        with self._lock:
            if self._snapshot is None or self.monotonic() - self._taken >= self.ttl_s:
                self._snapshot = self._fetch()
                self._taken = self.monotonic()
                self.fetches += 1
            snapshot = self._snapshot
        out: TopicCommits = {}
        for group, offsets in snapshot.items():
            for (t, p), off in offsets.items():
                if t == topic:
                    out.setdefault(group, {})[p] = off
        return out

    def _fetch(self) -> dict[str, dict[tuple[str, int], int]]:
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

        try:
            if self._admin is None:
                self._admin = admin_client(self.conn, self.timeout_s)
            listed = self._admin.list_consumer_groups(request_timeout=self.timeout_s).result(self.timeout_s)
            if listed.errors:
                raise KafkaException(listed.errors[0])
            groups = sorted({g.group_id for g in listed.valid})
            futures = [
                (g, fut)
                for g in groups
                for fut in self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(g)], request_timeout=self.timeout_s
                ).values()
            ]
            out: dict[str, dict[tuple[str, int], int]] = {}
            for group, fut in futures:
                result = fut.result(self.timeout_s)
                for tp in result.topic_partitions:
                    if tp.error is not None:
                        raise KafkaException(tp.error)
                    if tp.offset >= 0:  # -1001: no committed offset on that partition
                        out.setdefault(group, {})[(tp.topic, tp.partition)] = tp.offset
            return out
        except Exception as exc:  # every failure means the same thing here: no delete this round
            cause = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
            text = cause.str() if hasattr(cause, "str") else str(cause)
            raise DependencyUnavailable(
                "Kafka (group offsets)", self.conn.bootstrap_servers, "--bootstrap-servers / bootstrap_servers", text
            ) from None

    def close(self) -> None:
        self._admin = None
