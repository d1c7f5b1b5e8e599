"""What `compactd agent --admin` makes of its polls: the events the job already consumes, from the Admin API alone.

Where compactd is only a client of the cluster (Amazon MSK, Confluent Cloud, Aiven, a Strimzi cluster without
sidecars) there are no log directories to read and `__consumer_offsets` is not readable. Every poll asks the cluster
what any client may ask, and this module turns two consecutive answers into events. Pure: no IO, the clock is given.

Offsets (to the commits topic):
- `offset_commit` for each (group, topic, partition) whose committed offset changed since the last poll;
- `offset_delete` when a committed offset is gone from a group that was read;
- `group_delete` once a group has not been listed for `group_grace_ms` (a group listed again within the grace was
  only missing from one answer). A group whose fetch failed keeps its offsets: nothing is deleted on an error.

Retention facts (to the segments topic):
- `log_start` when ListOffsets(earliest) moved;
- *time slices* as `segment_rolled`: the offsets written since the last closed slice form an open slice (the active
  segment of this source), closed once it spans `slice_ms`, or at the next poll after its partition goes quiet. A
  record of a slice was written after the poll that first saw the slice's start and no later than the poll that
  saw its end: `first_batch_max_ts` and `ts` take those bounds, so a slice is never older than its records. The
  log a first poll finds is one slice, closed at once with `ts` = that poll: its age is counted from then, so
  retention on it starts late, never early. A quiet partition costs nothing per poll (no event).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compactd.model import PartitionOffsets, PartitionRef

Event = dict[str, Any]


@dataclass
class _Log:
    start: int  # log start offset at the last poll
    end: int  # log end offset at the last poll
    open_from: int  # first offset of the open slice (== end: no open slice)
    open_since: int  # poll time before which no record of the open slice was written
    last_write: int  # the poll that last saw the end move: no record of the slice is younger


@dataclass
class PollResult:
    segments: list[Event]
    commits: list[Event]


class AdminPoll:
    def __init__(self, slice_ms: int, group_grace_ms: int, counts: Callable[[str], bool] = lambda g: True) -> None:
        """`counts(group)`: whether the group is read at all (`groups.include` / `groups.exclude`)."""
        self.slice_ms = slice_ms
        self.group_grace_ms = group_grace_ms
        self.counts = counts
        self.logs: dict[PartitionRef, _Log] = {}
        self.committed: dict[str, dict[PartitionRef, int]] = {}  # group -> its offsets as last published
        self.missing_since: dict[str, int] = {}  # group -> the first poll that did not list it
        self.polled_at: int | None = None

    # -- offsets
    def resume(self, published: Iterable[Event]) -> int:
        """Take the offsets an earlier run published (the commits topic read from its start) as published: a group
        deleted while the agent was down is then deleted after the grace, not held for good. Events are applied in
        `ts` order (a group's deletion and its commits may sit in different partitions). Returns the groups known."""
        for ev in sorted(published, key=lambda e: int(e.get("ts", 0))):
            kind, group = ev.get("type"), ev.get("group")
            if not isinstance(group, str):
                continue
            if kind == "offset_commit":
                self.committed.setdefault(group, {})[(ev["topic"], int(ev["partition"]))] = int(ev["offset"])
            elif kind == "offset_delete":
                self.committed.get(group, {}).pop((ev["topic"], int(ev["partition"])), None)
            elif kind == "group_delete":
                self.committed.pop(group, None)
        return len(self.committed)

    def groups_to_fetch(self, listed: set[str]) -> list[str]:
        return sorted(g for g in listed if self.counts(g))

    def offsets(self, now: int, listed: set[str], fetched: Mapping[str, PartitionOffsets | Exception]) -> list[Event]:
        """Events for one poll's ListGroups (`listed`) and OffsetFetch answers (`fetched`, a group's error kept as
        its answer)."""
        out: list[Event] = []
        for group in sorted(fetched):
            got = fetched[group]
            if isinstance(got, Exception):
                continue  # its offsets stand as they were: an error never deletes
            before = self.committed.get(group, {})
            for (topic, p), off in sorted(got.items()):
                if before.get((topic, p)) != off:
                    out.append(_commit(group, topic, p, off, now))
            for topic, p in sorted(before.keys() - got.keys()):
                out.append({"type": "offset_delete", "group": group, "topic": topic, "partition": p, "ts": now})
            self.committed[group] = dict(got)
        for group in listed:
            self.missing_since.pop(group, None)
        for group in sorted(self.committed.keys() - listed):
            since = self.missing_since.setdefault(group, now)
            if now - since >= self.group_grace_ms:
                out.append({"type": "group_delete", "group": group, "ts": now})
                del self.committed[group]
                del self.missing_since[group]
        return out

    # -- logs
    def logs_seen(
        self, now: int, starts: PartitionOffsets, ends: PartitionOffsets, watched: set[PartitionRef] | None = None
    ) -> list[Event]:
        """Events for one poll's ListOffsets earliest (`starts`) and latest (`ends`). `watched`: every partition the
        cluster has (default: those answered); one missing from it is gone, one not answered waits for a poll."""
        out: list[Event] = []
        before = self.polled_at
        for tp in sorted(ends):
            topic, p = tp
            start, end = starts.get(tp, 0), ends[tp]
            lg = self.logs.get(tp)
            if lg is None or end < lg.end or start < lg.start:  # first seen, or another log (re-created)
                self.logs[tp] = _Log(start, end, end, now, now)
                if end > start:  # what the log already holds: one slice, as old as this poll at most
                    out.append(_slice(topic, p, start, end, now, now))
                out.append(_log_start(topic, p, start, now))
                continue
            if start > lg.start:
                lg.start = start
                out.append(_log_start(topic, p, start, now))
            if end > lg.end:
                if lg.open_from == lg.end:  # a new open slice: its records were written after the last poll
                    lg.open_from, lg.open_since = lg.end, before if before is not None else now
                lg.end, lg.last_write = end, now
            quiet = lg.last_write < now
            if lg.open_from < lg.end and (quiet or now - lg.open_since >= self.slice_ms):
                out.append(_slice(topic, p, lg.open_from, lg.end, lg.open_since, lg.last_write))
                lg.open_from = lg.end
        for tp in sorted(self.logs.keys() - (ends.keys() if watched is None else watched)):
            del self.logs[tp]  # the topic is gone: a new one starts as first seen
        self.polled_at = now
        return out


def _commit(group: str, topic: str, p: int, offset: int, now: int) -> Event:
    return {"type": "offset_commit", "group": group, "topic": topic, "partition": p, "offset": offset, "ts": now}


def _slice(topic: str, p: int, base: int, end: int, first_ts: int, closed: int) -> Event:
    return {
        "type": "segment_rolled",
        "topic": topic,
        "partition": p,
        "base_offset": base,
        "end_offset": end,
        "first_batch_max_ts": first_ts,
        "size_bytes": 0,  # the Admin API does not say (DescribeLogDirs needs more than a client's ACLs)
        "ts": closed,
    }


def _log_start(topic: str, p: int, start: int, now: int) -> Event:
    return {"type": "log_start", "topic": topic, "partition": p, "log_start_offset": start, "ts": now}


def poll_mark(cluster: str, poll: int, now: int, interval_ms: int, groups: int, partitions: int) -> Event:
    """Written after a poll's events are flushed: the job's readiness gate opens only once a mark exists (every
    group's offsets of a complete poll are on the commits topic before it), and its age tells the job whether the
    agent still polls. The cleaner is never visible from the Admin API."""
    return {
        "type": "admin_poll",
        "cluster": cluster,
        "poll": poll,
        "at": now,
        "interval_ms": interval_ms,
        "groups": groups,
        "partitions": partitions,
        "cleaner_visible": False,
    }
