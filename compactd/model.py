"""Plain data the policy reasons over: what state/ reads, what sinks/ carry out."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import numpy as np

from compactd.keys import partition_key

# (topic, partition) -> offset: a group's committed offsets, a poll's log starts or ends
PartitionRef = tuple[str, int]  # (topic, partition): one partition, wherever one is named
PartitionOffsets = Mapping[PartitionRef, int]
# topic -> partition (a string, as Spark's offset JSON writes it) -> offset: where a stream's sources stand
SourceOffsets = Mapping[str, Mapping[str, int]]

ActionKind = Literal["compact", "delete_records", "restore_config", "compact_view", "take_retention"]
Reason = Literal[
    "max_compaction_lag",
    "consumed_retention",
    "forced_retention",
    "compacted",
    "nudge_expired",
    "first_generation",
    "compaction_threshold",
    "retention_takeover",
    "takeover_ended",
]
Status = Literal["pending", "dry_run", "sent", "failed", "skipped"]


class Segment(msgspec.Struct, frozen=True, order=True):
    """A closed segment holding offsets [base_offset, end_offset). A struct, ordered as a tuple of its fields: a batch
    at 1M partitions builds 90k from Spark's rows, at 0.2 µs each against 2 as a frozen dataclass."""

    base_offset: int
    end_offset: int
    first_batch_max_ts: int
    size_bytes: int
    closed_at: int


class ReplicaReport(msgspec.Struct, frozen=True):
    """One `replica_log` event as a batch carries it: broker `replica`'s own log of the partition (its cleaner's
    checkpoint, its oldest local segment's base; None: none), seen at `ts`, and the partition's replica assignment as
    that broker read it."""

    partition: int
    replica: int
    cleaned_up_to: int | None
    local_log_start: int | None
    ts: int
    replicas: list[int]


class ReplicaState(msgspec.Struct, frozen=True):
    """One replica of the partition's assignment and its own log, as the last report gave it (None: not reported, or
    never cleaned). KIP-534 erases a tombstone from the cluster once every replica's cleaner has, so the erasure
    bound is theirs too; with tiered storage, the offsets below `local_log_start` are in the remote tier only."""

    replica: int
    cleaned_up_to: int | None = None
    cleaned_at: int | None = None  # when its agent first reported `cleaned_up_to`
    local_log_start: int | None = None
    reported: bool = False  # an agent reported this replica (else: in the assignment, never heard of)


@dataclass(frozen=True)
class PartitionView:
    """Everything compactd knows about one partition, as read from state in one go."""

    topic: str
    partition: int
    segments: tuple[Segment, ...] = ()
    cleaned_up_to: int | None = None
    log_start: int = 0
    # Minimum committed offset over counted groups; None when unknown (a counted group has no offset here)
    # or when no group counts at all: consumed retention then deletes nothing.
    min_committed: int | None = None
    counted_groups: int = 0
    # When the clean that brought `cleaned_up_to` where it is was seen (the `compacted` event's `ts`, epoch ms): KIP-534
    # starts the delete horizon of the tombstones that clean saw then. None: unknown (never cleaned, or state written
    # before compactd kept it).
    cleaned_at: int | None = None
    # every replica's own log, where the agents report them (a node id to name the replica by); () elsewhere
    replicas: tuple[ReplicaState, ...] = ()

    @property
    def key(self) -> str:
        return partition_key(self.topic, self.partition)


class Nudge(msgspec.Struct, frozen=True):
    """A config value compactd set on a topic to make the cleaner run, and the value it replaced (None: the
    broker's default); kept in Redis and on the nudge ledger topic (sinks/nudge_ledger.py) until put back."""

    topic: str
    key: str
    original: str | None
    value: str
    at: int  # when it was set (epoch ms): `compaction.nudge.max.ms` counts from here


class Decision(msgspec.Struct, frozen=True):
    """What the rules want done for a partition right now. A struct, built in C: a batch makes one per decided
    partition, and a frozen dataclass took 2 µs to build."""

    action: ActionKind
    topic: str
    partition: int
    reason: Reason
    before_offset: int | None = None
    delay_ms: int | None = None
    # The dirty segment that made the partition overdue; its disappearance answers a compact action.
    earliest_ts: int | None = None


class ActionRecord(msgspec.Struct, frozen=True):
    """A decision as stored in the outbox and written to the audit topic (the action record of docs/contract.md).

    A struct: built in 0.2 µs (a frozen dataclass took 3.7), copied in 0.6 (5.1), decoded in 1.4 (2.7); a batch
    deciding on 86k partitions builds, copies and decodes one or two a partition."""

    id: str
    action: ActionKind
    topic: str
    partition: int
    reason: Reason
    dry_run: bool
    decided_at: int
    status: Status
    before_offset: int | None = None
    delay_ms: int | None = None
    earliest_ts: int | None = None
    attempts: int = 1
    detail: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def slot(self) -> str:
        """Outbox slot: one live record per partition and action kind."""
        return f"{partition_key(self.topic, self.partition)}/{self.action}"

    def to_json(self) -> str:
        """Compact JSON with sorted keys, every field, null ones too (what older versions stored)."""
        return _RECORD_JSON.encode(self).decode()

    @classmethod
    def from_json(cls, raw: str | bytes) -> ActionRecord:
        """Decoded straight into the struct. A record that does not match the types (a status this version does not
        know) is read field by field, unchecked, as before."""
        try:
            return _RECORD_DECODER.decode(raw)
        except msgspec.ValidationError:
            return cls(**msgspec.json.decode(raw))

    @classmethod
    def many_from_json(cls, raws: Sequence[bytes]) -> list[ActionRecord]:
        """`from_json` of a chunk's live records in one decode instead of one call each; one record off the types
        makes the whole list go one by one."""
        if not raws:
            return []
        try:
            return _RECORDS_DECODER.decode(b"[" + b",".join(raws) + b"]")
        except msgspec.ValidationError:
            return [cls.from_json(raw) for raw in raws]

    def audit(self) -> dict[str, Any]:
        """The public action record: contract fields plus `attempts`; internal fields stay internal."""
        out: dict[str, Any] = {
            "id": self.id,
            "action": self.action,
            "topic": self.topic,
            "partition": self.partition,
            "reason": self.reason,
            "dry_run": self.dry_run,
            "decided_at": self.decided_at,
            "status": self.status,
            "attempts": self.attempts,
            "detail": self.detail,
        }
        if self.before_offset is not None:
            out["before_offset"] = self.before_offset
        if self.delay_ms is not None:
            out["delay_ms"] = self.delay_ms
        return out

    def with_status(self, status: Status, **detail: Any) -> ActionRecord:
        """A copy with a new status and more detail."""
        return msgspec.structs.replace(self, status=status, detail={**self.detail, **detail})


_RECORD_JSON = msgspec.json.Encoder(order="sorted")  # every field, null ones too, keys sorted
_RECORD_DECODER = msgspec.json.Decoder(ActionRecord)
_RECORDS_DECODER = msgspec.json.Decoder(list[ActionRecord])


def action_id(decision: Decision, attempts: int) -> str:
    """Deterministic id: a replayed batch that decides the same thing produces the same id."""
    d = decision
    raw = f"{d.topic}/{d.partition}/{d.action}/{d.reason}/{d.before_offset}/{d.earliest_ts}/{attempts}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class PartitionNumbers:
    """A chunk of one topic's partitions as arrays (one row per partition, in the order asked; lua/explain_rank.lua):
    what the rules read of a `PartitionView` (policy/rules.py evaluates these arrays: the controller's chunks,
    `compactd explain TOPIC`'s ranking, and a single partition as a chunk of one)."""

    partitions: np.ndarray  # int64 [P]
    counted: np.ndarray  # int64 [P]: the topic's counted groups, as each chunk read them
    cleaned: np.ndarray  # int64 [P]: cleaned up to, -1 when never cleaned (what the rules take None for)
    log_start: np.ndarray  # int64 [P]
    zcard: np.ndarray  # int64 [P]: counted groups with an offset on the partition
    lowest: np.ndarray  # int64 [P]: the lowest of those offsets (-1 when none)
    nseg: np.ndarray  # int64 [P]: closed segments kept for the partition
    segments: np.ndarray  # int64 [S, 5]: base, end, first batch max ts, size, closed at; by partition, by base offset
    # int64 [P]: when the clean that reached `cleaned` was seen (PartitionView.cleaned_at), -1 when unknown; left out,
    # unknown on every row
    cleaned_at: np.ndarray = None  # type: ignore[assignment]
    # int64 [R, 5]: every replica's cleaner (PartitionView.replicas): row, replica, cleaned up to (-1: never), when
    # seen (-1), reported (1; 0: in the assignment, no agent reported it); no rows where no agent reports replicas
    replicas: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.cleaned_at is None:
            object.__setattr__(self, "cleaned_at", np.full(len(self.partitions), -1, dtype=np.int64))
        if self.replicas is None:
            object.__setattr__(self, "replicas", np.zeros((0, 5), dtype=np.int64))

    def take(self, rows: np.ndarray) -> PartitionNumbers:
        """The numbers of `rows` (repeats allowed), with their segments; without replicas."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(self.nseg)[:-1]]).astype(np.int64) if len(self.nseg) else self.nseg
        counts = self.nseg[rows]
        # each taken row's segments: its first segment's index, then the next ones (vectorised: a chunk of 2,000
        # partitions with three replicas each takes 6,000 rows)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        seg_ix = np.repeat(starts[rows], counts) + within
        return PartitionNumbers(
            self.partitions[rows], self.counted[rows], self.cleaned[rows], self.log_start[rows], self.zcard[rows],
            self.lowest[rows], self.nseg[rows], self.segments[seg_ix.astype(np.int64)].reshape(-1, 5),
            self.cleaned_at[rows],
        )  # fmt: skip

    @classmethod
    def concat(cls, chunks: list[PartitionNumbers]) -> PartitionNumbers:
        """One set of arrays from chunks read one after another (rows keep the chunks' order)."""

        def cat(name: str) -> np.ndarray:
            parts = [getattr(c, name) for c in chunks]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        segments = np.concatenate([c.segments for c in chunks]) if chunks else np.zeros((0, 5), dtype=np.int64)
        replicas, first = [], 0
        for c in chunks:  # their rows, counted from each chunk's first
            replicas.append(c.replicas + np.array([first, 0, 0, 0, 0], dtype=np.int64))
            first += len(c.partitions)
        return cls(
            cat("partitions"), cat("counted"), cat("cleaned"), cat("log_start"), cat("zcard"), cat("lowest"),
            cat("nseg"), segments, cat("cleaned_at"),
            np.concatenate(replicas) if replicas else None,
        )  # fmt: skip

    @classmethod
    def of_views(cls, views: Sequence[PartitionView]) -> PartitionNumbers:
        """Views as arrays: a partition evaluated alone is a chunk of one (policy/rules.py).
        A known minimum is every counted group positioned at it; an unknown one, a counted group without a position."""
        head = [
            (v.partition, max(v.counted_groups, 1) if v.min_committed is not None else v.counted_groups,
             -1 if v.cleaned_up_to is None else v.cleaned_up_to, v.log_start,
             v.min_committed is not None, -1 if v.min_committed is None else v.min_committed, len(v.segments),
             -1 if v.cleaned_at is None else v.cleaned_at)
            for v in views
        ]  # fmt: skip
        cols = np.array(head, dtype=np.int64).reshape(-1, 8)
        segs = [(s.base_offset, s.end_offset, s.first_batch_max_ts, s.size_bytes, s.closed_at) for v in views
                for s in v.segments]  # fmt: skip
        reps = [
            (row, r.replica, -1 if r.cleaned_up_to is None else r.cleaned_up_to,
             -1 if r.cleaned_at is None else r.cleaned_at, int(r.reported))
            for row, v in enumerate(views) for r in v.replicas
        ]  # fmt: skip
        return cls(
            partitions=cols[:, 0], counted=cols[:, 1], cleaned=cols[:, 2], log_start=cols[:, 3],
            zcard=cols[:, 1] * cols[:, 4], lowest=cols[:, 5], nseg=cols[:, 6],
            segments=np.array(segs, dtype=np.int64).reshape(-1, 5), cleaned_at=cols[:, 7],
            replicas=np.array(reps, dtype=np.int64).reshape(-1, 5),
        )  # fmt: skip
