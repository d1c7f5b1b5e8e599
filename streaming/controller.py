"""The driver-side loop body: merge (state/) → decide (policy/) → act (sinks/).

Runs from foreachBatch for new events and from a ticker for deadlines that time alone makes due; one
lock keeps the two from interleaving.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from policy.config import Thresholds, group_counts, resolve
from policy.model import ActionRecord, Decision, PartitionView, action_id
from policy.rules import decide, earliest_uncompacted_ts, is_answered, next_deadline, should_record
from sinks.audit import AuditLog
from sinks.base import ActionSink
from sinks.dry_run import DryRunSink
from state.changes import BatchChanges
from state.store import RedisState
from streaming.metrics import Metrics

log = logging.getLogger("compactd.controller")


NOT_CAUGHT_UP = "offsets not caught up"
EVAL_CHUNK = 2000


def now_ms() -> int:
    return int(time.time() * 1000)


class UnsafeDecision(AssertionError):
    """A decision broke a safety invariant; it is dropped and logged, never sent."""


class Controller:
    def __init__(
        self,
        state: RedisState,
        layers: Mapping[str, Mapping[str, Any]],
        sink: ActionSink,
        audit: AuditLog | None,
        metrics: Metrics,
        clock: Callable[[], int] = now_ms,
        deletes_allowed: Callable[[], bool] = lambda: True,
    ) -> None:
        self.state = state
        self.layers = dict(layers)
        self.sink = sink
        self.dry = DryRunSink()
        self.audit = audit
        self.metrics = metrics
        self.clock = clock
        self.deletes_allowed = deletes_allowed
        self.lock = threading.Lock()
        # Test hook for crash tests: COMPACTD_FAULT=<after_merge|after_enqueue>:<batch_id> kills the process
        # with SIGKILL at that point of that batch, the way an OOM kill or a node loss would.
        point, _, batch = os.environ.get("COMPACTD_FAULT", "").partition(":")
        self._fault = (point, int(batch)) if batch.isdigit() else None

    # ---- configuration ----

    def thresholds(self, topic: str, partition: int | None = None) -> Thresholds:
        return resolve(self.layers, topic, partition)

    # ---- entry points ----

    def on_batch(self, stream_id: str, batch_id: int, changes: BatchChanges) -> None:
        with self.lock:
            started = time.monotonic()
            per_topic: dict[str, Thresholds] = {}  # resolve each topic's thresholds once per batch

            def counts(group: str, topic: str) -> bool:
                if topic not in per_topic:
                    per_topic[topic] = self.thresholds(topic)
                return group_counts(group, per_topic[topic])

            touched, replayed = self.state.merge(stream_id, batch_id, changes, counts)
            self._maybe_crash("after_merge", batch_id)
            self.metrics.batches.labels("replayed" if replayed else "merged").inc()
            keys = [(t, p) for t, parts in touched.items() for p in sorted(parts)]
            self._evaluate(keys, "batch")
            self._maybe_crash("after_enqueue", batch_id)
            self._dispatch()
            self.metrics.batch_seconds.observe(time.monotonic() - started)

    def _maybe_crash(self, point: str, batch_id: int) -> None:
        if self._fault == (point, batch_id):
            os.kill(os.getpid(), signal.SIGKILL)

    def tick(self) -> None:
        """Evaluate the partitions whose deadline has passed, and drain the outbox."""
        with self.lock:
            self._evaluate(self.state.due(self.clock()), "deadline")
            self._dispatch()

    def evaluate_all(self) -> None:
        """Evaluate every known partition (`run --once`, and start-up after a long pause)."""
        with self.lock:
            self._evaluate(self.state.all_partitions(), "full")
            self._dispatch()

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
        deadlines: dict[tuple[str, int], int | None] = {}
        compaction_due: dict[tuple[str, int], int | None] = {}
        for view in views:
            th = self.thresholds(view.topic, view.partition)
            live = self._settle(view, records[(view.topic, view.partition)], now)
            for decision in decide(view, th, now):
                existing = next((r for r in live if r.action == decision.action), None)
                if not should_record(decision, existing, now, th.action_retry_ms):
                    continue
                rec = self._record(decision, existing, view, th, now)
                if rec is None:
                    continue
                self.state.enqueue(rec)
                live = [r for r in live if r.action != rec.action] + [rec]
            deadlines[(view.topic, view.partition)] = next_deadline(view, th, live, now)
            earliest = earliest_uncompacted_ts(view)
            lag = th.max_compaction_lag_ms
            compaction_due[(view.topic, view.partition)] = None if lag is None or earliest is None else earliest + lag
        self.state.set_deadlines(deadlines)
        self.state.set_compaction_due(compaction_due)
        self.metrics.evaluations.labels(trigger).inc(len(views))
        oldest = self.state.oldest_compaction_due()
        # KIP-354's max-compaction-delay-secs, over every partition compactd tracks
        self.metrics.max_compaction_delay.set(0 if oldest is None else max(now - oldest, 0) / 1000)

    def _settle(self, view: PartitionView, records: list[ActionRecord], now: int) -> list[ActionRecord]:
        """Drop records the cluster has answered; put a nudged topic config back when none is left."""
        live = []
        for rec in records:
            if rec.detail.get("why") == NOT_CAUGHT_UP and self.deletes_allowed():
                continue  # held back by the readiness gate, which is open now: decide afresh
            if is_answered(rec, view):
                self.state.answer(rec, now)
                if rec.action == "compact" and rec.status == "sent":
                    self._maybe_restore(rec.topic, now)
            else:
                live.append(rec)
        return live

    def _maybe_restore(self, topic: str, now: int) -> None:
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

    def _record(
        self, d: Decision, existing: ActionRecord | None, view: PartitionView, th: Thresholds, now: int
    ) -> ActionRecord | None:
        same_target = existing is not None and existing.before_offset == d.before_offset
        attempts = existing.attempts + 1 if existing is not None and same_target else 1
        if d.action == "delete_records":
            try:
                check_delete_safe(d, view)
            except UnsafeDecision as exc:
                log.error("dropped unsafe decision: %s", exc)
                return None
        detail: dict[str, Any] = {}
        if d.action == "compact":
            detail["nudge"] = th.compaction_nudge
        return ActionRecord(
            id=action_id(d, attempts),
            action=d.action,
            topic=d.topic,
            partition=d.partition,
            reason=d.reason,
            dry_run=th.dry_run,
            decided_at=now,
            status="pending",
            before_offset=d.before_offset,
            delay_ms=d.delay_ms,
            earliest_ts=d.earliest_ts,
            attempts=attempts,
            detail=detail,
        )

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
        self.metrics.outbox_depth.set(self.state.outbox_depth())


def check_delete_safe(d: Decision, view: PartitionView) -> None:
    """The safety invariant, checked once more right before a delete goes to the outbox."""
    if d.before_offset is None or d.before_offset <= view.log_start:
        raise UnsafeDecision(f"{view.key}: before_offset {d.before_offset} not above log start {view.log_start}")
    if d.reason == "consumed_retention" and (view.min_committed is None or d.before_offset > view.min_committed):
        raise UnsafeDecision(f"{view.key}: before_offset {d.before_offset} past min committed {view.min_committed}")
