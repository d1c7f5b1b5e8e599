"""The decision rules: plain functions over (PartitionView, Thresholds, now).

Each rule of docs/contract.md ("Decisions") is one function here, the way Kafka's LogCleanerManager keeps
`maxCompactionDelay` apart from the cleaner threads. Nothing in this module does IO.
"""

from __future__ import annotations

from compactd.model import ActionRecord, Decision, PartitionView, Segment
from compactd.policy.thresholds import Thresholds


def live_segments(view: PartitionView) -> tuple[Segment, ...]:
    """Closed segments still on disk (not wholly below the log start), in offset order (kept on the view)."""
    return view.live_segments


def earliest_uncompacted_ts(view: PartitionView) -> int | None:
    """KIP-354 `earliest`: smallest first-batch max timestamp over dirty, non-active segments (kept on the view)."""
    return view.earliest_uncompacted_ts


def compaction_delay_ms(view: PartitionView, max_lag_ms: int, now: int) -> int | None:
    """KIP-354 `(now - max.compaction.lag.ms) - earliest`; positive means overdue. None: nothing dirty."""
    earliest = earliest_uncompacted_ts(view)
    if earliest is None:
        return None
    return now - max_lag_ms - earliest


def decide_compaction(view: PartitionView, th: Thresholds, now: int) -> Decision | None:
    """A record may stay uncompacted at most max.compaction.lag.ms; strictly past it we act."""
    if th.max_compaction_lag_ms is None:
        return None
    delay = compaction_delay_ms(view, th.max_compaction_lag_ms, now)
    if delay is None or delay <= 0:
        return None
    return Decision(
        action="compact",
        topic=view.topic,
        partition=view.partition,
        reason="max_compaction_lag",
        delay_ms=delay,
        earliest_ts=earliest_uncompacted_ts(view),
    )


def _deletable_end(view: PartitionView, age_ms: int, now: int, limit: int | None) -> int | None:
    """End of the longest run of oldest segments that are older than age_ms and end at or below limit.

    deleteRecords removes everything below its offset, so the run must be a prefix: the first segment
    that is too young or reaches past `limit` stops it. So does a gap: offsets between the log start or the segments
    before and the next segment's base that no segment event told compactd about (a state rebuilt from a source that
    lost events, before the agent's next full scan) are unknown, and unknown is never due.
    """
    end = None
    reach = view.log_start
    for seg in live_segments(view):
        if seg.base_offset > reach:
            break
        if limit is not None and seg.end_offset > limit:
            break
        if now - seg.closed_at <= age_ms:
            break
        end = seg.end_offset
        reach = max(reach, seg.end_offset)
    return end


def first_gap(view: PartitionView) -> tuple[int, Segment] | None:
    """(where, the segment after it): the first offsets above the log start that no known segment covers, which
    stop every delete there (`_deletable_end`). `compactd explain` names them."""
    reach = view.log_start
    for seg in live_segments(view):
        if seg.base_offset > reach:
            return reach, seg
        reach = max(reach, seg.end_offset)
    return None


def aged_prefix_end(view: PartitionView, age_ms: int, now: int) -> int | None:
    """The prefix rule by age alone: what consumed retention would free if no group held it back (`compactd explain`
    reports the difference as held back)."""
    return _deletable_end(view, age_ms, now, limit=None)


def consumed_retention_offset(view: PartitionView, th: Thresholds, now: int) -> int | None:
    """KIP-68 level 1: delete segments every counted group has read, once they are old enough.

    Unknown minimum (a counted group without a position here, or no groups) means nothing is deleted.
    """
    if th.consumed_retention_ms is None or view.min_committed is None:
        return None
    return _deletable_end(view, th.consumed_retention_ms, now, limit=view.min_committed)


def forced_retention_offset(view: PartitionView, th: Thresholds, now: int) -> int | None:
    """KIP-68 level 2: plain time retention, whatever the groups did."""
    if th.forced_retention_ms is None:
        return None
    return _deletable_end(view, th.forced_retention_ms, now, limit=None)


def decide_deletion(view: PartitionView, th: Thresholds, now: int) -> Decision | None:
    """The furthest safe delete_records offset, labelled with the level that allows it."""
    consumed = consumed_retention_offset(view, th, now)
    forced = forced_retention_offset(view, th, now)
    if forced is not None and (consumed is None or forced > consumed):
        before, reason = forced, "forced_retention"
    elif consumed is not None:
        before, reason = consumed, "consumed_retention"
    else:
        return None
    if before <= view.log_start:
        return None  # already gone: deleteRecords below the log start is a no-op
    return Decision("delete_records", view.topic, view.partition, reason, before_offset=before)  # type: ignore[arg-type]


def decide(view: PartitionView, th: Thresholds, now: int) -> list[Decision]:
    return [d for d in (decide_compaction(view, th, now), decide_deletion(view, th, now)) if d is not None]


def is_answered(record: ActionRecord, view: PartitionView) -> bool:
    """Whether the cluster has done what the action asked, as seen through segment events."""
    return answered_at(record, earliest_uncompacted_ts(view), view.log_start)


def answered_at(record: ActionRecord, earliest: int | None, log_start: int) -> bool:
    """`is_answered` from the two numbers it reads: the log start passed a delete's offset, or the dirty segment a
    compaction was decided for is gone (KIP-354's earliest moved)."""
    if record.action == "delete_records":
        return record.before_offset is not None and log_start >= record.before_offset
    if record.action == "compact":
        return earliest is None or earliest != record.earliest_ts
    return False


def should_record(decision: Decision, existing: ActionRecord | None, now: int, retry_ms: int) -> bool:
    """No duplicate actions: an unanswered action is decided again only after the retry interval."""
    if existing is None:
        return True
    if decision.action == "delete_records" and (decision.before_offset or 0) > (existing.before_offset or 0):
        return True  # more became deletable: the new offset supersedes the old one at once
    if existing.status == "pending":
        return False  # still in the outbox
    return now - existing.decided_at >= retry_ms


def next_deadline(view: PartitionView, th: Thresholds, records: list[ActionRecord], now: int) -> int | None:
    """Next time evaluating this partition could decide something new, after evaluating it at `now`.

    Time alone makes actions due (KIP-354 lag crossing, segments ageing past a retention), so the
    scheduler needs a wake-up even when no events arrive. Thresholds already crossed were acted on at
    `now`; their follow-up is the retry of the live record.
    """
    candidates = [rec.decided_at + th.action_retry_ms for rec in records]
    if th.max_compaction_lag_ms is not None:
        earliest = earliest_uncompacted_ts(view)
        if earliest is not None:
            candidates.append(earliest + th.max_compaction_lag_ms + 1)
    segments = live_segments(view)
    if th.forced_retention_ms is not None:
        candidates.extend(s.closed_at + th.forced_retention_ms + 1 for s in segments)
    if th.consumed_retention_ms is not None and view.min_committed is not None:
        candidates.extend(
            s.closed_at + th.consumed_retention_ms + 1 for s in segments if s.end_offset <= view.min_committed
        )
    future = [c for c in candidates if c > now]
    return min(future) if future else None
