"""The driver-side loop body: merge (state/) → decide (policy/, pure) → act (sinks/).

Runs from foreachBatch for new events and from a ticker for deadlines that time alone makes due; one lock keeps
the two from interleaving. Partitions are planned a chunk at a time by `policy.plan.plans` (pure, over the rules'
arrays) and each plan is then applied here: records answered, decisions queued in the outbox, deadlines stored,
and the outbox dispatched (control/dispatch.py, the act side). The batch's entry points, its merge and the
evaluation stay in this one module (~450 lines): they share the lock, the chunked reads and the writes behind them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from compactd.clock import now_ms
from compactd.control.dispatch import NUDGE_CHECK_MS, Dispatch
from compactd.control.evaluation import EVAL_CHUNK, BatchThresholds, ChunkRead, TopicChunk, plan_chunk
from compactd.control.identity import Lifecycle, Records, TopicReader
from compactd.control.io_ahead import IoAhead
from compactd.control.metrics import Metrics
from compactd.control.readers import Readers
from compactd.control.scheduled import Scheduled
from compactd.control.slices import SliceResult, evaluate_slice, split_by_slice
from compactd.gc_pause import gc_paused
from compactd.kafka.groups import GroupCheck
from compactd.model import ActionRecord
from compactd.policy.arrays import NONE
from compactd.policy.forecast import partition_stats, stats_rows
from compactd.policy.plan import PartitionPlan, plans
from compactd.policy.readers import EVERY_TOPIC
from compactd.policy.rules import Due, Evaluation
from compactd.policy.rules import due as due_now
from compactd.policy.thresholds import (
    Thresholds,
    group_counts,
    resolve,
    resolve_global,
    topic_excluded,
)
from compactd.policy.throttle import TokenBucket
from compactd.sinks.audit import AuditLog
from compactd.sinks.base import ActionSink
from compactd.sinks.dry_run import DryRunSink
from compactd.state.changes import BatchChanges
from compactd.state.protocols import ControllerState

log = logging.getLogger("compactd.controller")

# A probe is called at named points of a batch ("after_merge", "after_enqueue") with the batch id, and after a nudge
# was made ("after_nudge", 0); crash tests inject one that kills the process there, the way an OOM kill would.
Probe = Callable[[str, int], None]


# (layers, now) -> the slices' results: a batch's per-topic work run elsewhere (Spark tasks; control/slices.py)
RunSlices = Callable[[BatchThresholds, int], list[SliceResult]]


class ViewCapReader(Protocol):
    """The compacted views' cap on source deletes, as data (compaction/view_caps.py)."""

    def cap(self, topic: str, partition: int, th: Thresholds, now: int, fresh: bool = False) -> int | None:
        """The highest offset a delete may reach (None: no view, no cap)."""

    def take_moved(self) -> list[str]:
        """The topics whose cap moved since the last call."""

    def epoch_read(self, topic: str, partition: int) -> int:
        """The leader epoch the published view read the partition under, as the last `cap` found it (-1: no view,
        or not known)."""


def _no_probe(point: str, batch_id: int) -> None:
    pass


@dataclass
class _ChunkWrites:
    """What evaluating a chunk writes, sent together at its end: answered records leave the live set before new
    decisions for the same slot enter it (one transaction each made a batch answering 60k records spend most of its
    time in round trips)."""

    answered: list[ActionRecord] = field(default_factory=list)
    queued: list[ActionRecord] = field(default_factory=list)
    restore_checks: dict[str, None] = field(default_factory=dict)  # topics, in order
    # (topic, partitions, deadlines, compaction-due times) whose values changed, stored behind the next reads
    schedule: list[tuple[str, list[int], list[int]]] = field(default_factory=list)

    def flush(self, state: ControllerState, now: int) -> None:
        state.settle(now, self.answered, self.queued)
        self.answered.clear()
        self.queued.clear()


class Controller(Dispatch):
    """Merge, evaluate and plan; what is planned is carried out by `Dispatch` (control/dispatch.py)."""

    def __init__(
        self,
        state: ControllerState,
        layers: Mapping[str, Mapping[str, Any]],
        sink: ActionSink,
        audit: AuditLog | None,
        metrics: Metrics,
        clock: Callable[[], int] = now_ms,
        deletes_allowed: Callable[[], bool] = lambda: True,
        probe: Probe = _no_probe,
        own_topics: frozenset[str] = frozenset(),
        cluster_offsets: Callable[[str, bool], GroupCheck] | None = None,
        view_caps: ViewCapReader | None = None,
        slices: int = 0,
        topics: TopicReader | None = None,
        strict_groups: bool = False,
        records: Records | None = None,
        readers: Readers | None = None,
    ) -> None:
        """`cluster_offsets(topic, fresh)`: the committed offsets of the topic's groups as the cluster has them, read
        right before each consumed-retention delete (None: no such check, for tests without a cluster; a cached answer
        that holds the delete is read again fresh); `strict_groups`: a counted group the cluster does not list holds
        the delete (cluster_check: strict). `view_caps`: the compacted views' horizons no delete may pass, read as
        data the compaction trigger keeps (None: no compaction service). `topics`: topic IDs and watermarks from the
        cluster, checked right before a delete or a nudge goes and by `sweep_topics` (control/identity.py; None: only
        the sink's own log-end check); `records`: where resets and the topic IDs the state is bound to are kept beyond
        Redis; `readers`: the readers that commit no group offsets (share groups, Spark checkpoints, pins), counted
        like groups in every plan and again right before a consumed-retention delete goes (None: groups only)."""
        self.state = state
        self.layers = dict(layers)
        self.own_topics = own_topics
        self.cluster_offsets = cluster_offsets
        self.strict_groups = strict_groups
        self.view_caps = view_caps
        self.readers = readers
        self.slices = slices  # 0: merge and plan here; N: in N slices of topics (control/slices.py)
        self.sink = sink
        self.dry = DryRunSink()
        self.audit = audit
        self.metrics = metrics
        self.clock = clock
        metrics.partitions.clock = clock  # delays and ages are measured on the clock decisions are made on
        self.deletes_allowed = deletes_allowed
        self.probe = probe
        self.lock = threading.Lock()
        self.bucket = TokenBucket(resolve_global(self.layers).actions_per_second)
        self.monotonic = time.monotonic  # the rate cap runs on real time whatever `clock` says
        self._unwarmed: list[tuple[str, int]] | None = None  # partitions whose metrics a start has not filled yet
        # actions due but held back by actions.per.second after the last dispatch: `run --once` waits for them
        self.held_back = 0
        # what this process carried out, by final status: the `run --once` summary line reads it
        self.outcomes: Counter[str] = Counter()
        # `run --once`: the partitions this run has evaluated, by topic (`track_evaluated`, `evaluate_rest`)
        self._evaluated: dict[str, set[int]] | None = None
        # Redis calls of an evaluation that run beside its planning: Redis and Python take turns no more
        self.io = IoAhead()
        # the deadlines this process stored: an evaluation writes the ones that changed (control/scheduled.py)
        self.scheduled = Scheduled()
        self.lifecycle = Lifecycle(state, topics, metrics, self._forget_partitions, records)
        self._nudges_checked_at = -NUDGE_CHECK_MS
        self._behind: dict[tuple[str, int], tuple[int, str]] = {}

    # ---- configuration ----

    def thresholds(self, topic: str, partition: int | None = None) -> Thresholds:
        return resolve(self.layers, topic, partition)

    def set_layers(self, layers: Mapping[str, Mapping[str, Any]]) -> None:
        """New effective threshold layers (a config event was applied); the next evaluation uses them."""
        with self.lock:
            self.layers = {scope: dict(values) for scope, values in layers.items()}
            self.bucket.rate = resolve_global(self.layers).actions_per_second

    def recount_groups(self, topics: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """groups.include/exclude changed: rebuild which groups hold each topic back; returns its partitions."""
        with self.lock:
            per_topic: dict[str, Thresholds] = {}

            def counts(group: str, topic: str) -> bool:
                if topic not in per_topic:
                    per_topic[topic] = self.thresholds(topic)
                return group_counts(group, per_topic[topic])

            return self.state.recount(counts, topics, lambda topic: self.thresholds(topic).groups_required)

    # ---- entry points ----

    def on_batch(
        self, stream_id: str, batch_id: int, changes: BatchChanges, run_slices: RunSlices | None = None
    ) -> int:
        """Merge one micro-batch, evaluate the partitions it touched, act. Returns how many were touched.

        One path wherever the per-topic work runs (`_topic_work`): here, or in slices of topics that plan their
        quiet partitions themselves and return their metrics (control/slices.py; `run_slices(layers, now)`: in Spark
        tasks, `changes` then holding only the group-level changes). The driver evaluates the rest and keeps the
        metrics and the outbox either way."""
        with self.lock, gc_paused():
            started = time.monotonic()
            results = self._topic_work(stream_id, batch_id, changes, self._layers(), run_slices)
            by_topic: dict[str, set[int]] = {}
            for r in results:
                for topic, n in r.full:
                    by_topic.setdefault(topic, set()).add(n)
            merged = dict.fromkeys(
                [*(t for r in results for t in r.merged), *by_topic, *(key[0] for r in results for key, _ in r.stats)]
            )
            self._learn(merged)
            for topic in self._require(merged):
                by_topic[topic] = set(self.state.partitions(topic))
            self.probe("after_merge", batch_id)
            self.metrics.batches.labels("replayed" if any(r.replayed for r in results) else "merged").inc()
            for i, r in enumerate(results):
                if r.stats:
                    log.debug("slice %d/%d: %d touched, %d to plan here", i, len(results), r.touched, len(r.full))
                    self.metrics.partitions.update_many(r.stats)
                    self.metrics.evaluations.labels("batch").inc(len(r.stats))
                    self._mark_evaluated(key for key, _ in r.stats)
            self._evaluate([(t, p) for t, parts in by_topic.items() for p in sorted(parts)], "batch")
            self.probe("after_enqueue", batch_id)
            self._dispatch()
            self.metrics.batch_seconds.observe(time.monotonic() - started)
            return sum(r.touched for r in results)

    def _topic_work(
        self,
        stream_id: str,
        batch_id: int,
        changes: BatchChanges,
        layers: BatchThresholds,
        run_slices: RunSlices | None,
    ) -> list[SliceResult]:
        """A batch's per-topic work. Here: one merge, every touched partition left to `_evaluate` (its reads overlap
        its planning, and it writes only the deadlines that changed: 15-35% faster than one local slice,
        docs/benchmarks.md). In slices (`self.slices` of them here, or `run_slices`): the group-level changes are
        merged here first, as each topic's merge would (a group's deletion and membership reach all its topics),
        then each slice merges its topics and plans their quiet partitions; the slices store deadlines too, so
        this process stops remembering which it stored."""
        if not self.slices and run_slices is None:
            merge_started = time.monotonic()
            touched, replayed = self.state.merge(stream_id, batch_id, changes, layers.counts)
            self.metrics.merge_seconds.observe(time.monotonic() - merge_started)
            keys = [(t, p) for t, parts in touched.items() for p in sorted(parts)]
            return [SliceResult(touched=len(keys), replayed=replayed, full=keys, merged=list(touched))]
        self.scheduled.off()
        now = self.clock()
        out: list[SliceResult] = []
        if changes.group_deletes or changes.assignments:
            groups = BatchChanges(
                group_deletes=changes.group_deletes,
                group_delete_ts=changes.group_delete_ts,
                assignments=changes.assignments,
            )
            touched, _ = self.state.merge(f"{stream_id}#groups", batch_id, groups, layers.counts)
            out.append(SliceResult(full=[(t, p) for t, parts in touched.items() for p in sorted(parts)]))
        if run_slices is not None:
            return out + run_slices(layers, now)
        return out + [
            evaluate_slice(self.state, layers, stream_id, batch_id, part, now)
            for part in split_by_slice(changes, self.slices)
        ]

    def tick(self) -> None:
        """Evaluate the partitions whose deadline has passed and those of topics whose view cap moved, and drain the
        outbox."""
        with self.lock, gc_paused():
            self._evaluate(self.state.due(self.clock()), "deadline")
            for topic in [] if self.view_caps is None else self.view_caps.take_moved():
                self._evaluate([(topic, p) for p in self.state.partitions(topic)], "compaction")
            self._readers_moved()
            self._dispatch()

    def _readers_moved(self) -> None:
        """Evaluate again the topics whose readers' holds changed (a reader moved on, came, went, or could be read
        again): no event touches their partitions. A hold on every topic that came or went: every partition."""
        if self.readers is None:
            return
        self.readers.holds(self.layers)  # read again when its cache is over
        moved = self.readers.take_moved()
        if EVERY_TOPIC in moved:
            self._evaluate(self.state.all_partitions(), "readers")
            return
        for topic in moved:
            self._evaluate([(topic, p) for p in self.state.partitions(topic)], "readers")

    def evaluate(self, keys: Iterable[tuple[str, int]], trigger: str) -> int:
        """Evaluate these partitions now (a config change touched them); returns how many."""
        with self.lock, gc_paused():
            keys = list(keys)
            self._evaluate(keys, trigger)
            self._dispatch()
            return len(keys)

    def warm_metrics(self, limit: int = EVAL_CHUNK) -> int:
        """Fill the per-partition metrics of partitions no batch has evaluated yet, `limit` at a time (one chunk per
        tick after a start), read-only: a restart decides again at once and is not held up by a full scan."""
        with self.lock:
            if self._unwarmed is None:
                self._unwarmed = self.state.all_partitions()
            chunk, self._unwarmed = self._unwarmed[:limit], self._unwarmed[limit:]
            if chunk:
                now = self.clock()
                for view in self.state.views(chunk):
                    th = self.thresholds(view.topic, view.partition)
                    key = (view.topic, view.partition)
                    if not topic_excluded(view.topic, th, self.own_topics) and key not in self.metrics.partitions:
                        self.metrics.partitions.update(key, partition_stats(view, th, now))
            return len(self._unwarmed)

    def sweep_topics(self) -> None:
        """Re-created and deleted topics, found by one DescribeTopics round over the known topics
        (control/identity.py)."""
        with self.lock:
            self.lifecycle.sweep(self.clock())

    def _require(self, topics: Iterable[str]) -> list[str]:
        """groups.required count on the topics just merged, offsets or not; returns the topics where one had to be
        added back (every partition of them is evaluated again)."""
        layers = self._layers()
        required = {t: layers(t).groups_required for t in topics}
        return self.state.require_groups(required) if any(required.values()) else []

    def _learn(self, topics: Iterable[str]) -> None:
        """Record the topic IDs of topics merged for the first time (control/identity.py); a cluster that does not
        answer leaves them for the next batch, and the send-time check still reads the log."""
        try:
            self.lifecycle.learn(dict.fromkeys(topics))
        except Exception as exc:
            log.debug("topic IDs not read this batch: %s", exc)

    def _forget_partitions(self, topic: str, parts: list[int]) -> None:
        """A topic's state was reset or dropped: what this process remembers of its partitions goes too."""
        self.scheduled.forget()
        for n in parts:
            self.metrics.partitions.forget((topic, n))

    def forget_scheduled(self) -> None:
        """The state was wiped (a rebuild): store every deadline again, record every topic ID again."""
        with self.lock:
            self.scheduled.forget()
            self.lifecycle.forget_learned()

    def track_evaluated(self) -> None:
        """Remember which partitions this process evaluates, for `evaluate_rest` (`run --once`)."""
        self._evaluated = {}

    def _mark_evaluated(self, keys: Iterable[tuple[str, int]]) -> None:
        if self._evaluated is not None:
            for topic, n in keys:
                self._evaluated.setdefault(topic, set()).add(n)

    def evaluate_rest(self) -> int:
        """`run --once` at its end: every partition this run has not evaluated yet, and those whose deadline has
        passed since. A partition a batch of this run evaluated seconds ago would plan the same again: only time or a
        change makes a plan differ, and a change goes through a batch or a config event, which evaluate what they
        touch. Returns how many were evaluated."""
        with self.lock, gc_paused():
            done = self._evaluated or {}
            keys = [(t, n) for t, n in self.state.all_partitions() if n not in done.get(t, ())]
            keys = list(dict.fromkeys(keys + self.state.due(self.clock())))
            self._evaluate(keys, "full")
            self._dispatch()
            return len(keys)

    def evaluate_all(self) -> int:
        """Evaluate every known partition (`run --once`, and start-up after a long pause); returns how many."""
        with self.lock, gc_paused():
            keys = self.state.all_partitions()
            self._evaluate(keys, "full")
            self._dispatch()
            return len(keys)

    # ---- decide ----

    def _evaluate(self, keys: Iterable[tuple[str, int]], trigger: str) -> None:
        """Evaluate in chunks (Redis round trips stay bounded however many partitions are due), each chunk topic by
        topic. The reads of the next chunks (each one pipelined round trip on a single server) and the deadlines of
        the last ones go through `self.io` while this one is planned; every call has finished when this returns."""
        keys = list(dict.fromkeys(keys))
        self._mark_evaluated(keys)
        chunks: list[dict[str, list[int]]] = []
        for start in range(0, len(keys), EVAL_CHUNK):
            by_topic: dict[str, list[int]] = {}
            for topic, n in keys[start : start + EVAL_CHUNK]:
                by_topic.setdefault(topic, []).append(n)
            chunks.append(by_topic)
        with self.io.settled():
            reads = self.io.ahead(self.state.read_chunks, [(list(by_topic.items()),) for by_topic in chunks])
            for by_topic, read in zip(chunks, reads, strict=True):
                self._evaluate_chunk(by_topic, trigger, iter(read))

    def _evaluate_chunk(self, by_topic: dict[str, list[int]], trigger: str, reads: Iterator[ChunkRead]) -> None:
        """Evaluate a chunk topic by topic, each topic's partitions at once (`_evaluate_topic`)."""
        now = self.clock()
        allowed = self.deletes_allowed()
        writes = _ChunkWrites()
        for topic, parts in by_topic.items():
            self._evaluate_topic(topic, parts, now, allowed, writes, next(reads))
        if writes.schedule:
            self.io.submit(self._store, writes.schedule)
        writes.flush(self.state, now)
        for topic in writes.restore_checks:  # after the flush: the check reads the records it wrote
            self._maybe_restore(topic, now)
        self.metrics.evaluations.labels(trigger).inc(sum(len(parts) for parts in by_topic.values()))

    def _evaluate_topic(
        self, topic: str, parts: list[int], now: int, allowed: bool, writes: _ChunkWrites, read: ChunkRead
    ) -> None:
        """Plan a chunk of one topic's partitions from its arrays (policy/rules.py): where nothing is due, a deadline,
        and metrics (`rules.quiet`); where a rule is crossed, a record waits or the topic is
        excluded, the decisions over arrays (`rules.due`) and the records judged one by one (`plan.plans`). Its
        deadlines that changed since this process stored them (control/scheduled.py) join the chunk's writes."""
        chunk = plan_chunk(self.state, self._layers(), topic, parts, now, read)
        deadlines = chunk.q.deadline.copy()
        topic_th = self.thresholds(topic)  # resolved once: a pydantic validation per partition was 10 µs
        rows = np.flatnonzero(chunk.full).tolist()
        if rows:
            ev = Evaluation(chunk.nums, chunk.limits, chunk.q, due_now(chunk.nums, chunk.limits, chunk.q, now), now)
            found = plans(topic, ev, rows, lambda row: chunk.scoped.get(row, topic_th), chunk.records, allowed,
                          self._caps(chunk, ev.d, now, topic_th))  # fmt: skip
            for row, plan in zip(rows, found, strict=True):
                self._apply(plan, writes)
                deadlines[row] = NONE if plan.deadline is None else plan.deadline
            acted = [row for row in rows if not chunk.limits.excluded[row]]
            stats = stats_rows(acted, chunk.nums, chunk.limits, chunk.q, ev.d)
            self.metrics.partitions.update_many(
                [((topic, chunk.parts[r]), st) for r, st in zip(acted, stats, strict=True)]
            )
            for row in rows:  # an excluded topic's partitions have no metrics
                if chunk.limits.excluded[row]:
                    self.metrics.partitions.forget((topic, chunk.parts[row]))
        self.metrics.partitions.update_many(chunk.calm_stats())
        ix = np.flatnonzero(self.scheduled.changed(topic, parts, deadlines))
        if len(ix):
            some = [parts[i] for i in ix.tolist()]
            writes.schedule.append((topic, some, deadlines[ix].tolist()))

    def _store(self, chunks: list[tuple[str, list[int], list[int]]]) -> None:
        """Store a chunk's deadlines that changed (run by `self.io`), then remember them."""
        self.state.schedule_many(chunks)
        for topic, parts, deadlines in chunks:
            self.scheduled.remember(topic, parts, deadlines)

    def _caps(self, chunk: TopicChunk, d: Due, now: int, topic_th: Thresholds) -> dict[int, int]:
        """row -> the compacted view's horizon, for the rows with a delete to cap (compaction service)."""
        caps: dict[int, int] = {}
        if self.view_caps is None:
            return caps
        for row in np.flatnonzero((d.before != NONE) & ~chunk.limits.excluded).tolist():
            cap = self.view_caps.cap(chunk.topic, chunk.parts[row], chunk.scoped.get(row, topic_th), now)
            if cap is not None:
                caps[row] = cap
        return caps

    def _layers(self) -> BatchThresholds:
        holds = None if self.readers is None else self.readers.holds(self.layers)
        return BatchThresholds(self.layers, self.own_topics, holds)

    def _apply(self, plan: PartitionPlan, writes: _ChunkWrites) -> None:
        """Carry out one partition's plan: its answered records and new decisions join the chunk's writes (one
        transaction per chunk); a topic with an answered compaction is checked for a config to restore after it."""
        writes.answered.extend(plan.answered)
        if plan.compactions_answered:
            writes.restore_checks[plan.topic] = None
        for why in plan.dropped:
            log.error("dropped unsafe decision: %s", why)
        writes.queued.extend(plan.enqueue)
