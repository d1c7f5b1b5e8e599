"""Redis state, the system of record: partitions, group offsets, deadlines, and the action outbox.

The key layout is in `state/keys.py`; what callers may use is in `state/protocols.py`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

import msgspec
import numpy as np
import redis

from compactd.errors import DependencyUnavailable
from compactd.keys import parse_partition_key, partition_key
from compactd.model import ActionRecord, Nudge, PartitionNumbers, PartitionView, Segment
from compactd.state.changes import BatchChanges, TopicChanges
from compactd.state.keys import OFFSET_BUCKET, RedisKeys

MAX_SAFE_INT = 2**53  # Lua and zset scores are doubles: integers above this lose digits
# the scripts in lua/ (offsets.lua, part.lua and counted.lua are included by them, not run)
SCRIPTS = (
    "merge",
    "recount",
    "explain",
    "explain_rank",
    "in_flight",
    "views",
    "live_records",
    "schedule",
    "layout",
    "reset",
)
MERGE_SLICE = 64  # topics merged per pipelined round trip
_MERGE_JSON = msgspec.json.Encoder()
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


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _safe_url(url: str) -> str:
    """The URL without its password, for error lines."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url) if url else "(client given)"


def decode_partition_record(raw: bytes | None) -> tuple[list[tuple[str, int]], list[str]]:
    """A partition's packed record (lua/part.lua) as the fields and segment members the layout before it held:
    ([("cleaned", n)?, ("log_start", n)?], ["base:end:ts:size:closed", ...]). Decoded here independently of the
    scripts, for the pipelined reference read."""
    if raw is None:
        return [], []
    a = msgspec.msgpack.decode(raw)
    fields = ([("cleaned", a[0])] if a[0] >= 0 else []) + [("log_start", a[1])]
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
    )


class RedisState:
    """Narrow interface over Redis: merge a batch, read views, schedule deadlines, keep the outbox."""

    def __init__(
        self, client: redis.Redis | Callable[[], Any], prefix: str = "cd", url: str = "", cluster: bool = False
    ) -> None:
        """`client`: a redis-py client, or a function making one on first use (a cluster client connects as it is
        made, and constructors here only configure)."""
        self._client: Any = None if callable(client) else client
        self._make_client: Callable[[], Any] | None = client if callable(client) else None
        self.prefix = prefix
        self.url = url
        self.cluster = cluster
        self.keys = RedisKeys(prefix)
        lua = resources.files(__package__ or "compactd.state").joinpath("lua")

        def source(name: str) -> str:
            """A script with its `--! include <file>` lines replaced by the files (shared Lua functions)."""
            return re.sub(
                r"--! include (\S+)\n", lambda m: lua.joinpath(m.group(1)).read_text(), lua.joinpath(name).read_text()
            )

        self._lua = {name: source(f"{name}.lua") for name in SCRIPTS}
        self._scripts: dict[str, Any] = {}
        self.k_deadlines = self.keys.deadlines
        self.k_compaction_due = self.keys.compaction_due
        self.k_rec = self.keys.records
        self.k_outbox = self.keys.outbox
        self.k_last = self.keys.last
        self.k_nudge = self.keys.nudge
        self.k_topics = self.keys.topics

    @property
    def r(self) -> Any:
        if self._client is None:
            assert self._make_client is not None
            self._client = self._make_client()
        return self._client

    def _script(self, name: str) -> Any:
        """A Lua script bound to the client (EVALSHA, loaded on first use, per node in a cluster)."""
        if name not in self._scripts:
            self._scripts[name] = self.r.register_script(self._lua[name])
        return self._scripts[name]

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "cd",
        timeout_s: float = 5.0,
        password: str | None = None,
        cluster: bool = False,
    ) -> RedisState:
        """Configure only: the client connects on first use (see `start`). `password` beats the URL's.

        `cluster`: `url` names any node of a Redis Cluster; the client discovers the others and routes each key to
        its slot. Every multi-key operation compactd makes stays within one hash tag (one slot).
        """
        extra: dict[str, Any] = {"socket_connect_timeout": timeout_s, "socket_timeout": max(timeout_s, 30.0)}
        if password is not None:
            extra["password"] = password
        if cluster:
            from redis.cluster import RedisCluster

            return cls(lambda: RedisCluster.from_url(url, **extra), prefix, url, cluster=True)
        return cls(redis.Redis.from_url(url, **extra), prefix, url)

    def start(self) -> None:
        """Connect and check the server answers: DependencyUnavailable names the setting to change. Then move any
        topic's state written by an earlier layout (`upgrade`)."""
        try:
            self.r.ping()
            self.upgrade()
        except redis.exceptions.RedisClusterException as exc:
            raise DependencyUnavailable(
                "Redis Cluster", _safe_url(self.url), "--redis-url / redis_url (and redis_cluster)", str(exc)[:200]
            ) from None
        except redis.AuthenticationError as exc:
            raise DependencyUnavailable(
                "Redis", _safe_url(self.url), "--redis-url / redis_url (or redis_password)", str(exc)
            ) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            cause = str(exc).split(". ")[0] if str(exc) else type(exc).__name__
            raise DependencyUnavailable("Redis", _safe_url(self.url), "--redis-url / redis_url", cause) from None

    def upgrade(self) -> int:
        """Move partition state written before the packed layout (lua/layout.lua), topic by topic; a marker per topic
        makes this one cheap call per topic once done. Returns how many partitions were moved."""
        script = self._script("layout")
        return sum(int(script(keys=[self.topic_base(t)])) for t in self.topics())

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def size(self) -> tuple[int, int]:
        """(keys in the database, Redis used_memory bytes), for the state-size gauges; summed over a cluster."""
        where = {"target_nodes": "primaries"} if self.cluster else {}
        keys = self.r.dbsize(**where)
        info = self.r.info("memory", **where)
        if isinstance(keys, dict):
            keys = sum(keys.values())
        if "used_memory" in info:
            return int(keys), int(info["used_memory"])
        return int(keys), sum(int(node.get("used_memory", 0)) for node in info.values() if isinstance(node, dict))

    def topic_base(self, topic: str) -> str:
        return self.keys.topic_base(topic)

    # ---- merge ---------------------------------------------------------------------------------

    def merge(
        self, stream_id: str, batch_id: int, changes: BatchChanges, counts: Callable[[str, str], bool]
    ) -> tuple[dict[str, set[int]], bool]:
        """Apply a batch idempotently. Returns (touched partitions per topic, whether any topic was replayed).

        `counts(group, topic)` says whether a group holds the topic's data back (groups.include/exclude).
        Index updates outside the per-topic script are idempotent, so a crash between steps is repaired
        by the replay of the same batch id.
        """
        pipe = self.r.pipeline(transaction=False)
        # one SADD per group: 100k partitions x 2 groups of offsets are 2 index entries, not 200k commands
        offsets_in: dict[str, set[str]] = {}
        for topic, tc in changes.topics.items():
            for group, _, off in tc.offsets:
                if off is not None:
                    offsets_in.setdefault(group, set()).add(topic)
        for group, in_topics in sorted(offsets_in.items()):
            pipe.sadd(self.keys.group_topics(group), *sorted(in_topics))
        members = sorted(changes.assignments)
        for group in members:
            pipe.smembers(self.keys.group_assigned(group))
        res = pipe.execute()
        was_assigned = {g: {_s(t) for t in old} for g, old in zip(members, res[len(res) - len(members) :], strict=True)}
        now_assigned = {g: sorted(t for t, parts in changes.assignments[g].items() if parts) for g in members}
        assign: dict[str, list[list[Any]]] = {}
        for group in members:
            for topic in sorted(was_assigned[group] - set(now_assigned[group])):
                assign.setdefault(topic, []).append([group, 0, int(counts(group, topic))])
            for topic in now_assigned[group]:
                assign.setdefault(topic, []).append([group, 1, int(counts(group, topic))])
                self.r.sadd(self.keys.group_topics(group), topic)
        deleted_in: dict[str, list[str]] = {}
        for group in changes.group_deletes:
            for topic in self.r.smembers(self.keys.group_topics(group)):
                deleted_in.setdefault(_s(topic), []).append(group)
        topics = sorted(set(changes.topics) | set(deleted_in) | set(assign))
        empty = TopicChanges()

        def payload(topic: str) -> bytes:
            tc = changes.topics.get(topic, empty)
            return self._payload(topic, tc, deleted_in.get(topic, []), assign.get(topic, []), counts)

        results = self._run_merges(stream_id, batch_id, topics, payload)
        touched: dict[str, set[int]] = {}
        replayed = False
        for topic, res in zip(topics, results, strict=True):
            if res == -1:
                replayed = True
                # state already has this batch; still report what it touched so deadlines get refreshed
                touched[topic] = set(self._partitions_in(changes.topics.get(topic, empty)))
            else:
                touched[topic] = {int(n) for n in _s(res).split()}
        pipe = self.r.pipeline(transaction=False)
        if topics:
            pipe.sadd(self.k_topics, *topics)
        # Each group's assigned topics, for the next membership change (idempotent: a replay writes the same).
        for group in sorted(set(changes.group_deletes) | set(members)):
            pipe.delete(self.keys.group_assigned(group))
            if now_assigned.get(group):
                pipe.sadd(self.keys.group_assigned(group), *now_assigned[group])
        pipe.execute()
        # Drop index entries of groups that no longer hold offsets on a topic, nor are assigned to it.
        emptied = {(g, t) for t, gs in deleted_in.items() for g in gs}
        emptied |= {(g, t) for t, tc in changes.topics.items() for g, _, off in tc.offsets if off is None}
        emptied |= {(a[0], t) for t, entries in assign.items() for a in entries if a[1] == 0}
        for group, topic in sorted(emptied):
            if not self.r.sismember(self.keys.groups(topic), group):
                self.r.srem(self.keys.group_topics(group), topic)
        return touched, replayed

    def _run_merges(
        self, stream_id: str, batch_id: int, topics: list[str], payload: Callable[[str], bytes]
    ) -> list[Any]:
        """One merge script per topic. On a single server, pipelined a slice of topics per round trip, each slice sent
        from a worker thread while the next slice's payloads are built (Redis merges while Python encodes); on a
        cluster, where redis-py does not pipeline scripts, one call each (every script stays on its topic's slot)."""
        script = self._script("merge")
        if self.cluster:
            return [script(keys=[self.topic_base(t)], args=[stream_id, batch_id, payload(t)]) for t in topics]

        def run(pipe: Any) -> list[Any]:
            return pipe.execute()

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="compactd-merge") as pool:
            sent: list[Future[list[Any]]] = []
            for start in range(0, len(topics), MERGE_SLICE):
                pipe = self.r.pipeline(transaction=False)
                for topic in topics[start : start + MERGE_SLICE]:
                    script(keys=[self.topic_base(topic)], args=[stream_id, batch_id, payload(topic)], client=pipe)
                sent.append(pool.submit(run, pipe))
            return [res for future in sent for res in future.result()]

    @staticmethod
    def _partitions_in(tc: TopicChanges) -> Iterable[int]:
        yield from (p for p, _ in tc.segments)
        yield from (p for p, _ in tc.compacted)
        yield from (p for p, _ in tc.log_start)
        yield from (p for _, p, _ in tc.offsets)

    @staticmethod
    def _payload(
        topic: str, tc: TopicChanges, gdel: list[str], assign: list[list[Any]], counts: Callable[[str, str], bool]
    ) -> bytes:
        """lua/merge.lua's payload: compact JSON, the bytes `json.dumps` gave, encoded by msgspec in a tenth of the
        time (`json.dumps` was a third of a second of a batch at 1M partitions)."""
        by_group: dict[str, list[int]] = {}
        for g, p, o in tc.offsets:
            by_group.setdefault(g, []).extend((p, -1 if o is None else o))
        return _MERGE_JSON.encode(
            {
                "gdel": gdel,
                "assign": assign,
                "offsets": [[g, int(counts(g, topic)), flat] for g, flat in by_group.items()],
                "committs": [[g, ts] for g, ts in sorted(tc.commit_ts.items())],
                "compacted": [list(c) for c in tc.compacted],
                "logstart": [list(c) for c in tc.log_start],
                "segments": [
                    [p, s.base_offset, s.end_offset, s.first_batch_max_ts, s.size_bytes, s.closed_at]
                    for p, s in tc.segments
                ],
            }
        )

    def groups(self, topic: str) -> list[str]:
        """Groups with an offset on the topic, counted or not."""
        return sorted(_s(g) for g in self.r.smembers(self.keys.groups(topic)))

    def recount(
        self,
        counts: Callable[[str, str], bool],
        topics: Iterable[str] | None = None,
        required: Callable[[str], Sequence[str]] = lambda topic: (),
    ) -> list[tuple[str, int]]:
        """Rebuild which groups hold each topic back (groups.include/exclude/required changed); returns its
        partitions. `required(topic)`: the groups.required, counted whether they have offsets there or not."""
        touched: list[tuple[str, int]] = []
        for topic in self.topics() if topics is None else topics:
            counted = [g for g in self.groups(topic) if counts(g, topic)]
            args = [json.dumps(counted), json.dumps(list(required(topic)))]
            parts = self._script("recount")(keys=[self.topic_base(topic)], args=args)
            touched.extend((topic, int(_s(n))) for n in parts)
        return touched

    def require_groups(self, required: Mapping[str, Sequence[str]]) -> list[str]:
        """Make the groups.required of each topic count there (a merge may just have dropped one whose last offset
        was deleted); returns the topics whose counted groups changed (every partition's minimum may have)."""
        topics = [t for t, groups in required.items() if groups]
        if not topics:
            return []
        pipe = self.r.pipeline(transaction=False)
        for topic in topics:
            pipe.sadd(self.keys.counted_groups(topic), *required[topic])
        return [t for t, added in zip(topics, pipe.execute(), strict=True) if added]

    # ---- runtime configuration -----------------------------------------------------------------

    def config_layers(self) -> dict[str, dict[str, Any]]:
        """Layers applied from config events, by scope, as stored (values, version, ts, digests)."""
        return {_s(k): json.loads(v) for k, v in self.r.hgetall(self.keys.config_layers).items()}

    def save_config_layer(self, scope: str, layer: dict[str, Any]) -> None:
        self.r.hset(self.keys.config_layers, scope, json.dumps(layer, sort_keys=True))

    # ---- reads ---------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted(_s(t) for t in self.r.smembers(self.k_topics))

    def partitions(self, topic: str) -> list[int]:
        return sorted(int(_s(n)) for n in self.r.smembers(self.keys.partitions(topic)))

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
            counted, rows = msgspec.msgpack.decode(script(keys=[self.keys.topic_base(topic)], args=parts))
            for row in rows:
                n, cleaned, log_start, lowest, zcard = row[:5]
                read[(topic, n)] = PartitionView(
                    topic=topic,
                    partition=n,
                    segments=tuple(Segment(*map(int, m.split(":"))) for m in row[5:]),
                    cleaned_up_to=None if cleaned is False else cleaned,
                    log_start=0 if log_start is False else log_start,
                    min_committed=lowest if counted > 0 and zcard == counted and lowest is not False else None,
                    counted_groups=counted,
                )
        return [read[k] for k in keys]

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
        return out

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
        out = []
        for i, (n, (h, segs, zcard, low, ids)) in enumerate(zip(partitions, rows or [], strict=True)):
            h, low = h or [], low or []
            lowest = tuple((names.get(low[j], f"#{low[j]}"), int(low[j + 1])) for j in range(0, len(low), 2))
            out.append(
                PartitionDetail(
                    view=_partition_view(
                        topic, n, zip(h[::2], h[1::2], strict=True), segs or [], low[1] if low else None, zcard, counted
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
        eight topics (issue 17). On a cluster, where redis-py does not pipeline scripts, one call each."""
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

    # ---- deadlines -----------------------------------------------------------------------------

    def _zput(self, key: str, scores: dict[tuple[str, int], int | None]) -> None:
        """Set or remove (None) the score of each "<topic>/<partition>" member in one round trip."""
        put = {partition_key(t, n): at for (t, n), at in scores.items() if at is not None}
        drop = [partition_key(t, n) for (t, n), at in scores.items() if at is None]
        pipe = self.r.pipeline(transaction=False)
        if put:
            pipe.zadd(key, put)
        if drop:
            pipe.zrem(key, *drop)
        pipe.execute()

    def schedule(self, topic: str, partitions: Sequence[int], deadlines: Sequence[int], due: Sequence[int]) -> None:
        """Store a chunk of one topic's deadlines and compaction-due times (-1: none) in one script call
        (lua/schedule.lua): the same entries as `set_deadlines` and `set_compaction_due`, without packing a command
        per partition in the client."""
        self.schedule_many([(topic, partitions, deadlines, due)])

    def schedule_many(self, chunks: Sequence[tuple[str, Sequence[int], Sequence[int], Sequence[int]]]) -> None:
        """`schedule` for several topics' chunks, pipelined in one round trip on a single server."""
        script, keys = self._script("schedule"), [self.k_deadlines, self.k_compaction_due]
        calls = [
            [topic, " ".join(f"{n} {d} {c}" for n, d, c in zip(parts, deadlines, due, strict=True))]
            for topic, parts, deadlines, due in chunks
            if parts
        ]
        if self.cluster or len(calls) < 2:
            for args in calls:
                script(keys=keys, args=args)
            return
        pipe = self.r.pipeline(transaction=False)
        for args in calls:
            script(keys=keys, args=args, client=pipe)
        pipe.execute()

    # set_deadlines, set_compaction_due and records: the per-partition commands `schedule` and `live_records`
    # replace in the controller, kept as the reference they are tested against (and for explain and tests)
    def set_deadlines(self, deadlines: dict[tuple[str, int], int | None]) -> None:
        self._zput(self.k_deadlines, deadlines)

    def set_compaction_due(self, due: dict[tuple[str, int], int | None]) -> None:
        """When each partition's oldest dirty record crosses max.compaction.lag.ms (None: nothing dirty)."""
        self._zput(self.k_compaction_due, due)

    def oldest_compaction_due(self) -> int | None:
        first = self.r.zrange(self.k_compaction_due, 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    def due(self, now: int, limit: int = 10_000) -> list[tuple[str, int]]:
        members = self.r.zrangebyscore(self.k_deadlines, "-inf", now, start=0, num=limit)
        return [parse_partition_key(m) for m in members]

    def deadline(self, topic: str, partition: int) -> int | None:
        score = self.r.zscore(self.k_deadlines, partition_key(topic, partition))
        return None if score is None else int(score)

    # ---- actions / outbox ----------------------------------------------------------------------

    def records(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], list[ActionRecord]]:
        keys = list(keys)
        kinds = ("compact", "delete_records")
        fields = [f"{partition_key(t, n)}/{k}" for t, n in keys for k in kinds]
        vals = self.r.hmget(self.k_rec, fields) if fields else []
        out: dict[tuple[str, int], list[ActionRecord]] = {k: [] for k in keys}
        for i, raw in enumerate(vals):
            if raw is not None:
                out[keys[i // len(kinds)]].append(ActionRecord.from_json(raw))
        return out

    def live_records(self, topic: str, partitions: Sequence[int]) -> dict[int, list[ActionRecord]]:
        """`records` for a chunk of one topic's partitions, only those that have any (lua/live_records.lua)."""
        if not partitions:
            return {}
        return _records(self._script("live_records")(keys=[self.k_rec], args=[topic, " ".join(map(str, partitions))]))

    def enqueue(self, *recs: ActionRecord) -> None:
        """Record decisions and put them in the outbox in one transaction (one round trip for a batch's decisions)."""
        self.settle(0, (), recs)

    def outbox(self, now: int | None = None, limit: int = 1000) -> list[ActionRecord]:
        """Records due by `now` (all when None), oldest first. A refused action's score is its next retry time."""
        hi = "+inf" if now is None else now
        slots = self.r.zrangebyscore(self.k_outbox, "-inf", hi, start=0, num=limit)
        if not slots:
            return []
        vals = self.r.hmget(self.k_rec, slots)
        return [ActionRecord.from_json(v) for v in vals if v is not None]

    def retry(self, rec: ActionRecord, at: int) -> None:
        """Keep a refused or timed-out action in the outbox, due again at `at` (epoch ms)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self.k_rec, rec.slot, rec.to_json())
        pipe.zadd(self.k_outbox, {rec.slot: at})
        pipe.execute()

    def compactions_in_flight(self) -> int:
        """Compaction nudges sent and not yet answered by the cluster, over every topic. Counted inside Redis by a
        read-only script (lua/in_flight.lua): the same records as scanning them here, but only the number crosses the
        network, and one script sees one consistent set (a client-side HSCAN can return a record twice)."""
        return int(self._script("in_flight")(keys=[self.k_rec]))

    def outbox_depth(self) -> int:
        return int(self.r.zcard(self.k_outbox))

    def complete(self, *recs: ActionRecord) -> None:
        """Leave the outbox with the final status, in one transaction; a record stays until the cluster answers it."""
        if not recs:
            return
        raw = {rec.slot: rec.to_json() for rec in recs}
        kept = {r.slot: raw[r.slot] for r in recs if r.action != "restore_config"}
        restored = [r.slot for r in recs if r.action == "restore_config"]
        pipe = self.r.pipeline(transaction=True)  # a few commands, however many records
        if kept:
            pipe.hset(self.k_rec, mapping=kept)
        if restored:
            pipe.hdel(self.k_rec, *restored)
        pipe.zrem(self.k_outbox, *raw)
        pipe.hset(self.k_last, mapping={partition_key(r.topic, r.partition): raw[r.slot] for r in recs})
        pipe.execute()

    def answer(self, now: int, *recs: ActionRecord) -> None:
        """The cluster did what was asked: the records leave the live set, in one transaction (one each made a
        batch answering 60k compactions spend most of its time in round trips)."""
        self.settle(now, recs, ())

    def settle(self, now: int, answered: Sequence[ActionRecord], queued: Sequence[ActionRecord]) -> None:
        """`answer` then `enqueue`, in one transaction: a chunk's answered records leave the live set (each kept as
        its partition's last, answered at `now`) and its decisions enter it and the outbox. A slot answered and
        decided again is only overwritten: at 1M partitions most answered slots are, and removing each first cost
        Redis a command argument and the client its packing (issue 17)."""
        if not answered and not queued:
            return
        pipe = self.r.pipeline(transaction=True)  # a few commands, however many records (a reply each is slow)
        slots = [rec.slot for rec in queued]
        if answered:
            again = set(slots)
            gone = [slot for slot in (rec.slot for rec in answered) if slot not in again]
            if gone:
                pipe.hdel(self.k_rec, *gone)
                pipe.zrem(self.k_outbox, *gone)
            pipe.hset(
                self.k_last,
                mapping={partition_key(r.topic, r.partition): r.with_status(r.status, answered_at=now).to_json()
                         for r in answered},
            )  # fmt: skip
        if queued:
            pipe.hset(self.k_rec, mapping={slot: rec.to_json() for slot, rec in zip(slots, queued, strict=True)})
            pipe.zadd(self.k_outbox, {slot: rec.decided_at for slot, rec in zip(slots, queued, strict=True)})
        pipe.execute()

    def last_actions(self) -> dict[str, ActionRecord]:
        return {_s(k): ActionRecord.from_json(v) for k, v in self.r.hgetall(self.k_last).items()}

    def live_compactions(self, topic: str) -> int:
        """Compaction records live on the topic's partitions: one HMGET over them, not a scan of every record."""
        slots = [f"{partition_key(topic, n)}/compact" for n in self.partitions(topic)]
        return sum(raw is not None for raw in self.r.hmget(self.k_rec, slots)) if slots else 0

    # ---- topic lifecycle: re-created and deleted topics ----------------------------------------

    def topic_id(self, topic: str) -> str | None:
        """The topic ID (KIP-516) the topic's state describes, if the cluster reported one when it was recorded."""
        raw = self.r.hget(self.keys.topic_ids, topic)
        return None if raw is None else _s(raw)

    def topic_ids(self, topics: Sequence[str]) -> list[str | None]:
        """`topic_id` of many topics, in one call."""
        raws = self.r.hmget(self.keys.topic_ids, list(topics)) if topics else []
        return [None if raw is None else _s(raw) for raw in raws]

    def set_topic_ids(self, ids: Mapping[str, str]) -> None:
        """Bind topics' state to these topic IDs (one call)."""
        if ids:
            self.r.hset(self.keys.topic_ids, mapping=dict(ids))

    def reset_topic(self, topic: str, why: str, now: int) -> list[int]:
        """The topic's log is not the one its state describes: drop its partitions' log state, the groups' offsets
        on it, their deadlines and live actions (lua/reset.lua has what stays); remember why for `explain`.
        Returns the partitions that had state."""
        parts = sorted(int(_s(n)) for n in self._script("reset")(keys=[self.topic_base(topic)]))
        self._drop_partitions(topic, parts)
        cause = json.dumps({"at": now, "why": why, "partitions": len(parts)})
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.keys.resets, topic, cause)
        pipe.hdel(self.keys.topic_ids, topic)
        pipe.execute()
        return parts

    def forget_topic(self, topic: str) -> list[int]:
        """The topic was deleted and not created again: every key of its state goes (a nudge's original value too:
        there is no topic to put it back on). Returns the partitions that had state."""
        parts = self.partitions(topic)
        self._drop_partitions(topic, parts)
        keys = list(self.r.scan_iter(match=f"{self.topic_base(topic)}:*", count=1000))
        for start in range(0, len(keys), 500):
            self._delete(keys[start : start + 500])
        nudges = [k for k in self.r.hkeys(self.k_nudge) if _s(k).partition("|")[0] == topic]
        pipe = self.r.pipeline(transaction=False)
        pipe.srem(self.k_topics, topic)
        pipe.hdel(self.keys.topic_ids, topic)
        pipe.hdel(self.keys.resets, topic)
        if nudges:
            pipe.hdel(self.k_nudge, *nudges)
        pipe.execute()
        return parts

    def note_unlisted(self, topic: str, groups: Sequence[str], now: int) -> None:
        """Counted groups the cluster did not list at the last delete check of the topic, for `explain`."""
        self.r.hset(self.keys.unlisted, topic, json.dumps({"at": now, "groups": list(groups)}))

    def unlisted(self, topic: str) -> dict[str, Any] | None:
        raw = self.r.hget(self.keys.unlisted, topic)
        return None if raw is None else json.loads(raw)

    def restore_reset(self, topic: str, cause: dict[str, Any]) -> None:
        """A reset's cause read back from the ledger after a state loss, for `explain`."""
        self.r.hset(self.keys.resets, topic, json.dumps(cause))

    def reset_cause(self, topic: str) -> dict[str, Any] | None:
        """The topic's last reset ({"at", "why", "partitions"}), for `explain`; None if it never had one."""
        raw = self.r.hget(self.keys.resets, topic)
        return None if raw is None else json.loads(raw)

    def _drop_partitions(self, topic: str, parts: Sequence[int]) -> None:
        """Deadlines and live action records of these partitions (they live in other slots than the topic's keys)."""
        for start in range(0, len(parts), 5000):
            members = [partition_key(topic, n) for n in parts[start : start + 5000]]
            slots = [f"{m}/{kind}" for m in members for kind in ("compact", "delete_records")]
            pipe = self.r.pipeline(transaction=False)
            pipe.zrem(self.k_deadlines, *members)
            pipe.zrem(self.k_compaction_due, *members)
            pipe.hdel(self.k_rec, *slots)
            pipe.zrem(self.k_outbox, *slots)
            pipe.execute()

    # ---- compaction nudge bookkeeping ----------------------------------------------------------

    def remember_config(self, nudge: Nudge) -> Nudge:
        """Keep the value a nudge replaced; the first nudge of a topic wins (a second one sees compactd's own value).
        Returns the nudge stored."""
        field = f"{nudge.topic}|{nudge.key}"
        pipe = self.r.pipeline(transaction=True)
        pipe.hsetnx(self.k_nudge, field, msgspec.json.encode(nudge))
        pipe.hget(self.k_nudge, field)
        return _nudge(field, pipe.execute()[1])

    def nudges(self) -> list[Nudge]:
        """Every nudge not yet put back, over all topics (a few: compaction.max.concurrent bounds them)."""
        return [_nudge(_s(k), v) for k, v in self.r.hgetall(self.k_nudge).items()]

    def nudged(self, topic: str) -> dict[str, str | None]:
        """config key -> the value to put back, for the topic's nudges."""
        return {n.key: n.original for n in self.nudges() if n.topic == topic}

    def forget_config(self, topic: str, key: str) -> None:
        self.r.hdel(self.k_nudge, f"{topic}|{key}")

    def rest_nudges(self, topic: str, ms: int) -> None:
        """The cleaner did not answer a nudge in time: no new nudge of the topic for `ms`."""
        self.r.set(f"{self.k_nudge}-rest:{topic}", 1, px=max(ms, 1))

    def nudges_rest(self, topic: str) -> int:
        """Milliseconds until the topic may be nudged again (0: now)."""
        return max(int(self.r.pttl(f"{self.k_nudge}-rest:{topic}")), 0)

    # ---- state health: is this still the state the checkpoint assumes? -------------------------

    def health(self) -> dict[str, str]:
        """The state hash (`RedisKeys.state_health`): epoch, last merged batch per stream, rebuild targets, gate."""
        return {_s(k): _s(v) for k, v in self.r.hgetall(self.keys.state_health).items()}

    def claim_epoch(self, epoch: str) -> str:
        """Write `epoch` unless Redis already has one; returns the epoch Redis holds now."""
        key = self.keys.state_health
        self.r.hsetnx(key, "epoch", epoch)
        return _s(self.r.hget(key, "epoch"))

    def epoch(self) -> str | None:
        value = self.r.hget(self.keys.state_health, "epoch")
        return None if value is None else _s(value)

    def mark_merged(self, stream_id: str, batch_id: int) -> None:
        """Record the last batch whose merge completed: a Redis that later holds an older one lost writes."""
        self.r.hset(self.keys.state_health, f"batch:{stream_id}", batch_id)

    def set_health(self, **fields: str | None) -> None:
        """Set (or, with None, remove) fields of the state hash: `rebuild` targets, the `gate`."""
        key = self.keys.state_health
        put = {k: v for k, v in fields.items() if v is not None}
        drop = [k for k, v in fields.items() if v is None]
        pipe = self.r.pipeline(transaction=False)
        if put:
            pipe.hset(key, mapping=put)
        if drop:
            pipe.hdel(key, *drop)
        pipe.execute()

    def has_state(self) -> bool:
        """Whether any topic was ever merged into this Redis."""
        return bool(self.r.exists(self.k_topics))

    def wipe(self) -> int:
        """Delete every key of this job's prefix (a rebuild starts from nothing); returns how many."""
        n = 0
        pattern = f"{self.prefix}:*"
        batch: list[Any] = []
        for key in self.r.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                n += self._delete(batch)
                batch = []
        if batch:
            n += self._delete(batch)
        return n

    def _delete(self, keys: list[Any]) -> int:
        if self.cluster:  # keys of different slots: one DEL each, pipelined per node by the client
            pipe = self.r.pipeline(transaction=False)
            for key in keys:
                pipe.delete(key)
            return sum(int(x) for x in pipe.execute())
        return int(self.r.delete(*keys))


def _numbers(topic: str, partitions: list[int], raw: bytes) -> PartitionNumbers:
    """lua/explain_rank.lua's answer for `partitions` of `topic` as arrays."""
    nums = np.asarray(msgspec.msgpack.decode(raw), dtype=np.int64)
    p = len(partitions)
    head, segments = nums[1 : 1 + 5 * p], nums[1 + 5 * p :]
    if head.size != 5 * p or segments.size != 5 * int(head[4::5].sum()):
        raise ValueError(f"explain_rank.lua returned {nums.size} numbers for {p} partitions of {topic!r}")
    head = head.reshape(p, 5)
    return PartitionNumbers(
        partitions=np.asarray(partitions, dtype=np.int64),
        counted=np.full(p, nums[0], dtype=np.int64),
        cleaned=head[:, 0].copy(),
        log_start=head[:, 1].copy(),
        zcard=head[:, 2].copy(),
        lowest=head[:, 3].copy(),
        nseg=head[:, 4].copy(),
        segments=segments.reshape(-1, 5),
    )


def _nudge(field: str, raw: bytes) -> Nudge:
    """A nudge as stored; the layout before the nudge ledger kept only the original value (JSON): its time is
    unknown, so `compaction.nudge.max.ms` counts as spent."""
    value = json.loads(raw)
    if isinstance(value, dict):
        return msgspec.convert(value, Nudge)
    topic, _, key = field.partition("|")
    return Nudge(topic, key, value, "", 0)


def _records(raws: Sequence[bytes]) -> dict[int, list[ActionRecord]]:
    """lua/live_records.lua's answer by partition, compact before delete_records (as `records` gives them)."""
    out: dict[int, list[ActionRecord]] = {}
    for rec in ActionRecord.many_from_json(raws):
        got = out.get(rec.partition)
        if got is None:
            out[rec.partition] = [rec]
        else:
            got.append(rec)
            got.sort(key=lambda r: r.action)
    return out
