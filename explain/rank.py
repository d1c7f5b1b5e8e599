"""The arrays side of `compactd explain`: every partition's `worst` figures at once (which partitions a topic's
explanation shows), and each explained partition's row of its chunk's evaluation (`rule_facts`).

An explanation costs about 100 µs of Python per partition (every rule, every cause, their text): 100k partitions
took seconds before the first line, and people read the first screen. `worst_first` needs only three numbers per
partition (how overdue compaction is, then the bytes and offsets held back), so they are computed here for all
partitions from a few integers each (`PartitionNumbers`, lua/explain_rank.lua), and the explanation is built only
for the partitions shown.

`worst_figures` is what `explain_partition` reports as `worst` (it reads its own row of the same arrays): the rules'
evaluation (policy/rules.py), and which of what they free the action states (explain/model.py `_action_status`) block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compactd.model import ActionRecord, PartitionNumbers, PartitionView
from compactd.policy.arrays import NONE
from compactd.policy.rules import RULES as RULE_NAMES
from compactd.policy.rules import Evaluation, Insight, Limits, value, view_horizon
from compactd.policy.thresholds import Thresholds

# a live delete record's reason
NO_RECORD, CONSUMED, FORCED, OTHER = 0, 1, 2, 3
# whether a live delete record blocks its rule (`_action_status`): never (sent), only under dry.run, always
NEVER, IF_DRY_RUN, ALWAYS = 0, 1, 2


@dataclass(frozen=True)
class Deletes:
    """Per partition, what its live delete_records record (if any) means for the rule it belongs to."""

    reason: np.ndarray  # NO_RECORD, CONSUMED, FORCED or OTHER
    pending: np.ndarray  # still in the outbox: a closed gate holds it
    blocks: np.ndarray  # NEVER, IF_DRY_RUN or ALWAYS

    @classmethod
    def of(cls, rows: int, records: Mapping[int, ActionRecord], now: int) -> Deletes:
        """The states `_action_status` gives a live record, reduced to whether they are `blocked`."""
        reason = np.zeros(rows, dtype=np.int8)
        pending = np.zeros(rows, dtype=bool)
        blocks = np.zeros(rows, dtype=np.int8)
        for row, rec in records.items():
            reason[row] = {"consumed_retention": CONSUMED, "forced_retention": FORCED}.get(rec.reason, OTHER)
            pending[row] = rec.status == "pending"
            if rec.status == "pending":
                retry_at = rec.detail.get("retry_at")
                backoff = retry_at is not None and int(retry_at) > now
                # backing off, or held by a cap: blocked; a dry-run record: blocked only while dry.run is true
                blocks[row] = IF_DRY_RUN if rec.dry_run and not backoff else ALWAYS
            elif rec.status == "sent":
                blocks[row] = NEVER  # acting
            elif rec.status == "dry_run":
                blocks[row] = IF_DRY_RUN
            else:
                blocks[row] = ALWAYS  # skipped at send time
        return cls(reason, pending, blocks)


def worst_figures(
    ev: Evaluation, ins: Insight, deletes: Deletes, gate_closed: bool, caps: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(overdue_ms, blocked_bytes, blocked_offsets) per partition: `explain_partition`'s `worst`, for all rows at
    once. What the rules decide, free and hold back is the evaluation's (policy/rules.py); what is added here is
    which of it is blocked. `caps`: per row, the compacted view's horizon (NONE: no view)."""
    d, limits, ls = ev.d, ev.limits, ev.nums.log_start
    winner = d.before != NONE
    win_forced, win_consumed = winner & d.forced, winner & ~d.forced
    c_frees, f_frees = d.consumed_offsets > 0, d.forced_offsets > 0
    record_blocks = (deletes.blocks == ALWAYS) | ((deletes.blocks == IF_DRY_RUN) & limits.dry_run)
    caps = np.full(len(ls), NONE, dtype=np.int64) if caps is None else caps

    def blocked(
        on: np.ndarray, frees: np.ndarray, end: np.ndarray, wins: np.ndarray, other_wins: np.ndarray, own: np.ndarray
    ) -> np.ndarray:
        """Where `_deletion` (then the exclusion, then the view's horizon) leaves the rule `blocked`, wherever that
        can count: where it frees something. There, a rule with nothing to send is always `covered` (what it frees
        makes a winner, and the winner is the other rule), so consumed retention's group causes never decide the
        figures and are left out."""
        covered = frees & other_wins & ~own
        wants = frees & wins
        by_action = np.where(own, record_blocks, wants & limits.dry_run)
        by_gate = gate_closed & (wants | (own & deletes.pending))
        by_cap = frees & (view_horizon(end, caps, ls) == NONE)
        return on & (limits.excluded | (~covered & (by_action | by_gate | by_cap)))

    c_blocked = blocked(
        limits.consumed_on, c_frees, d.consumed_end, win_consumed, win_forced, deletes.reason == CONSUMED
    )
    f_blocked = blocked(limits.forced_on, f_frees, d.forced_end, win_forced, win_consumed, deletes.reason == FORCED)
    c_bytes = ins.held_bytes + np.where(c_blocked, d.consumed_bytes, 0)
    c_offsets = ins.held_offsets + np.where(c_blocked, d.consumed_offsets, 0)
    blocked_bytes = np.maximum(c_bytes, np.where(f_blocked, d.forced_bytes, 0))
    blocked_offsets = np.maximum(c_offsets, np.where(f_blocked, d.forced_offsets, 0))
    return d.delay, blocked_bytes, blocked_offsets


def worst_order(ev: Evaluation, deletes: Deletes, gate_closed: bool, caps: np.ndarray | None = None) -> np.ndarray:
    """Row indices worst first, in `worst_first`'s order: most overdue, most bytes, most offsets, partition number."""
    overdue, blocked_bytes, blocked_offsets = worst_figures(ev, ev.insight(), deletes, gate_closed, caps)
    return np.lexsort((ev.nums.partitions, -blocked_offsets, -blocked_bytes, -overdue))


Seg = tuple[int, int, int, int, int]  # base offset, end offset, first batch max ts, size, closed at


@dataclass(frozen=True, slots=True)
class RowFacts:
    """One partition's row of the rules' evaluation (policy/rules.py), as explain reads it: nothing here is derived
    again from the segments."""

    earliest: int | None  # KIP-354 earliest uncompacted timestamp
    compaction_due: int | None  # when the oldest dirty record crosses the lag
    overdue: int  # how far past the lag it is, 0 when not (compaction is due exactly when > 0)
    ends: dict[str, int | None]  # each retention's delete offset now
    frees: dict[str, tuple[int, int]]  # each retention's (offsets, bytes) above the log start
    by_age: int | None  # consumed retention's prefix by age alone, as if no group held it back
    held: tuple[int, int]  # (offsets, bytes) the groups hold back beyond what consumed retention frees
    winner: tuple[str, int] | None  # (reason, before_offset) of the delete decided now
    crossings: dict[str, int]  # each rule's next threshold crossing
    gap: tuple[int, Seg] | None  # the first offsets no known segment covers, and the segment after them
    live: tuple[int, int]  # closed segments still on disk: count, bytes
    oldest: Seg | None  # the first of them
    dirty: tuple[int, int]  # dirty segments: count, bytes
    oldest_dirty: Seg | None  # the lowest dirty segment holding the earliest timestamp
    worst: tuple[int, int, int]  # overdue_ms, blocked_bytes, blocked_offsets (explain/rank.py)
    # when the tombstones held now are gone (rules.Erasure): removable_after, clean_by, first_pass, dirty_by, by,
    # first_by, soonest
    erasure: dict[str, int | None]
    # each reported replica's own bound (replica -> its `by`), and the replica whose bound is the last, where it is
    # later than the leader's own log's (None: the leader's log sets it)
    replica_erasure: dict[int, int | None] = field(default_factory=dict)
    slowest: int | None = None


def _seg(seg: Any, i: int) -> Seg | None:
    return tuple(int(x) for x in seg[i]) if i < len(seg) else None  # type: ignore[return-value]


def rule_facts(
    parts: Sequence[tuple[PartitionView, Thresholds, bool, ActionRecord | None, int | None]],
    gate_closed: bool,
    cleaner_visible: bool,
    now: int,
) -> list[RowFacts]:
    """The rules' evaluation of a chunk of partitions, a row each: `parts` is (view, thresholds, excluded, live
    delete record, view cap) per partition. No compaction is decided where the cleaner cannot be seen."""
    n = len(parts)

    def ranked(th: Thresholds) -> Thresholds:
        return th if cleaner_visible else th.model_copy(update={"max_compaction_lag_ms": None})

    nums = PartitionNumbers.of_views([p[0] for p in parts])
    limits = Limits.of(n, (Thresholds(), False), {i: (ranked(p[1]), p[2]) for i, p in enumerate(parts)})
    ev = Evaluation.of(nums, limits, now)
    ins = ev.insight()
    deletes = Deletes.of(n, {i: p[3] for i, p in enumerate(parts) if p[3] is not None}, now)
    caps = np.array([NONE if p[4] is None else p[4] for p in parts], dtype=np.int64)
    worst = [a.tolist() for a in worst_figures(ev, ins, deletes, gate_closed, caps)]
    q, d, er = ev.q, ev.d, ev.erasure()
    erasure_parts = ("removable_after", "clean_by", "first_pass", "dirty_by", "by", "first_by", "soonest")
    per_replica: dict[int, dict[int, int | None]] = {}
    for (row, replica), by in zip(nums.replicas[:, :2].tolist(), er.replica_by.tolist(), strict=True):
        per_replica.setdefault(row, {})[replica] = None if by == NONE else by
    out = []
    for i in range(n):
        before = value(d.before, i)
        crossings = zip(RULE_NAMES, (q.next_lag, q.next_consumed, q.next_forced), strict=True)
        gap = value(ins.gap_at, i)
        out.append(
            RowFacts(
                earliest=value(q.earliest, i),
                compaction_due=value(q.compaction_due, i),
                overdue=int(d.delay[i]),
                ends={"consumed_retention": value(d.consumed_end, i), "forced_retention": value(d.forced_end, i)},
                frees={
                    "consumed_retention": (int(d.consumed_offsets[i]), int(d.consumed_bytes[i])),
                    "forced_retention": (int(d.forced_offsets[i]), int(d.forced_bytes[i])),
                },
                by_age=value(ins.by_age, i),
                held=(int(ins.held_offsets[i]), int(ins.held_bytes[i])),
                winner=None if before is None else
                ("forced_retention" if d.forced[i] else "consumed_retention", before),
                crossings={rule: int(a[i]) for rule, a in crossings if a[i] != NONE},
                gap=None if gap is None else (gap, _seg(ins.seg, int(ins.gap_next[i]))),  # type: ignore[arg-type]
                live=(int(ins.live_count[i]), int(ins.live_bytes[i])),
                oldest=_seg(ins.seg, int(ins.first_live[i])),
                dirty=(int(ins.dirty_count[i]), int(ins.dirty_bytes[i])),
                oldest_dirty=_seg(ins.seg, int(ins.oldest_dirty[i])),
                worst=(worst[0][i], worst[1][i], worst[2][i]),
                erasure={part: value(getattr(er, part), i) for part in erasure_parts},
                replica_erasure=per_replica.get(i, {}),
                slowest=value(er.slowest, i),
            )
        )  # fmt: skip
    return out
