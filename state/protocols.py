"""What the controller and the sinks ask of state: small Protocols, with Redis behind them (`redis_store`).

A test can hand the controller any object with these methods; the only implementation compactd ships is
`RedisState`, because Redis is the system of record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from compactd.model import ActionRecord, Nudge, PartitionNumbers, PartitionView
from compactd.state.changes import BatchChanges

PartitionRef = tuple[str, int]


class PartitionStore(Protocol):
    """Merged partition state and the deadline index."""

    def merge(
        self, stream_id: str, batch_id: int, changes: BatchChanges, counts: Callable[[str, str], bool]
    ) -> tuple[dict[str, set[int]], bool]: ...

    def views(self, keys: Iterable[PartitionRef]) -> list[PartitionView]: ...

    def partition_numbers(self, topic: str, partitions: list[int]) -> PartitionNumbers: ...

    def all_partitions(self) -> list[PartitionRef]: ...

    def due(self, now: int, limit: int = 10_000) -> list[PartitionRef]: ...

    def schedule(self, topic: str, partitions: Sequence[int], deadlines: Sequence[int], due: Sequence[int]) -> None: ...

    def schedule_many(self, chunks: Sequence[tuple[str, Sequence[int], Sequence[int], Sequence[int]]]) -> None: ...

    def oldest_compaction_due(self) -> int | None: ...

    def partitions(self, topic: str) -> list[int]: ...

    def recount(
        self,
        counts: Callable[[str, str], bool],
        topics: Iterable[str] | None = None,
        required: Callable[[str], Sequence[str]] = ...,
    ) -> list[PartitionRef]: ...

    def require_groups(self, required: Mapping[str, Sequence[str]]) -> list[str]: ...


class Outbox(Protocol):
    """Action records: live per (partition, action), the outbox of those not yet carried out, the last ones."""

    def live_records(self, topic: str, partitions: Sequence[int]) -> dict[int, list[ActionRecord]]: ...

    def enqueue(self, *recs: ActionRecord) -> None: ...

    def outbox(self, now: int | None = None, limit: int = 1000) -> list[ActionRecord]: ...

    def retry(self, rec: ActionRecord, at: int) -> None: ...

    def compactions_in_flight(self) -> int: ...

    def outbox_depth(self) -> int: ...

    def complete(self, *recs: ActionRecord) -> None: ...

    def answer(self, now: int, *recs: ActionRecord) -> None: ...

    def settle(self, now: int, answered: Sequence[ActionRecord], queued: Sequence[ActionRecord]) -> None: ...

    def live_compactions(self, topic: str) -> int: ...


class NudgeMemory(Protocol):
    """Topic config values a compaction nudge replaced, to be put back once the topic is compacted."""

    def remember_config(self, nudge: Nudge) -> Nudge: ...

    def nudges(self) -> list[Nudge]: ...

    def nudged(self, topic: str) -> dict[str, str | None]: ...

    def forget_config(self, topic: str, key: str) -> None: ...

    def rest_nudges(self, topic: str, ms: int) -> None: ...

    def nudges_rest(self, topic: str) -> int: ...


class TopicStore(Protocol):
    """Which incarnation of a topic the state describes, and dropping a topic's state (control/lifecycle.py)."""

    def topics(self) -> list[str]: ...

    def topic_id(self, topic: str) -> str | None: ...

    def set_topic_id(self, topic: str, topic_id: str) -> None: ...

    def reset_topic(self, topic: str, why: str, now: int) -> list[int]: ...

    def forget_topic(self, topic: str) -> list[int]: ...


class ControllerState(PartitionStore, Outbox, NudgeMemory, TopicStore, Protocol):
    """Everything the controller reads and writes."""

    def read_chunks(
        self, chunks: Sequence[tuple[str, list[int]]]
    ) -> list[tuple[PartitionNumbers, dict[int, list[ActionRecord]]]]: ...
