"""The segment agent: runs beside a broker, turns its log directories into segment events.

Each scan publishes what changed since the last one: `segment_rolled` for closed segments (new, or rewritten by
the cleaner), `compacted` when `cleaner-offset-checkpoint` advances, and `log_start` when
`log-start-offset-checkpoint` advances or the oldest segments disappear. Where the broker's node id is known, it also
reports each replica the broker holds, leader or follower (`replica_log`: its cleaner's checkpoint and its oldest
local segment), when either changes: the erasure across replicas and the local tier of tiered storage.

After a restart everything is published once more, and again every `full_every_ms` (a full re-announce): a state
compactd rebuilt from a segments topic whose retention dropped old events, or reset because the topic was created
again, learns every segment on disk within that time. The events are idempotent downstream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from compactd.agent.admin_poll import Event
from compactd.agent.leaders import Leaders
from compactd.agent.logdir import CheckpointError, SegmentFile, read_checkpoint, scan_log_dir
from compactd.clock import now_ms
from compactd.kafka.config import KafkaConnection
from compactd.kafka.writer import JsonTopicWriter
from compactd.keys import partition_key

log = logging.getLogger("compactd.agent")


FULL_EVERY_MS = 3_600_000


class SegmentAgent:
    def __init__(
        self,
        log_dirs: Iterable[Path],
        clock: Callable[[], int] = now_ms,
        full_every_ms: int = FULL_EVERY_MS,
        leads: Callable[[], set[tuple[str, int]] | None] | None = None,
        node: int | None = None,
        assignment: Callable[[tuple[str, int]], Sequence[int] | None] | None = None,
    ) -> None:
        """`leads`: the partitions this broker leads now (agent/leaders.py; None from it: unknown, nothing is
        published this scan). Without it every partition on disk is published, as for a single-broker cluster.
        `node`: the broker's id, which names its `replica_log` reports (None: none are sent); `assignment`: a
        partition's replicas as the last `leads` read them (agent/leaders.py `Leaders.assignment`; without it, this
        broker alone)."""
        self.log_dirs = [Path(d) for d in log_dirs]
        self.leads = leads
        self.node, self.assignment = node, assignment
        self.clock = clock
        self.full_every_ms = full_every_ms
        self._full_at: int | None = None  # when the last full re-announce began
        self._segments: dict[tuple[str, int, int], tuple[int, int, int, int | None]] = {}
        self._cleaned: dict[tuple[str, int], int] = {}
        self._log_start: dict[tuple[str, int], int] = {}
        self._replica: dict[tuple[str, int], tuple[int | None, int | None, tuple[int, ...]]] = {}
        self._reported: set[tuple[str, str]] = set()
        self.errors = 0

    @classmethod
    def beside(
        cls, log_dirs: Iterable[Path], conn: KafkaConnection, node: int, full_every_ms: int = FULL_EVERY_MS,
        timeout_s: float = 10.0,
    ) -> SegmentAgent:  # fmt: skip
        """The agent beside broker `node` of a cluster, as `compactd agent --log-dir` runs it: it publishes the
        partitions the node leads, and reports every replica the node holds with the partition's assignment, both
        from one metadata request per scan (agent/leaders.py)."""
        leaders = Leaders(conn, node, timeout_s)
        return cls(log_dirs, full_every_ms=full_every_ms, leads=leaders, node=node, assignment=leaders.assignment)

    def _report(self, where: str, error: str) -> None:
        """Each broken file is reported once per distinct problem, not on every scan."""
        if (where, error) not in self._reported:
            self._reported.add((where, error))
            self.errors += 1
            log.warning("%s: %s", where, error)

    def scan(self) -> list[Event]:
        now = self.clock()
        if self._full_at is None or now - self._full_at >= self.full_every_ms:
            self._full_at = now  # forget what was published: this scan publishes everything on disk
            self._segments.clear()
            self._cleaned.clear()
            self._log_start.clear()
            self._replica.clear()
        led = self.leads() if self.leads is not None else None
        if self.leads is not None and led is None:
            return []  # which partitions this broker leads is unknown: nothing a follower's log could say goes out
        events: list[Event] = []
        for log_dir in self.log_dirs:
            try:
                segments = scan_log_dir(log_dir)
            except OSError as exc:
                self._report(str(log_dir), f"cannot scan: {exc}")
                continue
            cleaned = self._checkpoint(log_dir / "cleaner-offset-checkpoint")
            events += self._replica_logs(segments, cleaned, now)
            if led is not None:
                segments = [s for s in segments if (s.topic, s.partition) in led]
            events += self._rolled(segments)
            events += self._compacted(cleaned, now, led)
            events += self._log_starts(log_dir, segments, now, led)
        return events

    def _rolled(self, segments: list[SegmentFile]) -> list[Event]:
        out = []
        for s in segments:
            if s.active:
                continue
            if s.error is not None:
                self._report(s.path, s.error)
                continue
            assert s.end_offset is not None and s.first_batch_max_ts is not None
            key = (s.topic, s.partition, s.base_offset)
            value = (s.end_offset, s.first_batch_max_ts, s.size_bytes, s.last_epoch)
            if self._segments.get(key) == value:
                continue
            self._segments[key] = value
            event = {
                "type": "segment_rolled",
                "topic": s.topic,
                "partition": s.partition,
                "base_offset": s.base_offset,
                "end_offset": s.end_offset,
                "first_batch_max_ts": s.first_batch_max_ts,
                "size_bytes": s.size_bytes,
                "ts": s.mtime_ms,
            }
            if s.last_epoch is not None:  # the send-time check of a delete compares the log's records with it
                event["last_epoch"] = s.last_epoch
            out.append(event)
        return out

    def _checkpoint(self, path: Path) -> Mapping[tuple[str, int], int]:
        try:
            return read_checkpoint(path)
        except (CheckpointError, OSError, UnicodeDecodeError) as exc:
            self._report(str(path), str(exc))
            return {}

    def _replica_logs(
        self, segments: list[SegmentFile], cleaned: Mapping[tuple[str, int], int], now: int
    ) -> list[Event]:
        """This broker's replica of every partition on disk, led or not: its cleaner's checkpoint and its oldest local
        segment, where either (or the partition's assignment) changed since the last report."""
        if self.node is None:
            return []
        local = oldest_bases(segments)
        out = []
        for key in sorted(local.keys() | cleaned.keys()):
            replicas = self.assignment(key) if self.assignment is not None else (self.node,)
            if not replicas or self.node not in replicas:
                continue  # not (or no longer) a replica here as the cluster says: a directory about to go
            value = (cleaned.get(key), local.get(key), tuple(replicas))
            if self._replica.get(key) == value:
                continue
            self._replica[key] = value
            ev: Event = {"type": "replica_log", "topic": key[0], "partition": key[1], "replica": self.node,
                         "replicas": list(replicas), "ts": now}  # fmt: skip
            if value[0] is not None:
                ev["cleaned_up_to"] = value[0]
            if value[1] is not None:
                ev["local_log_start"] = value[1]
            out.append(ev)
        return out

    def _compacted(
        self, checkpoint: Mapping[tuple[str, int], int], now: int, led: set[tuple[str, int]] | None = None
    ) -> list[Event]:
        out = []
        for (topic, p), offset in checkpoint.items():
            if led is not None and (topic, p) not in led:
                continue  # a follower's cleaner: the leader's log is the one readers fetch
            if offset > self._cleaned.get((topic, p), -1):
                self._cleaned[(topic, p)] = offset
                out.append({"type": "compacted", "topic": topic, "partition": p, "cleaned_up_to": offset, "ts": now})
        return out

    def _log_starts(
        self, log_dir: Path, segments: list[SegmentFile], now: int, led: set[tuple[str, int]] | None = None
    ) -> list[Event]:
        """Each partition's log start. Kafka writes a partition into `log-start-offset-checkpoint` when its log start
        is inside its oldest local segment (above that segment's base) or when the topic has tiered storage (KIP-405;
        LogManager's `checkpointLogStartOffsetsInDir`): there the file holds the log start, below the local tier, where
        the remote segments begin. Elsewhere the oldest segment on disk starts the log. An entry left from before the
        oldest segments went stays until the broker rewrites the file (`log.flush.start.offset.checkpoint.interval.ms`):
        until then the log start published is behind, never ahead (the state keeps the largest it was given).

        Before: the larger of the two was published, and on a tiered topic that was the local tier's start: the
        offsets in the remote tier read as deleted."""
        starts = {
            tp: o
            for tp, o in self._checkpoint(log_dir / "log-start-offset-checkpoint").items()
            if led is None or tp in led
        }
        starts.update({key: base for key, base in oldest_bases(segments).items() if key not in starts})
        out = []
        for (topic, p), offset in sorted(starts.items()):
            if offset > self._log_start.get((topic, p), 0):
                self._log_start[(topic, p)] = offset
                out.append({"type": "log_start", "topic": topic, "partition": p, "log_start_offset": offset, "ts": now})
        return out


def oldest_bases(segments: Iterable[SegmentFile]) -> dict[tuple[str, int], int]:
    """Each partition's oldest segment on disk (its base offset): where the replica's local log starts."""
    out: dict[tuple[str, int], int] = {}
    for s in segments:
        key = (s.topic, s.partition)
        out[key] = min(out.get(key, s.base_offset), s.base_offset)
    return out


class KafkaPublisher:
    """Segment events to the segments topic, keyed `<topic>/<partition>`; a scan's events are flushed together."""

    def __init__(self, conn: KafkaConnection, topic: str) -> None:
        self.topic = topic
        self._writer = JsonTopicWriter(conn, topic, {"linger.ms": 20}, what="segment events")

    def publish(self, events: list[Event]) -> None:
        for ev in events:
            self._writer.write(partition_key(ev["topic"], ev["partition"]), ev)
        if events:
            self._writer.flush(30)

    def close(self) -> None:
        self._writer.close()


def run_agent(
    agent: SegmentAgent, publisher: KafkaPublisher, interval_s: float, stop: threading.Event, once: bool = False
) -> None:
    while not stop.is_set():
        events = agent.scan()
        publisher.publish(events)
        if events:
            log.info("published %d segment events", len(events))
        if once:
            return
        stop.wait(interval_s)
