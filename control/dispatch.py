"""The act side of the controller: the outbox sent within the caps, each action checked once more right before it
goes, its outcome audited before it leaves the outbox, and nudged configs put back.

A mixin of `Controller` (control/controller.py), which owns the state, sinks, clock and lock these methods use: the
evaluation decides what to do, this module does it, and the two only meet in the outbox.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from compactd.control.evaluation import BatchThresholds
from compactd.control.identity import BehindHighWatermark
from compactd.errors import DeliveryTimeout, DependencyUnavailable
from compactd.model import ActionRecord, PartitionView
from compactd.policy.identity import commit_outlived, report_outlived, view_outlived
from compactd.policy.plan import NOT_CAUGHT_UP, cluster_check, send_check
from compactd.policy.readers import fold_view, readers_say_no
from compactd.policy.thresholds import Thresholds, group_counts, resolve_global, topic_excluded
from compactd.policy.throttle import backoff_ms

if TYPE_CHECKING:
    import threading

    from compactd.control.controller import ViewCapReader
    from compactd.control.identity import Lifecycle
    from compactd.control.metrics import Metrics
    from compactd.control.readers import Readers
    from compactd.kafka.groups import GroupCheck
    from compactd.policy.throttle import TokenBucket
    from compactd.sinks.audit import AuditLog
    from compactd.sinks.base import ActionSink
    from compactd.sinks.dry_run import DryRunSink
    from compactd.state.protocols import ControllerState

log = logging.getLogger("compactd.controller")

# what to change when a reader's position cannot be read (control/readers.py)
BLIND_SETTING = {"share_group": "Describe and Read on topic __share_group_state",
                 "spark_checkpoint": "the reader's spark_checkpoint (readers: / reader:<name>)"}  # fmt: skip
OUTBOX_PAGE = 1000  # due records read per round trip
OUTBOX_PAGES = 100  # at most this many pages a round: 100,000 records, then the next round goes on
# how long a delete held behind the high watermark waits before its partition is asked again: a follower catches up
# within `replica.lag.time.max.ms` (30 s by default), and a thousand held partitions are not asked every round
BEHIND_RECHECK_MS = 5_000
# commits made under an earlier leader whose last record below is read in one check: after a leader change, every
# group that has not read since (an idle one keeps its old epoch) is checked, one read per distinct offset
EPOCH_READS = 100
# Kafka's cleaner, nudged, would remove what the service's next run has yet to read (issue 64)
NUDGE_UNDER_SERVICE = "compaction.service is on: compactd compacts the topic itself, Kafka's cleaner is not nudged"
NUDGE_CHECK_MS = 15_000  # how often nudges still on are checked for a restore (Kafka's cleaner backoff)


class Dispatch:
    """What `Controller` carries out (see the module docstring); the attributes are the controller's."""

    state: ControllerState
    layers: dict[str, Mapping[str, Any]]
    lock: threading.Lock
    clock: Callable[[], int]
    monotonic: Callable[[], float]
    sink: ActionSink
    dry: DryRunSink
    audit: AuditLog | None
    metrics: Metrics
    bucket: TokenBucket
    lifecycle: Lifecycle
    own_topics: frozenset[str]
    deletes_allowed: Callable[[], bool]
    cluster_offsets: Callable[[str, bool], GroupCheck] | None
    strict_groups: bool
    view_caps: ViewCapReader | None
    readers: Readers | None
    probe: Callable[[str, int], None]
    held_back: int
    outcomes: Counter[str]
    _nudges_checked_at: int
    # partitions whose delete a round held behind the high watermark: when it is asked again, and why it waits
    _behind: dict[tuple[str, int], tuple[int, str]]

    def thresholds(self, topic: str, partition: int | None = None) -> Thresholds: ...

    def restore_nudges(self) -> int:
        """Every nudge still on (after a state loss the ledger brought them back, with no compaction pending) is put
        back once no compaction is pending on its topic, or once it has been on compaction.nudge.max.ms; returns
        how many restores were queued. Runs every NUDGE_CHECK_MS of the tick."""
        with self.lock:
            now = self.clock()
            if now - self._nudges_checked_at < NUDGE_CHECK_MS:
                return 0
            self._nudges_checked_at = now
            queued = 0
            since_by_topic: dict[str, int] = {}
            for n in self.state.nudges():
                since_by_topic[n.topic] = min(n.at, since_by_topic.get(n.topic, n.at))
            for topic, since in since_by_topic.items():
                th = self.thresholds(topic)
                expired = now - since >= th.compaction_nudge_max_ms
                if expired:
                    self.state.rest_nudges(topic, th.compaction_nudge_max_ms)
                    log.warning(
                        "nudge of %s on for %ds without the cleaner answering: put back, and not nudged again "
                        "for compaction.nudge.max.ms=%d",
                        topic, (now - since) // 1000, th.compaction_nudge_max_ms,
                    )  # fmt: skip
                queued += self._maybe_restore(topic, now, "nudge_expired" if expired else "compacted")
            if queued:
                self._dispatch()
            return queued

    def _maybe_restore(self, topic: str, now: int, reason: str = "compacted") -> int:
        """Put a nudged topic config back once no partition of the topic has a compaction pending (at once when
        `reason` is nudge_expired). Returns 1 when a restore was queued."""
        if not self.state.nudged(topic) or (reason == "compacted" and self.state.live_compactions(topic)):
            return 0
        rec = ActionRecord(
            id=f"restore-{topic}-{now}",
            action="restore_config",
            topic=topic,
            partition=-1,
            reason=reason,
            dry_run=False,
            decided_at=now,
            status="pending",
        )
        self.state.enqueue(rec)
        return 1

    # ---- act ----

    def drain(self) -> int:
        """Dispatch what is due now; returns how many due actions the rate cap still holds back."""
        with self.lock:
            self._dispatch()
            return self.held_back

    def _dispatch(self) -> None:
        """Send what the outbox holds that is due, within the caps, re-checking each action right before it goes.

        Dry-run records and skips go out at once. A refused or timed-out send stays in the outbox with exponential
        backoff, and ends this round's sending: when the cluster fails one request it is likely to fail the next.
        A delete a reader that cannot be read holds fails the same way, and the round goes on: that reader holds
        its own topics, not the cluster's other sends.
        """
        now = self.clock()
        g = resolve_global(self.layers)
        in_flight: int | None = None
        failed_round = False
        sending, held, rate_held = True, 0, 0
        behind: dict[tuple[str, int], str] = {}
        finished: list[ActionRecord] = []
        # the pager asks, between pages, whether this round may still send: late binding is the point
        for rec in self._due(now, lambda: sending):  # noqa: B023
            th = self.thresholds(rec.topic, rec.partition if rec.partition >= 0 else None)
            if rec.dry_run or (th.dry_run and rec.action != "restore_config"):
                # dry.run set since the decision: still dry
                finished.append(self.dry.execute(msgspec.structs.replace(rec, dry_run=True)))
                continue
            try:
                why = self._why_not_now(rec, th, now)
            except DependencyUnavailable as exc:  # a blind reader: it may be behind, the delete waits
                finished.append(self._failed(rec, rec.with_status("failed", error=str(exc)), th, now))
                continue
            if why is not None:
                done = rec.with_status("skipped", why=why)
            elif not sending:
                held += 1
                rate_held += not failed_round
                continue
            elif (
                rec.action == "delete_records"
                and (wait := self._behind.get((rec.topic, rec.partition))) is not None
                and now < wait[0]
            ):
                held += 1  # asked again at wait[0]: one ListOffsets per partition held, not one per round
                behind[(rec.topic, rec.partition)] = wait[1]
                continue
            else:
                if rec.action == "compact":
                    if in_flight is None:
                        in_flight = self.state.compactions_in_flight()
                    if in_flight >= g.max_concurrent_nudges:
                        held += 1  # waits in the outbox until a nudged partition shows up compacted
                        continue
                try:
                    # the partition's state, read once for the checks that judge a delete by it
                    judged = rec.action == "delete_records" and self.lifecycle.reader is not None
                    view = self.state.views([(rec.topic, rec.partition)])[0] if judged else None
                    why = (
                        self._stale(rec, now, view)
                        or self._cluster_says_no(rec, th)
                        or self._reports_outlived(rec, view)
                        or self._view_outlived(rec)
                        # the topic's ID again, last: the checks above may take seconds (a coordinator child's
                        # start, two request timeouts, log reads), and DeleteRecords goes by name. A topic deleted
                        # and created again meanwhile lost its groups' offsets: the group check held nothing
                        or (self._stale(rec, now, None) if judged else None)
                    )
                except BehindHighWatermark as exc:  # the followers have not caught up: it waits, the round goes on
                    held += 1
                    behind[(rec.topic, rec.partition)] = str(exc)
                    if (rec.topic, rec.partition) not in self._behind:
                        log.warning("delete held until the followers catch up: %s", exc)
                    self._behind[(rec.topic, rec.partition)] = (now + BEHIND_RECHECK_MS, str(exc))
                    continue
                except DependencyUnavailable as exc:  # the cluster cannot vouch for the action: not now
                    done, why = rec.with_status("failed", error=str(exc)), None
                else:
                    if why is not None:
                        finished.append(rec.with_status("skipped", why=why))
                        continue
                    if not self.bucket.take(self.monotonic()):
                        held += 1
                        rate_held += 1
                        sending = False  # the rate cap is global: nothing else may go this round
                        continue
                    done = self.sink.execute(rec)
                    if rec.action == "compact" and done.status == "sent":
                        self.probe("after_nudge", 0)  # the topic's config is altered, its record not yet written
                    if done.detail.get("stale"):  # the sink's own last check: a delete past the log end
                        self.lifecycle.stale(rec.topic, f"{rec.topic}/{rec.partition}: {done.detail['stale']}")
                if done.status == "sent" and rec.action == "compact" and in_flight is not None:
                    in_flight += 1
                if done.status == "failed":
                    done = self._failed(rec, done, th, now)
                    sending, failed_round = False, True
            finished.append(done)
        self.held_back = rate_held
        self.metrics.actions_held.set(held)
        self.metrics.deletes_behind_hw.set(len(behind))
        self._behind = {k: v for k, v in self._behind.items() if k in behind}  # the others went, or were dropped
        self._finish(finished)
        self.lifecycle.settle(now)  # after the records went: a reset drops them from the live set
        self.metrics.outbox_depth.set(self.state.outbox_depth())

    @staticmethod
    def _failed(rec: ActionRecord, done: ActionRecord, th: Thresholds, now: int) -> ActionRecord:
        """`done`, the failed outcome of `rec`, with its try counted and when it is due again (exponential backoff,
        up to action.retry.ms): `_finish` keeps it in the outbox until then."""
        tries = int(rec.detail.get("try", 0)) + 1
        retry_at = now + backoff_ms(tries, th.action_backoff_ms, th.action_retry_ms)
        return done.with_status("failed", **{"try": tries, "retry_at": retry_at})

    def _due(self, now: int, sending: Callable[[], bool]) -> Iterator[ActionRecord]:
        """The outbox's due records, oldest first, a page at a time, read on past records this round holds: with 1,000
        or more compactions waiting for `compaction.max.concurrent` at the head, the deletes and restores behind them
        were never read. Paging stops when nothing more may be sent this round (`sending()` false: the
        rate cap, or a failed send) or after OUTBOX_PAGES pages."""
        for page in range(OUTBOX_PAGES):
            records = self.state.outbox(now, limit=OUTBOX_PAGE, start=page * OUTBOX_PAGE)
            yield from records
            if len(records) < OUTBOX_PAGE or not sending():
                return

    def _why_not_now(self, rec: ActionRecord, th: Thresholds, now: int) -> str | None:
        """The guards that hold at send time as well as at decision time. Raises DependencyUnavailable when a reader
        that counts on the topic cannot be read now (`_dispatch` fails the delete, and tries it again)."""
        if rec.action == "restore_config":
            return None  # puts a topic's own config back: always wanted
        if rec.action == "compact" and th.compaction_service:  # decided before the service was turned on
            return NUDGE_UNDER_SERVICE
        if rec.action == "delete_records" and not self.deletes_allowed():
            return NOT_CAUGHT_UP
        excluded = topic_excluded(rec.topic, th, self.own_topics)
        view = self.state.views([(rec.topic, rec.partition)])[0] if rec.action == "delete_records" else None
        if view is None:
            return excluded
        if self.readers is not None and rec.reason == "consumed_retention":
            # the readers read now, whatever the batch saw: one may have appeared or fallen behind since
            layers = BatchThresholds(self.layers, self.own_topics, self.readers.holds(self.layers, fresh=True))
            holds = layers.readers(rec.topic, th)
            blind = next((h for h in holds if h.blind), None)
            if blind is not None and not excluded:  # cannot be read now: held, and tried again soon (not skipped)
                setting = BLIND_SETTING.get(blind.kind, "readers:")
                raise DependencyUnavailable(blind.label, rec.topic, setting, blind.blind)
            no = (
                None
                if rec.before_offset is None
                else readers_say_no(rec.before_offset, holds, rec.topic, rec.partition)
            )
            if no is not None:
                return excluded or no
            view = fold_view(view, holds)
        cap = None if self.view_caps is None else self.view_caps.cap(rec.topic, rec.partition, th, now, fresh=True)
        return send_check(rec, view, th, now, excluded, cap)

    def _stale(self, rec: ActionRecord, now: int, view: PartitionView | None) -> str | None:
        """Why `rec` must not go because its topic is not the log its state describes (control/identity.py).
        BehindHighWatermark passes through: the delete waits for the followers."""
        if rec.action not in ("delete_records", "compact"):
            return None
        # a delete is judged by the log's evidence too; a nudge (put back whatever happens) by the topic ID alone
        deleting = self.lifecycle.reader is not None and rec.action == "delete_records"
        try:
            return self.lifecycle.check(rec, view if deleting else None, now)
        except BehindHighWatermark:
            raise
        except Exception as exc:  # the cluster cannot say which log it holds: hold the action
            why = str(exc)
            raise DependencyUnavailable("Kafka (topic check)", rec.topic, "the topic's Describe ACL", why) from None

    def _cluster_says_no(self, rec: ActionRecord, th: Thresholds) -> str | None:
        """The last guard before a consumed-retention delete goes: the committed offsets of the topic's groups as
        the cluster holds them (`cluster_check`). Raises DependencyUnavailable when they cannot be read."""
        if self.cluster_offsets is None or rec.action != "delete_records" or rec.reason != "consumed_retention":
            return None
        why = None
        for fresh in (False, True):  # a cached answer that holds the delete is read again: it may be the older
            seen = self.cluster_offsets(rec.topic, fresh)
            why = cluster_check(rec, seen.committed, th, seen.unlisted, self.strict_groups, seen.assigned)
            if why is None:
                break
        if why is None:
            why = self._commits_outlived(rec, seen, th)
        counted_unlisted = [g for g in seen.unlisted if group_counts(g, th)]
        self.metrics.groups_unlisted.labels(rec.topic).set(len(counted_unlisted))
        if counted_unlisted:
            self.state.note_unlisted(rec.topic, sorted(counted_unlisted), self.clock())
        if why is not None:
            log.warning("delete of %s/%d before %s held back: %s", rec.topic, rec.partition, rec.before_offset, why)
        return why

    def _commits_outlived(self, rec: ActionRecord, seen: GroupCheck, th: Thresholds) -> str | None:
        """Why the counted groups' commits on the partition no longer vouch for the records below them: the log was
        truncated under them, by an unclean leader election (policy/identity.py `commit_outlived`). Only a commit
        made in an older leader epoch than the partition's now is looked into, once per offset, by the last record
        below it (Read on the topic). Raises DependencyUnavailable when the log cannot say."""
        reader = self.lifecycle.reader
        commits = {g: c for g, c in sorted(seen.on(rec.partition).items()) if group_counts(g, th)}
        if reader is None or not commits:
            return None
        try:
            high, epoch_now = reader.leader_epoch(rec.topic, rec.partition)
            below: dict[int, tuple[int, int] | None] = {}
            for group, (offset, epoch) in sorted(commits.items(), key=lambda kv: kv[1]):
                if offset <= high and (epoch < 0 or epoch >= epoch_now):
                    continue  # no epoch to judge by, or the commit was made under the leader of now
                if offset <= high and offset not in below:
                    if len(below) == EPOCH_READS:
                        return (
                            f"more than {EPOCH_READS} offsets committed under an earlier leader epoch to read the log "
                            "under: held until the groups commit under the leader of now"
                        )
                    below[offset] = reader.last_record_below(rec.topic, rec.partition, offset)
                why = commit_outlived(group, offset, epoch, high, below.get(offset))
                if why is not None:
                    return why
        except Exception as exc:
            raise DependencyUnavailable(
                "Kafka (the log under the groups' commits)", rec.topic, "Read on the topic", str(exc)
            ) from None
        return None

    def _reports_outlived(self, rec: ActionRecord, view: PartitionView | None) -> str | None:
        """The last guard before a delete goes, whatever its rule: the segments it was decided by, where their
        reports carry the leader epoch of their last record, still hold the log's records below it
        (policy/identity.py `report_outlived`). Only a partition whose leader epoch now is later than a report's is
        read (the last record below the delete; Read on the topic). Raises DependencyUnavailable when the log
        cannot say."""
        reader = self.lifecycle.reader
        if reader is None or view is None or rec.action != "delete_records" or rec.before_offset is None:
            return None
        segments = [s for s in view.segments if s.base_offset < rec.before_offset]
        epochs = self.state.segment_epochs(rec.topic, rec.partition, [s.base_offset for s in segments])
        if not epochs:
            return None  # reports without epochs (the contract's JSON events): the log end is the only evidence
        try:
            _, epoch_now = reader.leader_epoch(rec.topic, rec.partition)
            if 0 <= epoch_now <= min(epochs.values()):
                return None  # no leader since the reports: nothing was written again
            below = reader.last_record_below(rec.topic, rec.partition, rec.before_offset)
        except Exception as exc:
            raise DependencyUnavailable(
                "Kafka (the log under the segments' reports)", rec.topic, "Read on the topic", str(exc)
            ) from None
        why = report_outlived(below, segments, epochs)
        if why is not None:
            log.warning("delete of %s/%d before %s skipped: %s", rec.topic, rec.partition, rec.before_offset, why)
        return why

    def _view_outlived(self, rec: ActionRecord) -> str | None:
        """The last guard before a delete under a compacted view goes: the log below it was not written again since
        the view read it (an unclean leader election under the view, policy/identity.py `view_outlived`). The
        compaction trigger finds it too, and caps the topic's deletes at 0 until the view is rebuilt; this holds the
        deletes decided before its next check. Only a partition whose leader epoch moved since is read (the last
        record below the delete; Read on the topic). Raises DependencyUnavailable when the log cannot say."""
        reader = self.lifecycle.reader
        if reader is None or self.view_caps is None or rec.action != "delete_records" or rec.before_offset is None:
            return None
        epoch_read = self.view_caps.epoch_read(rec.topic, rec.partition)  # as `_why_not_now`'s fresh cap read it
        if epoch_read < 0:
            return None
        try:
            _, epoch_now = reader.leader_epoch(rec.topic, rec.partition)
            if epoch_now <= epoch_read:
                return None  # no leader since the view read the partition: nothing was written again
            below = reader.last_record_below(rec.topic, rec.partition, rec.before_offset)
        except Exception as exc:
            raise DependencyUnavailable(
                "Kafka (the log under the compacted view)", rec.topic, "Read on the topic", str(exc)
            ) from None
        why = view_outlived(epoch_read, rec.before_offset, below)
        if why is not None:
            log.warning("delete of %s/%d before %s held back: %s", rec.topic, rec.partition, rec.before_offset, why)
        return why

    def _finish(self, finished: list[ActionRecord]) -> None:
        """Audit every outcome, then move each record on: completed, or kept for its retry."""
        for done in finished:
            if self.audit is not None and done.action != "restore_config":
                self.audit.publish(done)
            self.metrics.actions.labels(done.action, done.reason, done.status).inc()
            if done.status == "failed":
                log.warning("action failed (retry at %s): %s", done.detail.get("retry_at"), done.audit())
        audited = True
        if finished and self.audit is not None:
            try:
                self.audit.flush()
            except DeliveryTimeout as exc:
                audited = False
                log.warning("audit topic unavailable, actions stay in the outbox: %s", exc)
        # Leave the outbox only once the audit records are durable: a crash before this repeats, never loses.
        # A failed send changed nothing on the cluster, so its backoff is kept even when its audit record is late.
        completed = []
        for done in finished:
            if done.status == "failed":
                self.state.retry(msgspec.structs.replace(done, status="pending"), int(done.detail["retry_at"]))
                self.outcomes["failed"] += 1
            elif audited:
                completed.append(done)
                self.outcomes[done.status] += 1
        self.state.complete(*completed)
