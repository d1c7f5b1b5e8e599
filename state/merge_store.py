"""Writing a batch into the state: the per-topic merge scripts (lua/merge.lua) and which groups hold each topic
back (lua/recount.lua). Split from the reads because this is the only path that changes partition state."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgspec

from compactd.clock import now_ms
from compactd.policy.identity import other_incarnation
from compactd.state.changes import BatchChanges, TopicChanges
from compactd.state.store_base import StoreBase, _s

log = logging.getLogger("compactd.state")
MERGE_SLICE = 64
DELETIONS_KEPT_MS = 30 * 24 * 3_600_000  # how long a group's deletion is remembered against late older commits


def _older(ts: int | None, deleted_at: float | None) -> bool:
    return ts is not None and deleted_at is not None and ts < deleted_at  # topics merged per pipelined round trip


_MERGE_JSON = msgspec.json.Encoder()


class MergeStore(StoreBase):
    """Merge a batch idempotently; recount and require the groups that hold topics back."""

    def merge(
        self, stream_id: str, batch_id: int, changes: BatchChanges, counts: Callable[[str, str], bool]
    ) -> tuple[dict[str, set[int]], bool]:
        """Apply a batch idempotently. Returns (touched partitions per topic, whether any topic was replayed).

        `counts(group, topic)` says whether a group holds the topic's data back (groups.include/exclude).
        Index updates outside the per-topic script are idempotent, so a crash between steps is repaired
        by the replay of the same batch id.
        """
        self._void_other_incarnations(changes)
        self._order_by_deletions(changes)
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
            at = changes.group_delete_ts
            gdel: list[Any] = [[g, at[g]] if g in at else g for g in deleted_in.get(topic, [])]
            return self._payload(topic, tc, gdel, assign.get(topic, []), counts)

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

    def _order_by_deletions(self, changes: BatchChanges) -> int:
        """Across batches, a group's deletion and its commits from the JSON commits topic go by their event times:
        the batch's deletions are remembered (`group_deleted_at`, the latest per group, kept 30 days), and a commit
        older than its group's remembered deletion is dropped (read late from another partition of that topic, it
        would bring back a position the group gave up). A deletion older than a commit the state already holds does
        not wipe it: lua/merge.lua compares it with each partition's commit time. A deletion stamped after the merge
        (a producer's clock ahead) counts as of the merge: it cannot have happened later than it was read, and
        remembered at its own time it would drop every commit the group makes until then. Returns how many commits
        were dropped; a replay drops the same (such a deletion then counts as of the replay)."""
        key = self.keys.group_deleted_at
        if changes.group_delete_ts:
            now = now_ms()
            changes.group_delete_ts = {g: min(ts, now) for g, ts in changes.group_delete_ts.items()}
            newest = max(changes.group_delete_ts.values())
            pipe = self.r.pipeline(transaction=False)
            pipe.zadd(key, {g: ts for g, ts in changes.group_delete_ts.items()}, gt=True)
            pipe.zremrangebyscore(key, "-inf", newest - DELETIONS_KEPT_MS)
            pipe.execute()
        groups = sorted({g for tc in changes.topics.values() for g, _ in tc.offset_ts})
        if not groups:
            return 0
        deleted = {g: d for g, d in zip(groups, self.r.zmscore(key, groups), strict=True) if d is not None}
        dropped = 0
        for tc in changes.topics.values():
            if not tc.offset_ts or not deleted:
                continue
            kept = [o for o in tc.offsets if not _older(tc.offset_ts.get((o[0], o[1])), deleted.get(o[0]))]
            dropped += len(tc.offsets) - len(kept)
            tc.offsets = kept
        return dropped

    def _void_other_incarnations(self, changes: BatchChanges) -> int:
        """Drop the batch's commits made on another incarnation of their topic than the one its state is bound to
        (`other_incarnation`: a commit's topic ID against the recorded one; one HMGET for the topics whose commits
        name an ID). Such a commit, replayed from `__consumer_offsets` after a topic was re-created, would otherwise
        count its old log's offset for the new log. Returns how many were dropped; a replay drops the same."""
        topics = sorted(t for t, tc in changes.topics.items() if tc.offset_ids)
        if not topics:
            return 0
        stored = dict(
            zip(topics, (_s(v) if v else None for v in self.r.hmget(self.keys.topic_ids, topics)), strict=True)
        )
        dropped = 0
        for topic in topics:
            tc = changes.topics[topic]
            kept = [o for o in tc.offsets if not other_incarnation(tc.offset_ids.get((o[0], o[1])), stored[topic])]
            if len(kept) != len(tc.offsets):
                log.warning(
                    "%d commits on %s name topic ID %s, not the %s its state describes: another incarnation's, ignored",
                    len(tc.offsets) - len(kept), topic,
                    next(i for i in tc.offset_ids.values() if other_incarnation(i, stored[topic])), stored[topic],
                )  # fmt: skip
                dropped += len(tc.offsets) - len(kept)
                tc.offsets = kept
        return dropped

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
        yield from (c[0] for c in tc.compacted)
        yield from (r.partition for r in tc.replicas)
        yield from (p for p, _ in tc.log_start)
        yield from (p for _, p, _ in tc.offsets)

    @staticmethod
    def _payload(
        topic: str, tc: TopicChanges, gdel: list[Any], assign: list[list[Any]], counts: Callable[[str, str], bool]
    ) -> bytes:
        """lua/merge.lua's payload: compact JSON, the bytes `json.dumps` gave, encoded by msgspec in a tenth of the
        time (`json.dumps` was a third of a second of a batch at 1M partitions)."""
        by_group: dict[str, list[int]] = {}
        times: dict[str, list[int]] = {}  # (partition, commit time) where the commits topic gave one
        for g, p, o in tc.offsets:
            by_group.setdefault(g, []).extend((p, -1 if o is None else o))
            if tc.offset_ts and o is not None and (ts := tc.offset_ts.get((g, p))) is not None:
                times.setdefault(g, []).extend((p, ts))
        return _MERGE_JSON.encode(
            {
                "gdel": gdel,
                "assign": assign,
                "offsets": [[g, int(counts(g, topic)), flat, times.get(g, [])] for g, flat in by_group.items()],
                "committs": [[g, ts] for g, ts in sorted(tc.commit_ts.items())],
                "compacted": [list(c) for c in tc.compacted],
                "replicas": [
                    [r.partition, r.replica, _or_none(r.cleaned_up_to), _or_none(r.local_log_start), r.ts, r.replicas]
                    for r in tc.replicas
                ],
                "logstart": [list(c) for c in tc.log_start],
                "segments": [
                    [
                        *(p, s.base_offset, s.end_offset, s.first_batch_max_ts, s.size_bytes, s.closed_at),
                        tc.segment_epochs.get((p, s.base_offset), -1),
                    ]
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


def _or_none(value: int | None) -> int:
    """-1 for None: lua/replicas.lua's "none"."""
    return -1 if value is None else value
