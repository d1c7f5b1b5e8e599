"""A slice of a micro-batch's topics merged and evaluated on its own, where the data is (out of the driver).

The per-partition work of a batch — merging its changes into Redis and planning each touched partition — needs no
global state: each topic's keys share one Redis hash tag, so a slice of topics is a slice of Redis slots. What must be
global stays with the controller on the driver: the partitions where a rule is crossed, a live record waits or the
topic is excluded are planned there (their decisions and records, the readiness gate, the compacted view's cap, the
outbox and its caps, the send-time re-check), the metrics are kept there, and group-level changes (deletes,
memberships: they reach every topic of a group) are merged there first.

`evaluate_slice` is what one slice does: merge, then plan the quiet partitions in bulk (control/evaluation.py):
store their deadlines and return their metrics; return the other partitions for the driver. It takes plain values
(state, layers, changes), so the same code runs in the controller's process or in a Spark task.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from compactd.control.evaluation import EVAL_CHUNK, BatchThresholds, plan_chunk
from compactd.model import PartitionRef
from compactd.policy.forecast import PartitionStats
from compactd.state.changes import BatchChanges
from compactd.state.protocols import ControllerState


@dataclass
class SliceResult:
    """What a slice returns to the driver."""

    touched: int = 0  # partitions its merge touched
    replayed: bool = False  # a topic of the slice had this batch already (Spark replayed it)
    full: list[PartitionRef] = field(default_factory=list)  # partitions for the driver's full plan
    stats: list[tuple[PartitionRef, PartitionStats]] = field(default_factory=list)  # the quiet partitions' metrics
    merged: list[str] = field(default_factory=list)  # topics merged, with partitions touched or not (where known)


def evaluate_slice(
    state: ControllerState,
    layers: BatchThresholds,
    stream_id: str,
    batch_id: int,
    changes: BatchChanges,
    now: int,
) -> SliceResult:
    """Merge a slice's topics (idempotently, per topic and batch) and plan its quiet partitions; their deadlines
    are stored here, the rest is returned."""
    touched, replayed = state.merge(stream_id, batch_id, changes, layers.counts)
    out = SliceResult(replayed=replayed)
    for topic in sorted(touched):
        parts = sorted(touched[topic])
        out.touched += len(parts)
        for start in range(0, len(parts), EVAL_CHUNK):
            chunk = plan_chunk(state, layers, topic, parts[start : start + EVAL_CHUNK], now)
            calm = chunk.calm
            if calm:
                ix = np.asarray(calm)
                state.schedule(topic, [chunk.parts[row] for row in calm], chunk.q.deadline[ix].tolist())
                out.stats.extend(chunk.calm_stats())
            out.full.extend((topic, chunk.parts[row]) for row in np.flatnonzero(chunk.full).tolist())
    return out


def slice_of(topic: str, slices: int) -> int:
    """Which slice a topic belongs to: stable across processes and restarts (a replayed batch splits the same)."""
    return zlib.crc32(topic.encode()) % slices


def split_by_slice(changes: BatchChanges, slices: int) -> list[BatchChanges]:
    """The batch's per-topic changes in `slices` parts (group-level changes stay with the driver)."""
    out = [BatchChanges() for _ in range(slices)]
    for topic, tc in changes.topics.items():
        out[slice_of(topic, slices)].topics[topic] = tc
    return out
