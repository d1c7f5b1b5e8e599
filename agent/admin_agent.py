"""`compactd agent --admin`: one per cluster, on any host with client access. Each poll asks the Admin API what
every client may ask — ListGroups and OffsetFetch (through kafka.groups.GroupReader, the same reader as the check
before a delete), ListOffsets earliest and latest of every partition watched — and publishes what changed as the
events the job already consumes (agent/admin_poll.py): commits to the commits topic, retention facts to the
segments topic. Requests of one kind go out together (librdkafka batches ListOffsets per leader; one OffsetFetch
per group, all in flight).

The broker's cleaner is invisible from a client: no `compacted` event is ever published, so KIP-354 nudges cannot be
observed here; the agent says so once at start. The compaction service (a view) needs no broker access at all.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compactd.agent.admin_poll import AdminPoll, Event, poll_mark
from compactd.clock import now_ms
from compactd.kafka.config import KafkaConnection
from compactd.kafka.groups import GroupReader
from compactd.kafka.reader import read_to_end
from compactd.kafka.watermarks import STALE_METADATA
from compactd.kafka.writer import JsonTopicWriter
from compactd.keys import mark_key, partition_key

log = logging.getLogger("compactd.agent")

LIST_CHUNK = 1000  # partitions per ListOffsets call (bench/admin_poll.py)

NUDGES_NOT_OBSERVED = (
    "admin agent: the broker's cleaner cannot be seen from a client, so compaction nudges (KIP-354) are not observed "
    "on this cluster; compacted topics can use compactd's compaction service instead (compaction.service=true)"
)


@dataclass(frozen=True)
class PollStats:
    groups: int
    group_errors: int
    partitions: int
    commit_events: int
    segment_events: int
    calls: int
    seconds: float


class AdminAgent:
    def __init__(
        self,
        conn: KafkaConnection,
        poll: AdminPoll,
        skip_topics: frozenset[str] = frozenset(),
        timeout_s: float = 30.0,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        """`skip_topics`: topics never watched (compactd's own); internal topics (`__*`) never are either."""
        self.conn = conn
        self.poll = poll
        self.skip_topics = skip_topics
        self.timeout_s = timeout_s
        self.clock = clock
        self.groups = GroupReader(conn, timeout_s)
        self.list_calls = 0  # ListOffsets calls made (each one request per partition leader)

    @property
    def admin(self) -> Any:
        """One AdminClient for every request of a poll: the group reader's."""
        return self.groups.admin

    def resume(self, commits_topic: str) -> int:
        """What earlier runs published to the commits topic becomes this run's starting point (AdminPoll.resume);
        records that are not the agent's events are skipped. Returns the groups known."""
        events = []
        for _, value in read_to_end(self.conn, commits_topic, self.timeout_s):
            try:
                ev = json.loads(value) if value is not None else None
            except ValueError:
                continue
            if isinstance(ev, dict):
                events.append(ev)
        return self.poll.resume(events)

    def partitions(self) -> list[tuple[str, int]]:
        meta = self.admin.list_topics(timeout=self.timeout_s)
        return sorted(
            (name, p)
            for name, t in meta.topics.items()
            if not name.startswith("__") and name not in self.skip_topics and t.error is None
            for p in t.partitions
        )

    def _offsets(self, parts: list[tuple[str, int]], spec: Any) -> dict[tuple[str, int], int]:
        """ListOffsets for every partition, LIST_CHUNK partitions per call and every call in flight (librdkafka sends
        one request per leader and call; one call for 10,000 partitions took 5x longer than ten of 1,000)."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

        calls = [
            self.admin.list_offsets(
                {TopicPartition(t, p): spec for t, p in parts[i : i + LIST_CHUNK]},
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=self.timeout_s,
            )
            for i in range(0, len(parts), LIST_CHUNK)
        ]
        self.list_calls += len(calls)
        out = {}
        stale = False
        for tp, fut in (item for futures in calls for item in futures.items()):
            try:
                out[(tp.topic, tp.partition)] = fut.result(timeout=self.timeout_s).offset
            except Exception as exc:  # a partition without a leader now: seen at the next poll
                log.debug("ListOffsets %s/%d: %s", tp.topic, tp.partition, exc)
                stale = stale or not isinstance(exc, KafkaException) or exc.args[0].name() in STALE_METADATA
        if stale:
            # with new clients: librdkafka keeps a leader that left the cluster (a stopped node) in its cache for
            # `metadata.max.age.ms` and answers from it without asking again; "the next poll" would be 30 s away
            self.groups.close()
        return out

    def scan(self) -> tuple[list[Event], list[Event], PollStats]:
        """One poll: (segment events, commit events, its cost). Raises when the cluster cannot list groups or
        topics at all (nothing is published from half an answer)."""
        from confluent_kafka.admin import OffsetSpec

        started = time.monotonic()
        lists, fetches, offset_calls = self.groups.lists, self.groups.fetches, self.list_calls
        listed = self.groups.list_groups()
        fetched = self.groups.fetch(self.poll.groups_to_fetch(listed))
        parts = self.partitions()
        starts = self._offsets(parts, OffsetSpec.earliest())
        ends = self._offsets(parts, OffsetSpec.latest())
        now = self.clock()
        commits = self.poll.offsets(now, listed, fetched)
        seen = {tp: e for tp, e in ends.items() if tp in starts}  # both answered: a partition half read waits
        segments = self.poll.logs_seen(now, starts, seen, set(parts))
        # Admin API calls: ListGroups, one OffsetFetch per group, metadata, the ListOffsets calls (each one request
        # per partition leader). librdkafka adds a FindCoordinator before an OffsetFetch whose coordinator it has not
        # cached: up to twice the OffsetFetch count on the wire (bench/admin_poll.py counts both).
        calls = (self.groups.lists - lists) + (self.groups.fetches - fetches) + 1 + (self.list_calls - offset_calls)
        errors = sum(1 for v in fetched.values() if isinstance(v, Exception))
        stats = PollStats(
            len(fetched), errors, len(seen), len(commits), len(segments), calls, time.monotonic() - started
        )
        return segments, commits, stats

    def close(self) -> None:
        self.groups.close()


class AdminPublisher:
    """Commit events to the commits topic (keyed `<group>/<topic>/<partition>`, a group delete by the group), segment
    events to the segments topic (keyed `<topic>/<partition>`); a poll's events are flushed together, then its mark
    goes to the agent topic (keyed `admin/<cluster>`)."""

    def __init__(self, conn: KafkaConnection, segments_topic: str, commits_topic: str, agent_topic: str) -> None:
        self.segments = JsonTopicWriter(conn, segments_topic, {"linger.ms": 20}, what="segment events")
        self.commits = JsonTopicWriter(conn, commits_topic, {"linger.ms": 20}, what="commit events")
        self.marks = JsonTopicWriter(conn, agent_topic, what="poll marks")

    def publish(self, segments: list[Event], commits: list[Event]) -> None:
        for ev in segments:
            self.segments.write(partition_key(ev["topic"], ev["partition"]), ev)
        for ev in commits:
            key = ev["group"] if ev["type"] == "group_delete" else f"{ev['group']}/{ev['topic']}/{ev['partition']}"
            self.commits.write(key, ev)
        if segments:
            self.segments.flush(30)
        if commits:
            self.commits.flush(30)

    def mark(self, ev: Event) -> None:
        """After `publish` returned: the poll's events are durable, the job may count on them."""
        self.marks.write(mark_key(ev["cluster"]), ev)
        self.marks.flush(30)

    def close(self) -> None:
        self.segments.close()
        self.commits.close()
        self.marks.close()


def run_admin_agent(
    agent: AdminAgent,
    publisher: AdminPublisher,
    interval_s: float,
    stop: threading.Event,
    once: bool = False,
    cluster: str = "default",
) -> None:
    """Poll, publish, mark, every `interval_s`. A poll that fails publishes nothing (and no mark): the job's view of
    the agent ages, it never sees half a poll."""
    log.warning(NUDGES_NOT_OBSERVED)
    polls = 0
    while not stop.is_set():
        before = copy.deepcopy(agent.poll)  # a poll not published is not seen: the next one says it again
        try:
            segments, commits, st = agent.scan()
            publisher.publish(segments, commits)
            polls += 1
            publisher.mark(poll_mark(cluster, polls, agent.clock(), int(interval_s * 1000), st.groups, st.partitions))
        except Exception as exc:  # the cluster away or refusing: the next poll tries again
            agent.poll = before
            log.warning("admin poll failed: %s", (str(exc).splitlines() or [type(exc).__name__])[0])
        else:
            log.info(
                "admin poll: %d groups (%d unreadable), %d partitions, %d commit and %d segment events, "
                "%d admin calls, %.2fs",
                st.groups, st.group_errors, st.partitions, st.commit_events, st.segment_events, st.calls,
                st.seconds,
            )  # fmt: skip
        if once:
            return
        stop.wait(interval_s)
