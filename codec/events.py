"""Input events (docs/contract.md, "Input events") as pydantic models.

Unknown fields are ignored; anything else invalid is rejected with a reason that goes to the DLQ."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from compactd.errors import Rejected
from compactd.labels import INVALID_FIELD, MALFORMED_JSON, NULL_VALUE, OVERSIZED, UNKNOWN_TYPE

# Offsets and timestamps travel through Lua and zset scores (doubles): above 2**53 they would lose digits,
# and no real cluster comes close, so larger values are rejected as absurd.
MAX_INT = 2**53
Offset = Annotated[int, Field(ge=0, le=MAX_INT, strict=True)]
Millis = Annotated[int, Field(ge=0, le=MAX_INT, strict=True)]
Partition = Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]
TopicName = Annotated[str, Field(min_length=1, max_length=249, pattern=r"^[a-zA-Z0-9._-]+$")]
BrokerId = Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]
LeaderEpoch = Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]  # Kafka's is an int32
GroupId = Annotated[str, Field(min_length=1, max_length=1024)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SegmentRolled(_Event):
    type: Literal["segment_rolled"]
    topic: TopicName
    partition: Partition
    base_offset: Offset
    end_offset: Offset
    first_batch_max_ts: Millis
    size_bytes: Offset = 0
    ts: Millis
    # the leader epoch of the segment's last record, as the reporting broker's leader-epoch-checkpoint assigns it
    # (an extension: the agent sends it). A record below a delete written in a later epoch than the segment that
    # holds it says the log was written again under the report (an unclean election): the delete is skipped
    last_epoch: LeaderEpoch | None = None

    @model_validator(mode="after")
    def _range(self) -> SegmentRolled:
        if self.end_offset <= self.base_offset:
            raise ValueError("end_offset must be greater than base_offset")
        return self


class Compacted(_Event):
    type: Literal["compacted"]
    topic: TopicName
    partition: Partition
    cleaned_up_to: Offset
    ts: Millis


class ReplicaLog(_Event):
    """What one replica's own log looks like (every broker's agent reports each replica it holds, leader or follower):
    - `cleaned_up_to`, its cleaner's checkpoint (absent: never cleaned). KIP-534 erases a tombstone from the cluster
      only once every replica's own cleaner has removed it, so the erasure deadline is the latest over the replicas.
      It never moves the partition's own `cleaned_up_to`: that is the leader's log (`Compacted`), which readers fetch.
    - `local_log_start`, the base offset of its oldest segment on the broker's disk. With tiered storage (KIP-405) the
      offsets from the log start up to it are in the remote tier only.
    `replicas`: the partition's replica assignment as the agent's broker read it (which replicas' reports count)."""

    type: Literal["replica_log"]
    topic: TopicName
    partition: Partition
    replica: BrokerId
    replicas: Annotated[list[BrokerId], Field(min_length=1, max_length=64)]
    cleaned_up_to: Offset | None = None
    local_log_start: Offset | None = None
    ts: Millis

    @model_validator(mode="after")
    def _member(self) -> ReplicaLog:
        if self.replica not in self.replicas:
            raise ValueError("replica must be one of replicas")
        return self


class LogStart(_Event):
    type: Literal["log_start"]
    topic: TopicName
    partition: Partition
    log_start_offset: Offset
    ts: Millis


class OffsetCommit(_Event):
    type: Literal["offset_commit"]
    group: GroupId
    topic: TopicName
    partition: Partition
    offset: Offset
    ts: Millis


class OffsetDelete(_Event):
    type: Literal["offset_delete"]
    group: GroupId
    topic: TopicName
    partition: Partition
    ts: Millis


class GroupDelete(_Event):
    type: Literal["group_delete"]
    group: GroupId
    ts: Millis


SegmentEvent = Annotated[SegmentRolled | Compacted | ReplicaLog | LogStart, Field(discriminator="type")]
OffsetEvent = Annotated[OffsetCommit | OffsetDelete | GroupDelete, Field(discriminator="type")]
SEGMENT_EVENTS: TypeAdapter[SegmentRolled | Compacted | ReplicaLog | LogStart] = TypeAdapter(SegmentEvent)
OFFSET_EVENTS: TypeAdapter[OffsetCommit | OffsetDelete | GroupDelete] = TypeAdapter(OffsetEvent)

AnyEvent = SegmentRolled | Compacted | ReplicaLog | LogStart | OffsetCommit | OffsetDelete | GroupDelete


def _types(*models: type[_Event]) -> frozenset[str]:
    return frozenset(get_args(m.model_fields["type"].annotation)[0] for m in models)


# the `type`s each topic carries (an event of the other topic's types is `unknown_type` there)
SEGMENT_TYPES = _types(SegmentRolled, Compacted, ReplicaLog, LogStart)
OFFSET_TYPES = _types(OffsetCommit, OffsetDelete, GroupDelete)


def parse(adapter: TypeAdapter, value: bytes | None, max_bytes: int) -> AnyEvent:
    """Validate one record's value or raise Rejected."""
    if value is None:
        raise Rejected(NULL_VALUE, "record has no value")
    if len(value) > max_bytes:
        raise Rejected(OVERSIZED, f"value is {len(value)} bytes, limit {max_bytes}")
    try:
        return adapter.validate_json(value)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        kind = err["type"]
        loc = ".".join(str(p) for p in err["loc"])
        if kind == "json_invalid":
            raise Rejected(MALFORMED_JSON, f"not JSON: {err['msg']}") from None
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            raise Rejected(UNKNOWN_TYPE, err["msg"]) from None
        raise Rejected(INVALID_FIELD, f"{loc}: {err['msg']}"[:300]) from None
