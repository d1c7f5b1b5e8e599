"""Which partitions `compactd explain TOPIC` shows: every partition's `worst` figures at once, over numpy arrays.

An explanation costs about 100 µs of Python per partition (every rule, every cause, their text): 100k partitions
took seconds before the first line, and people read the first screen. `worst_first` needs only three numbers per
partition (how overdue compaction is, then the bytes and offsets held back), so they are computed here for all
partitions from a few integers each (`PartitionNumbers`, lua/explain_rank.lua), and the explanation is built only
for the partitions shown.

`worst_figures` restates, over arrays, what `explain_partition` reports as `worst`: the same rule functions
(policy/rules.py) and the same action states (app/explain.py `_action_status`, `_deletion`). The two must agree on
every input; tests/unit/test_explain_rank.py checks them against each other on generated partitions, so a change to
either shows up there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from compactd.model import ActionRecord, PartitionNumbers
from compactd.policy import bulk
from compactd.policy.bulk import NONE, Limits

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
    nums: PartitionNumbers, limits: Limits, deletes: Deletes, gate_closed: bool, now: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(overdue_ms, blocked_bytes, blocked_offsets) per partition: `explain_partition(...)["worst"]`, for all rows.
    What the rules decide and free comes from the controller's own array code (`bulk.quiet`, `bulk.due`)."""
    d = bulk.due(nums, limits, bulk.quiet(nums, limits, now), now)
    overdue = d.delay  # max compaction lag: how far past it the oldest dirty record is, 0 where it is not
    seg_row, starts, seg = bulk.segment_rows(nums)
    end, size, closed = seg[:, 1], seg[:, 3], seg[:, 4]
    ls = nums.log_start
    live = end > ls[seg_row]  # `live_segments`: not wholly below the log start

    def span_bytes(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """`_span`'s bytes: live segments ending inside (lo, hi]."""
        inside = live & (end > lo[seg_row]) & (end <= hi[seg_row])
        return bulk.per_row(np.add, np.where(inside, size, 0), starts, nums.nseg, 0)

    # `aged_prefix_end`: what consumed retention would free if no group held it back
    aged = bulk.gapless(seg_row, seg, ls) & (now - closed > limits.consumed[seg_row])
    by_age, age_found = bulk.prefix_end(seg_row, starts, nums.nseg, live, end, aged)
    by_age_valid = limits.consumed_on & age_found

    # the delete the controller would decide now (`decide_deletion`), and what each retention frees
    winner = d.before != NONE
    win_forced, win_consumed = winner & d.forced, winner & ~d.forced
    c_frees, c_frees_bytes, c_frees_offsets = d.consumed_offsets > 0, d.consumed_bytes, d.consumed_offsets
    held_from = ls + d.consumed_offsets  # past what consumed retention frees (the log start where it frees nothing)
    held = by_age_valid & (by_age > held_from)
    held_bytes = np.where(held, span_bytes(held_from, by_age), 0)
    held_offsets = np.where(held, by_age - held_from, 0)
    f_frees, f_frees_bytes, f_frees_offsets = d.forced_offsets > 0, d.forced_bytes, d.forced_offsets

    record_blocks = (deletes.blocks == ALWAYS) | ((deletes.blocks == IF_DRY_RUN) & limits.dry_run)

    def blocked(
        on: np.ndarray, frees: np.ndarray, wins: np.ndarray, other_wins: np.ndarray, own: np.ndarray
    ) -> np.ndarray:
        """Where `_deletion` (then the exclusion) leaves the rule `blocked`, wherever that can count: where it frees
        something. There, a rule with nothing to send is always `covered` (what it frees makes a winner, and the
        winner is the other rule), so consumed retention's group causes never decide the figures and are left out."""
        covered = frees & other_wins & ~own
        wants = frees & wins
        by_action = np.where(own, record_blocks, wants & limits.dry_run)
        by_gate = gate_closed & (wants | (own & deletes.pending))
        return on & (limits.excluded | (~covered & (by_action | by_gate)))

    c_blocked = blocked(limits.consumed_on, c_frees, win_consumed, win_forced, deletes.reason == CONSUMED)
    f_blocked = blocked(limits.forced_on, f_frees, win_forced, win_consumed, deletes.reason == FORCED)
    c_bytes = held_bytes + np.where(c_blocked, c_frees_bytes, 0)
    c_offsets = held_offsets + np.where(c_blocked, c_frees_offsets, 0)
    blocked_bytes = np.maximum(c_bytes, np.where(f_blocked, f_frees_bytes, 0))
    blocked_offsets = np.maximum(c_offsets, np.where(f_blocked, f_frees_offsets, 0))
    return overdue, blocked_bytes, blocked_offsets


def worst_order(nums: PartitionNumbers, limits: Limits, deletes: Deletes, gate_closed: bool, now: int) -> np.ndarray:
    """Row indices worst first, in `worst_first`'s order: most overdue, most bytes, most offsets, partition number."""
    overdue, blocked_bytes, blocked_offsets = worst_figures(nums, limits, deletes, gate_closed, now)
    return np.lexsort((nums.partitions, -blocked_offsets, -blocked_bytes, -overdue))
