"""Reading partition state: views for the controller, numbers in bulk, and what `compactd explain` shows. Kept
apart from the writes so the packed read scripts and their plain-command references sit together."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from compactd.keys import partition_key
from compactd.model import ActionRecord, PartitionNumbers, PartitionView, ReplicaState, Segment
from compactd.state.keys import OFFSET_BUCKET
from compactd.state.outbox_store import _records
from compactd.state.store_base import StoreBase, _s

LOWEST = 4  # counted groups read per partition for `compactd explain` (the lowest first; ties beyond are rare)


@dataclass(frozen=True)
class TopicGroups:
    """A topic's partitions and groups as `compactd explain` reports them."""

    size: int  # partitions compactd knows on the topic
    partitions: frozenset[int]  # all of them, or the one asked for if known
    ids: dict[str, str]  # group -> per-topic id (lua/offsets.lua)
    counted: frozenset[str]  # groups that hold the topic back (groups.include/exclude)
    assigned: frozenset[str]  # groups with members assigned to the topic
    commit_ts: dict[str, int]  # group -> its latest offset commit time on the topic (epoch ms)


@dataclass(frozen=True)
class PartitionDetail:
    """One partition as `compactd explain` reads it."""

    view: PartitionView
    lowest: tuple[tuple[str, int], ...]  # (group, offset) of the counted groups with the lowest offsets, lowest first
    positioned: frozenset[str] | None  # counted groups with an offset here; read only when the minimum is unknown
    records: tuple[ActionRecord, ...]  # live action records (in the outbox, or sent and not yet answered)
    last: ActionRecord | None  # the last completed action
    deadline: int | None  # next evaluation the job has scheduled


def decode_partition_record(raw: bytes | None) -> tuple[list[tuple[str, int]], list[str]]:
    """A partition's packed record (lua/part.lua) as the fields and segment members the layout before it held:
    ([("cleaned", n)?, ("cleaned_at", ms)?, ("log_start", n)?], ["base:end:ts:size:closed", ...]). Decoded here
    independently of the scripts, for the pipelined reference read. The clean's time, where known, is a second
    MessagePack value after the array: read as the second item of an array of two (0x92 + the record), which a record
    of the array alone is too short to be."""
    if raw is None:
        return [], []
    try:
        a, cleaned_at = msgspec.msgpack.decode(b"\x92" + raw)
    except msgspec.DecodeError:
        a, cleaned_at = msgspec.msgpack.decode(raw), None
    fields = ([("cleaned", a[0])] if a[0] >= 0 else []) + [("log_start", a[1])]
    fields += [] if cleaned_at is None else [("cleaned_at", cleaned_at)]
    segs, prev_end, prev_closed = [], 0, 0
    for i in range(2, len(a), 5):
        base = prev_end + a[i]
        end = base + a[i + 1]
        closed = prev_closed + a[i + 4]
        segs.append(f"{base}:{end}:{closed - a[i + 2]}:{a[i + 3]}:{closed}")
        prev_end, prev_closed = end, closed
    return fields, segs


def _partition_view(
    topic: str,
    n: int,
    fields: Iterable[tuple[Any, Any]],
    segments: Iterable[Any],
    lowest: Any,
    zcard: int,
    counted: int,
) -> PartitionView:
    """A partition's view from its reads: its record's fields and segment members, the lowest offset of the counted
    groups, how many counted groups have an offset on it (`zcard`), and the topic's number of counted groups."""
    h = {_s(k): int(v) for k, v in fields}
    known = counted > 0 and zcard == counted
    return PartitionView(
        topic=topic,
        partition=n,
        segments=tuple(Segment(*map(int, _s(m).split(":"))) for m in segments),
        cleaned_up_to=h.get("cleaned"),
        log_start=h.get("log_start", 0),
        min_committed=int(lowest) if known and lowest is not None else None,
        counted_groups=counted,
        cleaned_at=h.get("cleaned_at"),
    )


class ReadStore(StoreBase):
    """Topics, partitions, views, explain details and group offsets, read without changing anything."""

    def topics(self) -> list[str]:
        return sorted(_s(t) for t in self.r.smembers(self.k_topics))

    def partitions(self, topic: str) -> list[int]:
        return sorted(int(_s(n)) for n in self.r.smembers(self.keys.partitions(topic)))

    def segments_known(self, topic: str, sample: int = 8) -> bool:
        """Whether compactd has segment events of the topic: a few partitions tell, segment events come for all of a
        topic's partitions or none (the compaction service's retention takeover needs them)."""
        return any(v.segments for v in self.views([(topic, p) for p in self.partitions(topic)[:sample]]))

    def all_partitions(self) -> list[tuple[str, int]]:
        """Every partition of every topic, sorted: one pipelined round trip per thousand topics (a round trip per
        topic was most of the 0.7 s `run --once` spent on this at 259k partitions in 1,000 topics)."""
        out: list[tuple[str, int]] = []
        topics = self.topics()
        for start in range(0, len(topics), 1000):
            chunk = topics[start : start + 1000]
            pipe = self.r.pipeline(transaction=False)
            for topic in chunk:
                pipe.smembers(self.keys.partitions(topic))
            for topic, members in zip(chunk, pipe.execute(), strict=True):
                out.extend((topic, n) for n in sorted(map(int, members)))
        return out

    def views(self, keys: Iterable[tuple[str, int]]) -> list[PartitionView]:
        """Read many partitions: one script call per topic, its answer packed (lua/views.lua). The client's cost is
        one MessagePack decode per topic instead of packing and parsing six commands per partition."""
        keys = list(keys)
        by_topic: dict[str, list[int]] = {}
        for topic, n in keys:
            by_topic.setdefault(topic, []).append(n)
        script = self._script("views")
        read: dict[tuple[str, int], PartitionView] = {}
        for topic, parts in by_topic.items():
            counted, rows, reps = msgspec.msgpack.decode(script(keys=[self.keys.topic_base(topic)], args=parts))
            replicas: dict[int, list[ReplicaState]] = {}
            for i in range(0, len(reps), 6):  # row, replica, cleaned, seen, reported, local (-1: none)
                row, replica, cleaned, seen, reported, local = reps[i : i + 6]
                replicas.setdefault(parts[row], []).append(
                    ReplicaState(
                        replica, *(None if x < 0 else x for x in (cleaned, seen, local)), reported=bool(reported)
                    )
                )
            for row in rows:
                n, cleaned, log_start, lowest, zcard, cleaned_at = row[:6]
                read[(topic, n)] = PartitionView(
                    topic=topic,
                    partition=n,
                    segments=tuple(Segment(*map(int, m.split(":"))) for m in row[6:]),
                    cleaned_up_to=None if cleaned is False else cleaned,
                    log_start=0 if log_start is False else log_start,
                    min_committed=lowest if counted > 0 and zcard == counted and lowest is not False else None,
                    counted_groups=counted,
                    cleaned_at=None if cleaned_at is False else cleaned_at,
                    replicas=tuple(replicas.get(n, ())),
                )
        return [read[k] for k in keys]

    def replica_logs(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[ReplicaState, ...]]:
        """Each partition's replicas and their own logs, where agents report them (lua/replicas.lua has the fields;
        explain_rank.lua reads the cleaners in bulk): the replica assignment first, then its replicas."""
        key = self.keys.replica_logs(topic)
        sets = self.r.hmget(key, [str(n) for n in partitions]) if partitions else []
        wanted = [
            (n, int(r))
            for n, raw in zip(partitions, sets, strict=True)
            if raw is not None
            for r in _s(raw).split("@")[0].split(",")
            if r
        ]
        if not wanted:
            return {}
        out: dict[int, list[ReplicaState]] = {}
        for (n, r), v in zip(wanted, self.r.hmget(key, [f"{n}:{r}" for n, r in wanted]), strict=True):
            if v is None:
                out.setdefault(n, []).append(ReplicaState(r))
                continue
            cleaned, seen, _, local = (int(x) for x in _s(v).split(":"))
            out.setdefault(n, []).append(
                ReplicaState(r, None if cleaned < 0 else cleaned, None if seen < 0 else seen,
                           None if local < 0 else local, reported=True)
            )  # fmt: skip
        return {n: tuple(v) for n, v in out.items()}

    def segment_epochs(self, topic: str, partition: int, bases: Sequence[int]) -> dict[int, int]:
        """base offset -> the leader epoch of that segment's last record, for the segments of `bases` whose report
        gave one (lua/merge.lua)."""
        if not bases:
            return {}
        got = self.r.hmget(self.keys.segment_epochs(topic), [f"{partition}:{b}" for b in bases])
        return {b: int(v) for b, v in zip(bases, got, strict=True) if v is not None}

    def views_pipelined(self, keys: Iterable[tuple[str, int]]) -> list[PartitionView]:
        """The same read as `views`, in plain commands (each topic's counted groups and ids, then per key its record
        and each counted group's offset), with the minimum computed here: the reference `views` is tested against."""
        keys = list(keys)
        k = self.keys
        topics = sorted({t for t, _ in keys})
        pipe = self.r.pipeline(transaction=False)
        for topic in topics:
            pipe.smembers(k.counted_groups(topic))
            pipe.hgetall(k.group_ids(topic))
        res = pipe.execute()
        counted_in: dict[str, int] = {}
        ids_in: dict[str, list[str]] = {}
        for i, topic in enumerate(topics):
            names, ids = res[2 * i], {_s(g): _s(v) for g, v in res[2 * i + 1].items()}
            counted_in[topic] = len(names)
            ids_in[topic] = [ids[_s(g)] for g in names if _s(g) in ids]
        pipe = self.r.pipeline(transaction=False)
        for topic, n in keys:
            pipe.hget(k.partition_records(topic, n), str(n))
            for gid in ids_in[topic]:
                pipe.hget(k.offset_bucket(topic, gid, n // OFFSET_BUCKET), str(n))
        res = pipe.execute()
        out, at = [], 0
        for topic, n in keys:
            raw, offsets = res[at], [int(o) for o in res[at + 1 : at + 1 + len(ids_in[topic])] if o is not None]
            at += 1 + len(ids_in[topic])
            fields, segs = decode_partition_record(raw)
            lowest = min(offsets) if offsets else None
            out.append(_partition_view(topic, n, fields, segs, lowest, len(offsets), counted_in[topic]))
        cleans = {t: self.replica_logs(t, sorted({n for tt, n in keys if tt == t})) for t in topics}
        return [dataclasses.replace(v, replicas=cleans[v.topic].get(v.partition, ())) for v in out]

    def view(self, topic: str, partition: int) -> PartitionView:
        return self.views([(topic, partition)])[0]

    def topic_groups(self, topic: str, partition: int | None = None) -> TopicGroups:
        """A topic's partitions (all of them, or whether it has `partition`) and groups (ids, counted, assigned,
        latest commit times), in one round trip."""
        k = self.keys
        pipe = self.r.pipeline(transaction=False)
        pipe.scard(k.partitions(topic))
        if partition is None:
            pipe.smembers(k.partitions(topic))
        else:
            pipe.sismember(k.partitions(topic), partition)
        pipe.hgetall(k.group_ids(topic))
        pipe.smembers(k.counted_groups(topic))
        pipe.smembers(k.assigned_groups(topic))
        pipe.hgetall(k.commit_times(topic))
        size, parts, ids, counted, assigned, times = pipe.execute()
        ids = {_s(g): _s(i) for g, i in ids.items()}
        names = {i: g for g, i in ids.items()}
        if partition is not None:
            parts = [partition] if parts else []
        return TopicGroups(
            size=int(size),
            partitions=frozenset(int(_s(n)) if not isinstance(n, int) else n for n in parts),
            ids=ids,
            counted=frozenset(_s(g) for g in counted),
            assigned=frozenset(_s(g) for g in assigned),
            commit_ts={names[_s(i)]: int(ts) for i, ts in times.items() if _s(i) in names},
        )

    def partition_details(self, topic: str, partitions: list[int], groups: TopicGroups) -> list[PartitionDetail]:
        """What `compactd explain` needs per partition: view, lowest counted groups (all of them where the minimum is
        unknown), live and last records, deadline. One round trip for the chunk (two on a cluster, where redis-py
        does not pipeline scripts); the topic's part comes back from lua/explain.lua as one JSON string."""
        names = {i: g for g, i in groups.ids.items()}
        members = [partition_key(topic, n) for n in partitions]
        script = self._script("explain")
        args = [LOWEST, *partitions]
        pipe = self.r.pipeline(transaction=False)
        if not self.cluster:
            script(keys=[self.topic_base(topic)], args=args, client=pipe)
        pipe.hmget(self.k_rec, [f"{m}/{a}" for m in members for a in ("compact", "delete_records")])
        pipe.hmget(self.k_last, members)
        pipe.zmscore(self.k_deadlines, members)
        res = pipe.execute()
        raw = script(keys=[self.topic_base(topic)], args=args) if self.cluster else res.pop(0)
        recs, last, deadlines = res
        counted, rows = json.loads(raw)
        cleans = self.replica_logs(topic, partitions)
        out = []
        for i, (n, (h, segs, zcard, low, ids)) in enumerate(zip(partitions, rows or [], strict=True)):
            h, low = h or [], low or []
            lowest = tuple((names.get(low[j], f"#{low[j]}"), int(low[j + 1])) for j in range(0, len(low), 2))
            out.append(
                PartitionDetail(
                    view=dataclasses.replace(
                        _partition_view(
                            topic,
                            n,
                            zip(h[::2], h[1::2], strict=True),
                            segs or [],
                            low[1] if low else None,
                            zcard,
                            counted,
                        ),
                        replicas=cleans.get(n, ()),
                    ),
                    lowest=lowest,
                    positioned=None if ids is False else frozenset(names.get(m, f"#{m}") for m in ids or []),
                    records=tuple(ActionRecord.from_json(r) for r in recs[2 * i : 2 * i + 2] if r is not None),
                    last=None if last[i] is None else ActionRecord.from_json(last[i]),
                    deadline=None if deadlines[i] is None else int(deadlines[i]),
                )
            )
        return out

    def partition_numbers(self, topic: str, partitions: list[int]) -> PartitionNumbers:
        """A chunk of one topic's partitions as numbers (what `compactd explain TOPIC` ranks by and the controller
        evaluates in bulk): one read-only script call returning one MessagePack array (lua/explain_rank.lua)."""
        raw = self._script("explain_rank")(keys=[self.topic_base(topic)], args=[" ".join(map(str, partitions))])
        return _numbers(topic, partitions, raw)

    def read_chunks(
        self, chunks: Sequence[tuple[str, list[int]]]
    ) -> list[tuple[PartitionNumbers, dict[int, list[ActionRecord]]]]:
        """`partition_numbers` and `live_records` of several topics' chunks. On a single server in one pipelined
        round trip: one per topic was most of an evaluation's wait at a million partitions, where a chunk spans
        eight topics. On a cluster, where redis-py does not pipeline scripts, one call each."""
        if self.cluster or len(chunks) < 2:
            return [(self.partition_numbers(t, ps), self.live_records(t, ps)) for t, ps in chunks]
        rank, live = self._script("explain_rank"), self._script("live_records")
        pipe = self.r.pipeline(transaction=False)
        for topic, parts in chunks:
            listed = " ".join(map(str, parts))
            rank(keys=[self.topic_base(topic)], args=[listed], client=pipe)
            live(keys=[self.k_rec], args=[topic, listed], client=pipe)
        res = pipe.execute()
        return [
            (_numbers(topic, parts, res[2 * i]), _records(res[2 * i + 1])) for i, (topic, parts) in enumerate(chunks)
        ]

    def live_deletes(self, topic: str) -> dict[int, ActionRecord]:
        """The topic's live delete_records records by partition. Scanned with a pattern rather than asked for by
        field: live records are few next to partitions (at most two per partition, most partitions have none), and
        asking 100k fields for mostly nothing costs the client a third of a second."""
        match = re.sub(r"([\\*?\[\]])", r"\\\1", topic) + "/*/delete_records"
        out = {}
        for _, raw in self.r.hscan_iter(self.k_rec, match=match, count=1000):
            rec = ActionRecord.from_json(raw)
            out[rec.partition] = rec
        return out

    def gate(self) -> dict[str, Any] | None:
        """The readiness gate as the running job last wrote it ({"open", "why", "since"}); None if never written."""
        raw = self.r.hget(self.keys.state_health, "gate")
        return None if raw is None else json.loads(raw)

    def group_offsets(self, topic: str) -> dict[tuple[str, int], int]:
        """Every group's committed offset on every partition of the topic (lua/offsets.lua has the layout)."""
        ids = {_s(i): _s(g) for g, i in self.r.hgetall(self.keys.group_ids(topic)).items()}
        top = {_s(i): int(b) for i, b in self.r.hgetall(self.keys.offset_buckets(topic)).items()}
        pipe = self.r.pipeline(transaction=False)
        wanted = [(i, b) for i in sorted(ids) for b in range(top.get(i, -1) + 1)]
        for i, b in wanted:
            pipe.hgetall(self.keys.offset_bucket(topic, i, b))
        out = {}
        for (i, _), entries in zip(wanted, pipe.execute(), strict=True):
            for n, v in entries.items():
                out[(ids[i], int(n))] = int(v)
        return out


def _numbers(topic: str, partitions: list[int], raw: bytes) -> PartitionNumbers:
    """lua/explain_rank.lua's answer for `partitions` of `topic` as arrays."""
    nums = np.asarray(msgspec.msgpack.decode(raw), dtype=np.int64)
    p = len(partitions)
    head = nums[1 : 1 + 6 * p]
    s = 5 * int(head[4::6].sum()) if head.size == 6 * p else 0
    segments, tail = nums[1 + 6 * p : 1 + 6 * p + s], nums[1 + 6 * p + s :]
    if head.size != 6 * p or segments.size != s or tail.size < 1 or tail.size != 1 + 5 * int(tail[0]):
        raise ValueError(f"explain_rank.lua returned {nums.size} numbers for {p} partitions of {topic!r}")
    head = head.reshape(p, 6)
    return PartitionNumbers(
        partitions=np.asarray(partitions, dtype=np.int64),
        counted=np.full(p, nums[0], dtype=np.int64),
        cleaned=head[:, 0].copy(),
        log_start=head[:, 1].copy(),
        zcard=head[:, 2].copy(),
        lowest=head[:, 3].copy(),
        nseg=head[:, 4].copy(),
        segments=segments.reshape(-1, 5),
        cleaned_at=head[:, 5].copy(),
        replicas=tail[1:].reshape(-1, 5).copy(),
    )
