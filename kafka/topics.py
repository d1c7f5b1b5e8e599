"""Which log a topic is right now, as the cluster says: its topic ID (KIP-516), whether it exists, and a partition's
watermarks. Read right before an action goes (control/identity.py) and by a periodic sweep of the known topics.

DescribeTopics asks by name: unlike a whole-cluster Metadata request, which silently leaves out the topics the
principal may not Describe, it answers UNKNOWN_TOPIC_OR_PART only for a topic that does not exist, and an
authorization error for one it may not see (never mistaken for a deleted topic).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from compactd.kafka.admin import admin_client, retire
from compactd.kafka.config import KafkaConnection, new_consumer
from compactd.kafka.watermarks import watermarks
from compactd.policy.identity import LogFacts

DESCRIBE_CHUNK = 1000  # topics per DescribeTopics request
LOOKBACK = 64  # offsets below a commit read at once for its last record; past them, a binary search


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
        self._reader: Any = None  # reads the last record below a group's commit (`last_record_below`)
        # one reader, assigned per read: the compaction trigger and a run's thread share one ClusterTopics
        self._reading = threading.RLock()

    def _clients(self) -> tuple[Any, Any]:
        if self._admin is None:
            self._admin = admin_client(self.conn, self.timeout_s)
            # read_uncommitted: the log's end is its high watermark. A read_committed client gets the last stable
            # offset, which an open transaction holds below segments the log has (once read as a re-creation)
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

    def leader_epoch(self, topic: str, partition: int) -> tuple[int, int]:
        """(high watermark, the partition's current leader epoch) from its leader: ListOffsets latest, which needs
        Describe on the topic only. Raises KafkaException when the leader cannot answer."""
        from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        admin, _ = self._clients()
        tp = TopicPartition(topic, partition)
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest()},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=self.timeout_s,
        )
        try:
            got = next(iter(futures.values())).result(self.timeout_s)
        except TimeoutError:
            self.close()
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "ListOffsets had no answer in time")) from None
        except KafkaException:
            self.close()
            raise
        return got.offset, got.leader_epoch if got.leader_epoch is not None else -1

    def last_record_below(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """(offset, leader epoch) of the last record below `offset` in the log now (epoch -1: the record carries
        none, magic 0/1); None when the log holds no record below it (a delete up to it removes nothing). Needs
        Read on the topic; raises KafkaException when the log cannot be read.

        First the LOOKBACK offsets right below (one read); then, where they hold no record (a transaction's markers,
        or a `compact,delete` log the cleaner thinned: issue 64 found a commit's record far back, and none found was
        taken as no evidence), a binary search down to the log start: one fetch a step, each asking for the first
        record at or after a position. A log has no way to be read backwards; this takes about log2(offsets) fetches,
        however far the record is."""
        if offset <= 0:
            return None
        with self._reading:
            return self._last_record_below(topic, partition, offset)

    def _last_record_below(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        from confluent_kafka import TopicPartition

        reader = self._record_reader()
        found = self._first_in(reader, topic, partition, max(0, offset - LOOKBACK), offset, last=True)
        if found is None:
            low, _ = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout_s)
            lo, hi = max(0, low), max(0, offset - LOOKBACK)  # a record in [lo, hi) is what is looked for
            found = self._first_in(reader, topic, partition, lo, hi) if lo < hi else None
            while found is not None and found[0] + 1 < hi:  # no record in [hi, offset); any in (found, hi)?
                mid = (found[0] + 1 + hi) // 2
                later = self._first_in(reader, topic, partition, mid, hi)
                if later is None:
                    hi = mid
                else:
                    found = later
        return found

    def first_record_after(self, topic: str, partition: int, start: int, end: int, epoch: int) -> tuple[int, bool]:
        """Where the log in [start, end) stops being what leader epoch `epoch` wrote: (the offset of the first record
        written under a later epoch, whether it is the range's first record). An unclean leader election truncates
        a log and its new leader writes from there under a later epoch; epochs only rise along a log, so a binary
        search over positions finds that offset in about log2(end - start) fetches. The caller knows a later
        record lies below `end`; where none does (the log changed again meanwhile), (end, False)."""
        with self._reading:
            return self._first_record_after(topic, partition, start, end, epoch)

    def _first_record_after(self, topic: str, partition: int, start: int, end: int, epoch: int) -> tuple[int, bool]:
        reader = self._record_reader()
        first = self._first_in(reader, topic, partition, start, end)
        if first is None:
            return end, False
        if first[1] > epoch or first[1] < 0:
            return first[0], True
        known = self._first_later(reader, topic, partition, first[0] + 1, end, epoch)
        if known is None:
            return end, False
        lo, hi = first[0] + 1, known  # the smallest position whose first record is a later epoch's, in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            found = self._first_in(reader, topic, partition, mid, known + 1)
            if found is None:  # `known` itself is gone: the log changed again under the search
                break
            if found[1] > epoch:
                hi, known = mid, found[0]
            else:
                lo = found[0] + 1
        return known, False

    def _first_later(self, reader: Any, topic: str, partition: int, start: int, end: int, epoch: int) -> int | None:
        """The offset of a record of a later epoch than `epoch` in [start, end): the last record below `end`."""
        last = self.last_record_below(topic, partition, end)
        if last is None or last[0] < start or last[1] <= epoch:
            return None
        return last[0]

    def _record_reader(self) -> Any:
        if self._reader is None:
            self._reader = new_consumer(
                self.conn.client(
                    "consumer",
                    forced={
                        "group.id": "compactd-topic-check",
                        "isolation.level": "read_uncommitted",
                        "enable.partition.eof": True,
                        "enable.auto.commit": False,
                        "fetch.wait.max.ms": 10,  # a position with nothing after it: EOF at once, not in 500 ms
                    },
                )
            )
        return self._reader

    def _first_in(
        self, reader: Any, topic: str, partition: int, start: int, end: int, last: bool = False
    ) -> tuple[int, int] | None:
        """(offset, epoch) of the first record in [start, end) (`last`: of the last one, reading them all), or None
        when there is none."""
        from confluent_kafka import TopicPartition

        reader.assign([TopicPartition(topic, partition, start)])
        try:
            return self._read_up_to(reader, end, first=not last)
        finally:
            reader.unassign()

    def _read_up_to(self, reader: Any, offset: int, first: bool = False) -> tuple[int, int] | None:
        """The last (`first`: the first) record the assigned reader returns below `offset` before it reaches
        `offset` or the log's end."""
        import time

        from confluent_kafka import KafkaError, KafkaException

        last: tuple[int, int] | None = None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for msg in reader.consume(1 if first else LOOKBACK, timeout=min(1.0, self.timeout_s)):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return last
                    self.close()
                    raise KafkaException(err)
                if msg.offset() >= offset:
                    return last
                epoch = msg.leader_epoch()
                last = (msg.offset(), epoch if epoch is not None else -1)
                if first:
                    return last
        self.close()
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no record read below offset {offset} in time"))

    def close(self) -> None:
        # retired, not closed: a request of either may still be out, or another thread inside a call on it; freed
        # once the last reference goes
        retire(self._admin)
        retire(self._consumer)
        retire(self._reader)
        self._admin = self._consumer = self._reader = None
