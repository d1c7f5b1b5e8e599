"""Plain data the policy reasons over: what state/ reads, what sinks/ carry out."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from compactd.keys import partition_key

ActionKind = Literal["compact", "delete_records", "restore_config", "compact_view"]
Reason = Literal[
    "max_compaction_lag",
    "consumed_retention",
    "forced_retention",
    "compacted",
    "first_generation",
    "compaction_threshold",
]
Status = Literal["pending", "dry_run", "sent", "failed", "skipped"]


@dataclass(frozen=True, order=True)
class Segment:
    """A closed segment holding offsets [base_offset, end_offset)."""

    base_offset: int
    end_offset: int
    first_batch_max_ts: int
    size_bytes: int
    closed_at: int


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

    @property
    def key(self) -> str:
        return partition_key(self.topic, self.partition)


@dataclass(frozen=True)
class Decision:
    """What the rules want done for a partition right now."""

    action: ActionKind
    topic: str
    partition: int
    reason: Reason
    before_offset: int | None = None
    delay_ms: int | None = None
    # The dirty segment that made the partition overdue; its disappearance answers a compact action.
    earliest_ts: int | None = None


@dataclass(frozen=True)
class ActionRecord:
    """A decision as stored in the outbox and written to the audit topic (the action record of docs/contract.md)."""

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
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def slot(self) -> str:
        """Outbox slot: one live record per partition and action kind."""
        return f"{partition_key(self.topic, self.partition)}/{self.action}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> ActionRecord:
        return cls(**json.loads(raw))

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
        return replace(self, status=status, detail={**self.detail, **detail})


def action_id(decision: Decision, attempts: int) -> str:
    """Deterministic id: a replayed batch that decides the same thing produces the same id."""
    d = decision
    raw = f"{d.topic}/{d.partition}/{d.action}/{d.reason}/{d.before_offset}/{d.earliest_ts}/{attempts}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]
