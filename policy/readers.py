"""Readers that commit no group offsets, counted like groups: share groups (KIP-932), Spark queries by
their checkpoint, readers the operator declares with a pinned position and a lease, compactd's own compaction reads.

Consumed retention promises never to delete what a reader has not read. A group commits its position to Kafka; these
readers keep theirs elsewhere (`__share_group_state`, a checkpoint directory, the operator's word). Each becomes a
`ReaderHold` on the topics it reads, and a hold counts exactly as a group does (CONTRACT §1, KIP-68):
- it adds one to the topic's counted readers;
- on a partition where it has a position, the minimum position is taken over it too;
- on a partition where it has none (not there yet, its source unreadable: `blind`), the position is unknown and
  consumed retention deletes nothing there (KIP-68's "-1").
Forced retention (level 2) deletes whatever the readers did, as it does for groups.

Pure: the positions are read at the edges (control/readers.py) and folded here, into the arrays the rules evaluate and
into the one-partition view the send-time check judges, so both ends decide with the same readers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from compactd.errors import ConfigError
from compactd.model import PartitionNumbers, PartitionView

EVERY_TOPIC = "*"  # a hold whose reader's topics are unknown: it holds every topic
PATTERNS = "re:"  # the holds of readers on every topic their `pattern` matches (no topic name has a colon)

# reader kinds, as explain and the metrics name them
SHARE_GROUP = "share_group"
SPARK_CHECKPOINT = "spark_checkpoint"
PIN = "pin"
COMPACTION = "compaction"


class ReaderHold(msgspec.Struct, frozen=True):
    """One reader's hold on one topic: its position per partition (next offset to read; a partition left out is
    unknown there), or `blind`: why it has no known position anywhere on the topic. Under PATTERNS, `pattern` is
    the regex of the topics it holds (a Spark query's `subscribePattern`)."""

    reader: str
    kind: str
    positions: dict[int, int] = {}
    blind: str = ""
    pattern: str = ""

    def position(self, partition: int) -> int | None:
        return None if self.blind else self.positions.get(partition)

    @property
    def label(self) -> str:
        """How explain and the logs name it: `share group sg1`, `reader spark-etl`; `share groups` for the hold of
        every share group at once (their state cannot be read)."""
        if self.kind == SHARE_GROUP:
            return "share groups" if self.reader == EVERY_TOPIC else f"share group {self.reader}"
        return f"reader {self.reader}"


Holds = Mapping[str, tuple[ReaderHold, ...]]  # topic (or EVERY_TOPIC, PATTERNS) -> holds


def holds_from_doc(doc: Mapping[str, Any] | None) -> dict[str, tuple[ReaderHold, ...]]:
    """The holds as the job published them (control/readers.py `publish`), for `explain`."""
    if not doc:
        return {}
    return {t: tuple(msgspec.convert(h, ReaderHold, strict=False) for h in hs) for t, hs in doc["holds"].items()}


def holds_on(holds: Holds, topic: str) -> tuple[ReaderHold, ...]:
    """The holds on `topic`: its own, those on every topic, and those of readers whose pattern matches it and that
    have no hold of their own there (a topic created after the query's last batch: it will read it from the start,
    as Spark reads a topic its pattern finds, so nothing of it is deletable yet)."""
    own = holds.get(topic, ())
    matched = tuple(
        h
        for h in holds.get(PATTERNS, ())
        if re.fullmatch(h.pattern, topic) and all(o.reader != h.reader or o.kind != h.kind for o in own)
    )
    return own + holds.get(EVERY_TOPIC, ()) + matched


def fold_numbers(nums: PartitionNumbers, holds: Iterable[ReaderHold]) -> PartitionNumbers:
    """A chunk's numbers with `holds` counted as groups: each adds one counted reader, and where it has a position
    one offset to the minimum. Arrays in, arrays out; no hold, the same object."""
    holds = list(holds)
    if not holds:
        return nums
    counted, zcard, lowest = nums.counted.copy(), nums.zcard.copy(), nums.lowest.copy()
    parts = nums.partitions.tolist()
    for hold in holds:
        pos = np.array([-1 if hold.position(n) is None else hold.position(n) for n in parts], dtype=np.int64)
        has = pos >= 0
        counted += 1
        lowest = np.where(has, np.where(zcard > 0, np.minimum(lowest, pos), pos), lowest)
        zcard += has
    return dataclasses.replace(nums, counted=counted, zcard=zcard, lowest=lowest)


def fold_view(view: PartitionView, holds: Iterable[ReaderHold]) -> PartitionView:
    """One partition's view with `holds` counted as groups (the send-time check's read)."""
    holds = list(holds)
    if not holds:
        return view
    known = view.counted_groups == 0 or view.min_committed is not None
    lowest = view.min_committed
    for hold in holds:
        pos = hold.position(view.partition)
        if pos is None:
            known = False
        elif lowest is None or pos < lowest:
            lowest = pos
    return dataclasses.replace(
        view, counted_groups=view.counted_groups + len(holds), min_committed=lowest if known else None
    )


def readers_say_no(before: int, holds: Iterable[ReaderHold], topic: str, partition: int) -> str | None:
    """Why a consumed-retention delete before `before` must not go, by the readers (None: they allow it)."""
    for hold in holds:
        pos = hold.position(partition)
        if pos is None:
            why = hold.blind or "no position there"
            return f"{hold.label} reads {topic} and its position on partition {partition} is unknown ({why})"
        if before > pos:
            return f"past {hold.label}'s position {pos} on {topic}/{partition}"
    return None


def holding(holds: Iterable[ReaderHold], partition: int) -> list[tuple[str, int | None]]:
    """(label, position) of each hold on a partition, unknown (None) first, then lowest first: for explain."""
    rows = [(h.label, h.position(partition)) for h in holds]
    return sorted(rows, key=lambda r: (r[1] is not None, r[1] or 0, r[0]))


# -- readers declared by the operator: the `readers:` file key and `reader:<name>` config scopes


class ReaderLayer(BaseModel):
    """The keys of a `reader:<name>` layer, each checked on its own (config events set them one at a time)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spark_checkpoint: str | None = Field(None, min_length=1)
    pin: dict[str, dict[int, int]] | None = None
    expires_ms: int | None = Field(None, gt=0)
    subscribe_pattern: str | None = Field(None, min_length=1)

    @field_validator("subscribe_pattern")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"subscribe_pattern {value!r} is not a regex: {exc}") from None
        return value

    @field_validator("pin")
    @classmethod
    def _positions(cls, value: dict[str, dict[int, int]] | None) -> dict[str, dict[int, int]] | None:
        for topic, parts in (value or {}).items():
            if not topic or not parts or any(p < 0 or o < 0 for p, o in parts.items()):
                raise ValueError(f"pin on {topic!r}: partitions and offsets are non-negative, at least one per topic")
        return value


class ReaderSpec(ReaderLayer):
    """A declared reader: exactly one of `spark_checkpoint` (a Spark query's checkpoint directory, whose latest
    committed batch gives its position) or `pin` (a fixed position the operator keeps up to date, with a lease:
    `expires_ms`, epoch ms, after which the pin no longer counts and compactd says so). `subscribe_pattern`: the
    regex of the topics it reads beyond those it has a position on (a query's `subscribePattern`, matched whole as
    Spark's `Pattern.matches`): each matching topic is held whole until the reader has a position there."""

    @model_validator(mode="after")
    def _one_kind(self) -> ReaderSpec:
        if (self.spark_checkpoint is None) == (self.pin is None):
            raise ValueError("a reader has exactly one of spark_checkpoint or pin")
        if self.pin is not None and self.expires_ms is None:
            raise ValueError("a pinned reader needs expires_ms (its lease), so a forgotten pin cannot hold for ever")
        return self


READER_KEYS = frozenset(ReaderLayer.model_fields)


def validate_reader(scope: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """A `reader:<name>` layer's keys checked alone; the merged layers make a reader or not (`declared`)."""
    unknown = sorted(set(values) - READER_KEYS)
    if unknown:
        known = ", ".join(sorted(READER_KEYS))
        raise ConfigError(f"unknown reader key(s) in {scope}: {', '.join(unknown)} (known: {known})")
    try:
        ReaderLayer.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or scope
        raise ConfigError(f"invalid reader in {scope}: {loc}: {first['msg']}") from None
    return dict(values)


def declared(layers: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, ReaderSpec], dict[str, str]]:
    """The declared readers of the effective layers (`reader:<name>` scopes), and name -> why for those whose merged
    keys do not make a reader (a layer with every key unset is no reader at all)."""
    specs: dict[str, ReaderSpec] = {}
    bad: dict[str, str] = {}
    for scope, values in layers.items():
        if not scope.startswith("reader:"):
            continue
        name = scope[len("reader:") :]
        values = {k: v for k, v in values.items() if v is not None}
        if not values:
            continue
        try:
            specs[name] = ReaderSpec.model_validate(values)
        except ValidationError as exc:
            bad[name] = exc.errors()[0]["msg"].removeprefix("Value error, ")
    return specs, bad


def pin_holds(name: str, spec: ReaderSpec, now: int) -> dict[str, ReaderHold]:
    """A pinned reader's holds, topic -> hold; none once its lease is over (the caller says so)."""
    if spec.pin is None or spec.expires_ms is None or now >= spec.expires_ms:
        return {}
    return {topic: ReaderHold(name, PIN, dict(parts)) for topic, parts in spec.pin.items()}


# -- which incarnation of a topic a declared reader's positions were taken on (the re-created topic rule, for readers)


class Bound(msgspec.Struct, frozen=True, array_like=True):
    """What a declared reader's positions on a topic are bound to: the topic ID they were taken on, the batch after
    which the checkpoint's offsets count for it (-1: any batch), and what was declared (the checkpoint directory, or
    the pin and its lease: declared again, it is the operator's word on the topic as it is now)."""

    topic_id: str
    since: int
    mark: str


def incarnation(
    bound: Bound | None, now_id: str | None, batch: int, mark: str, planned: Callable[[], int]
) -> tuple[Bound | None, bool]:
    """(the binding to keep, whether the positions count on the topic now).

    A group's commit names its topic ID (OffsetCommitValue v4); a checkpoint's offsets and a pin name none, so they
    are bound to the ID the topic had when compactd first read them. `now_id` None (no ID reported, the topic gone):
    no evidence either way, as for a commit without an ID. Another ID: the topic was created again, and offsets
    taken before compactd saw it may be the old log's. They count again from a batch planned after this read
    (`planned()`: the latest planned now, read after the topic ID; a pin: 0, so never), or once declared again."""
    if now_id is None:
        return bound, True
    if bound is None or (bound.topic_id == now_id and bound.mark != mark):
        return Bound(now_id, -1, mark), True
    if bound.topic_id != now_id:
        bound = Bound(now_id, planned(), mark)
    return bound, batch > bound.since
