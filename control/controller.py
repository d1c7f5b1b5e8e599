"""The driver-side loop body: merge (state/) → decide (policy/, pure) → act (sinks/).

Runs from foreachBatch for new events and from a ticker for deadlines that time alone makes due; one lock keeps
the two from interleaving. Each partition is planned by `policy.plan.plan_partition` (pure) and the plan is then
applied here: records answered, decisions queued in the outbox, deadlines stored, and the outbox dispatched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from compactd.clock import now_ms
from compactd.metrics import Metrics
from compactd.model import ActionRecord
from compactd.policy.plan import NOT_CAUGHT_UP, PartitionPlan, plan_partition
from compactd.policy.thresholds import Thresholds, group_counts, resolve, topic_excluded
from compactd.sinks.audit import AuditLog
from compactd.sinks.base import ActionSink
from compactd.sinks.dry_run import DryRunSink
from compactd.state.changes import BatchChanges
from compactd.state.protocols import ControllerState

log = logging.getLogger("compactd.controller")

EVAL_CHUNK = 2000
# A probe is called at named points of a batch ("after_merge", "after_enqueue") with the batch id; crash tests
# inject one that kills the process there, the way an OOM kill or a node loss would.
Probe = Callable[[str, int], None]


def _no_probe(point: str, batch_id: int) -> None:
    pass


class Controller:
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
    ) -> None:
        self.state = state
        self.layers = dict(layers)
        self.own_topics = own_topics
        self.sink = sink
        self.dry = DryRunSink()
        self.audit = audit
        self.metrics = metrics
        self.clock = clock
        self.deletes_allowed = deletes_allowed
        self.probe = probe
        self.lock = threading.Lock()
        # what this process carried out, by final status: the `run --once` summary line reads it
        self.outcomes: Counter[str] = Counter()

    # ---- configuration ----

    def thresholds(self, topic: str, partition: int | None = None) -> Thresholds:
        return resolve(self.layers, topic, partition)

    def set_layers(self, layers: Mapping[str, Mapping[str, Any]]) -> None:
        """New effective threshold layers (a config event was applied); the next evaluation uses them."""
        with self.lock:
            self.layers = {scope: dict(values) for scope, values in layers.items()}

    def recount_groups(self, topics: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """groups.include/exclude changed: rebuild which groups hold each topic back; returns its partitions."""
        with self.lock:
            per_topic: dict[str, Thresholds] = {}

            def counts(group: str, topic: str) -> bool:
                if topic not in per_topic:
                    per_topic[topic] = self.thresholds(topic)
                return group_counts(group, per_topic[topic])

            return self.state.recount(counts, topics)

    # ---- entry points ----

    def on_batch(self, stream_id: str, batch_id: int, changes: BatchChanges) -> int:
        """Merge one micro-batch, evaluate the partitions it touched, act. Returns how many were touched."""
        with self.lock:
            started = time.monotonic()
            per_topic: dict[str, Thresholds] = {}  # resolve each topic's thresholds once per batch

            def counts(group: str, topic: str) -> bool:
                if topic not in per_topic:
                    per_topic[topic] = self.thresholds(topic)
                return group_counts(group, per_topic[topic])

            touched, replayed = self.state.merge(stream_id, batch_id, changes, counts)
            self.probe("after_merge", batch_id)
            self.metrics.batches.labels("replayed" if replayed else "merged").inc()
            keys = [(t, p) for t, parts in touched.items() for p in sorted(parts)]
            self._evaluate(keys, "batch")
            self.probe("after_enqueue", batch_id)
            self._dispatch()
            self.metrics.batch_seconds.observe(time.monotonic() - started)
            return len(keys)

    def tick(self) -> None:
        """Evaluate the partitions whose deadline has passed, and drain the outbox."""
        with self.lock:
            self._evaluate(self.state.due(self.clock()), "deadline")
            self._dispatch()

    def evaluate(self, keys: Iterable[tuple[str, int]], trigger: str) -> int:
        """Evaluate these partitions now (a config change touched them); returns how many."""
        with self.lock:
            keys = list(keys)
            self._evaluate(keys, trigger)
            self._dispatch()
            return len(keys)

    def evaluate_all(self) -> int:
        """Evaluate every known partition (`run --once`, and start-up after a long pause); returns how many."""
        with self.lock:
            keys = self.state.all_partitions()
            self._evaluate(keys, "full")
            self._dispatch()
            return len(keys)

    # ---- decide ----

    def _evaluate(self, keys: Iterable[tuple[str, int]], trigger: str) -> None:
        """Evaluate in chunks: Redis round trips stay bounded however many partitions are due."""
        keys = list(dict.fromkeys(keys))
        for start in range(0, len(keys), EVAL_CHUNK):
            self._evaluate_chunk(keys[start : start + EVAL_CHUNK], trigger)

    def _evaluate_chunk(self, keys: list[tuple[str, int]], trigger: str) -> None:
        now = self.clock()
        views = self.state.views(keys)
        records = self.state.records(keys)
        allowed = self.deletes_allowed()
        plans = []
        for view in views:
            th = self.thresholds(view.topic, view.partition)
            key = (view.topic, view.partition)
            excluded = topic_excluded(view.topic, th, self.own_topics)
            plans.append(plan_partition(view, th, records[key], now, allowed, excluded))
        for plan in plans:
            self._apply(plan, now)
        self.state.set_deadlines({(p.topic, p.partition): p.deadline for p in plans})
        self.state.set_compaction_due({(p.topic, p.partition): p.compaction_due for p in plans})
        self.metrics.evaluations.labels(trigger).inc(len(views))
        oldest = self.state.oldest_compaction_due()
        # KIP-354's max-compaction-delay-secs, over every partition compactd tracks
        self.metrics.max_compaction_delay.set(0 if oldest is None else max(now - oldest, 0) / 1000)

    def _apply(self, plan: PartitionPlan, now: int) -> None:
        for rec in plan.answered:
            self.state.answer(rec, now)
        if plan.compactions_answered:
            self._maybe_restore(plan.topic, now)
        for why in plan.dropped:
            log.error("dropped unsafe decision: %s", why)
        for rec in plan.enqueue:
            self.state.enqueue(rec)

    def _maybe_restore(self, topic: str, now: int) -> None:
        """Put a nudged topic config back once no partition of the topic has a compaction pending."""
        if self.state.live_compactions(topic) or not self.state.nudged(topic):
            return
        rec = ActionRecord(
            id=f"restore-{topic}-{now}",
            action="restore_config",
            topic=topic,
            partition=-1,
            reason="compacted",
            dry_run=False,
            decided_at=now,
            status="pending",
        )
        self.state.enqueue(rec)

    # ---- act ----

    def _dispatch(self) -> None:
        finished = []
        for rec in self.state.outbox():
            if rec.dry_run:
                done = self.dry.execute(rec)
            elif rec.action == "delete_records" and not self.deletes_allowed():
                done = rec.with_status("skipped", why=NOT_CAUGHT_UP)
            else:
                done = self.sink.execute(rec)
            if self.audit is not None and done.action != "restore_config":
                self.audit.publish(done)
            self.metrics.actions.labels(done.action, done.reason, done.status).inc()
            if done.status == "failed":
                log.warning("action failed: %s", done.audit())
            finished.append(done)
        if finished and self.audit is not None:
            self.audit.flush()
        # Leave the outbox only once the audit records are durable: a crash before this repeats, never loses.
        for done in finished:
            self.state.complete(done)
            self.outcomes[done.status] += 1
        self.metrics.outbox_depth.set(self.state.outbox_depth())
