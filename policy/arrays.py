"""Array plumbing the rules are written with (policy/rules.py): a chunk of partitions is rows, their closed segments
one table sorted by row then base offset, and a per-row figure is one reduction over each row's segments. No rule
lives here."""

from __future__ import annotations

import numpy as np

from compactd.model import PartitionNumbers

I64 = np.int64
NONE = -1  # "no such time or offset" in the rules' arrays (every time compactd computes is a positive epoch ms)
MAX = np.iinfo(I64).max


def per_row(ufunc: np.ufunc, values: np.ndarray, starts: np.ndarray, counts: np.ndarray, empty: int) -> np.ndarray:
    """`ufunc` over each row's segments (rows without segments get `empty`)."""
    out = np.full(len(counts), empty, dtype=values.dtype)
    has = counts > 0
    if values.size:
        out[has] = ufunc.reduceat(values, starts[has])
    return out


def row_starts(nseg: np.ndarray) -> np.ndarray:
    """Where each row's segments start in `PartitionNumbers.segments`."""
    starts = np.zeros(len(nseg), dtype=I64)
    if len(nseg):
        np.cumsum(nseg[:-1], out=starts[1:])
    return starts


def segment_rows(nums: PartitionNumbers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row of each segment, where each row's segments start, the segments in offset order within each row)."""
    seg_row = np.repeat(np.arange(len(nums.partitions)), nums.nseg)
    seg = nums.segments
    if seg.size and np.any((seg_row[1:] == seg_row[:-1]) & (seg[1:, 0] <= seg[:-1, 0])):
        seg = seg[np.lexsort((*seg.T[::-1], seg_row))]  # should segments come unsorted
    return seg_row, row_starts(nums.nseg), seg


def first_where(where: np.ndarray, starts: np.ndarray, nseg: np.ndarray) -> np.ndarray:
    """Per row, the index of its first segment where `where` holds; len(where) where none does."""
    idx = np.arange(len(where))
    return per_row(np.minimum, np.where(where, idx, len(idx)), starts, nseg, len(idx))


def prefix_end(
    seg_row: np.ndarray, starts: np.ndarray, nseg: np.ndarray, live: np.ndarray, seg: np.ndarray, ok: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, where the longest run of its oldest live segments where `ok` holds ends (the first live segment where
    it fails stops the run), and whether there is one. Rows without: end 0.

    The run ends at its last segment's end, and never past the base of the segment that stopped it: segments from
    two replicas' logs overlap (each broker rolls its own; the leader's agent reports its own after leadership
    moves), and an old report's long segment must not carry a delete over the records of a newer one that is not
    let go (after an unclean election, the records written again at those offsets)."""
    idx = np.arange(len(seg))
    first_stop = first_where(live & ~ok, starts, nseg)
    last = per_row(np.maximum, np.where(live & (idx < first_stop[seg_row]), idx, -1), starts, nseg, -1)
    run_end = seg[np.maximum(last, 0), 1] if len(seg) else np.zeros(len(last), dtype=I64)
    run_end = np.minimum(run_end, pick(seg[:, 0], first_stop, MAX) if len(seg) else run_end)
    found = last >= 0
    return np.where(found, run_end, 0), found


def reach_before(seg_row: np.ndarray, seg: np.ndarray, log_start: np.ndarray) -> np.ndarray:
    """Per segment, the highest offset the row's log start and earlier segments reach. The running maximum of ends
    within each row is one accumulate over keys `row * n + rank(end)`, which a later row's keys always exceed."""
    n = len(seg)
    if n == 0:
        return np.zeros(0, dtype=I64)
    end = seg[:, 1]
    order = np.argsort(end, kind="stable")
    rank = np.empty(n, dtype=I64)
    rank[order] = np.arange(n, dtype=I64)
    offset = seg_row.astype(I64) * n
    reach = end[order[np.maximum.accumulate(offset + rank) - offset]]  # the row's max end up to and including i
    before = np.empty(n, dtype=I64)
    before[0], before[1:] = NONE, reach[:-1]
    before[np.r_[True, seg_row[1:] != seg_row[:-1]]] = NONE  # a row's first segment: nothing before it
    return np.maximum(before, log_start[seg_row])


def pick(values: np.ndarray, at: np.ndarray, empty: int = 0) -> np.ndarray:
    """`values[at]` per row, `empty` where `at` is past the end (a row without such a segment)."""
    if len(values) == 0:
        return np.full(len(at), empty, dtype=values.dtype)
    return np.where(at < len(values), values[np.minimum(at, len(values) - 1)], empty)
