"""Threshold keys and scope resolution (docs/contract.md, "Thresholds").

Pure: no IO. Layers are plain dicts keyed by scope string; the most specific scope wins per key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from compactd.errors import ConfigError
from compactd.keys import parse_partition_key, partition_key

NudgeKey = Literal["max.compaction.lag.ms", "min.cleanable.dirty.ratio", "segment.ms"]
StrategyKind = Literal["offset", "timestamp", "header"]  # KIP-280
HeaderFormat = Literal["long", "decimal"]
TombstoneRule = Literal["version", "latest"]  # how a tombstone competes (compaction/strategy.py)

DEFAULT_RETRY_MS = 300_000
# No real retention or lag is longer than ten years; a larger value is a typo (seconds for ms, an extra zero).
MAX_DURATION_MS = 10 * 365 * 86_400_000


class Thresholds(BaseModel):
    """Effective settings for one partition after scope resolution."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    max_compaction_lag_ms: int | None = Field(
        None,
        alias="max.compaction.lag.ms",
        gt=0,
        le=MAX_DURATION_MS,
        description="KIP-354: a record may stay uncompacted at most this long; then compactd nudges the broker's "
        "cleaner (and the compaction service starts a run). null: off.",
    )
    consumed_retention_ms: int | None = Field(
        None,
        alias="consumed.retention.ms",
        ge=0,
        le=MAX_DURATION_MS,
        description="KIP-68 level 1: delete closed segments below the minimum committed offset of the counted "
        "groups once they are this old. null: off.",
    )
    forced_retention_ms: int | None = Field(
        None,
        alias="forced.retention.ms",
        ge=0,
        le=MAX_DURATION_MS,
        description="KIP-68 level 2: delete closed segments this old whatever the groups did; at least "
        "`consumed.retention.ms`. null: off.",
    )
    groups_include: tuple[str, ...] = Field(
        (),
        alias="groups.include",
        description="Regexes (full match) of the groups that count for the minimum committed offset; empty: every "
        "group.",
    )
    groups_exclude: tuple[str, ...] = Field(
        (),
        alias="groups.exclude",
        description="Regexes (full match) of groups that do not count for the minimum, even when included (a "
        "required group still counts).",
    )
    topics_exclude: tuple[str, ...] = Field(
        (),
        alias="topics.exclude",
        description="Regexes (full match) of topics compactd never acts on; internal (`__*`) and compactd's own "
        "topics are always excluded.",
    )
    groups_required: tuple[str, ...] = Field(
        (),
        alias="groups.required",
        description="Groups that always count, by name, even with no offset on a topic (offsets expired after "
        "`offsets.retention.minutes`, a weekly job between runs): while one has none, consumed retention deletes "
        "nothing.",
    )
    dry_run: bool = Field(
        True,
        alias="dry.run",
        description="Decide and record actions but send none; look at `compactd explain` before turning it off.",
    )
    compaction_nudge: NudgeKey = Field(
        "max.compaction.lag.ms",
        alias="compaction.nudge",
        description="The topic config a compaction nudge sets: `max.compaction.lag.ms`=1, "
        "`min.cleanable.dirty.ratio`=0 or `segment.ms`=1000; put back once the compaction is seen.",
    )
    compaction_nudge_max_ms: int = Field(
        3_600_000,
        alias="compaction.nudge.max.ms",
        gt=0,
        le=MAX_DURATION_MS,
        description="The longest a nudge stays on a topic: then it is put back whatever the cleaner did, and the "
        "topic is not nudged again for as long (an unanswered nudge never leaves the cleaner or segment rolls busy "
        "for good).",
    )
    action_retry_ms: int = Field(
        DEFAULT_RETRY_MS,
        alias="action.retry.ms",
        gt=0,
        le=MAX_DURATION_MS,
        description="Extension: how long an unanswered action waits before it is decided (and sent) again; also "
        "the longest backoff.",
    )
    actions_per_second: float = Field(
        10.0,
        alias="actions.per.second",
        gt=0,
        le=10_000,
        description="Extension, read at the global scope: sends to the cluster per second (a burst of one second's "
        "worth), a cap on what compactd asks of the cluster.",
    )
    max_concurrent_nudges: int = Field(
        10,
        alias="compaction.max.concurrent",
        ge=1,
        le=10_000,
        description="Extension, read at the global scope: compaction nudges sent and not yet answered, and runs of "
        "the compaction service in progress, at most this many at once.",
    )
    action_backoff_ms: int = Field(
        5_000,
        alias="action.backoff.ms",
        gt=0,
        le=MAX_DURATION_MS,
        description="Extension: a refused or timed-out action is retried after this long, doubling up to "
        "`action.retry.ms`.",
    )
    # The compaction service (compaction/): compactd's own compacted view of a topic, with KIP-280 strategies.
    compaction_service: bool = Field(
        False,
        alias="compaction.service",
        description='Keep a compacted view of the topic, `<topic><topics.view_suffix>` (contract.md, "Compaction '
        'service").',
    )
    compaction_strategy: StrategyKind = Field(
        "offset",
        alias="compaction.strategy",
        description="KIP-280: which record of a key the view keeps: the highest offset, timestamp or header version.",
    )
    compaction_strategy_header: str | None = Field(
        None,
        alias="compaction.strategy.header",
        max_length=255,
        description="The header holding the version for strategy `header`; empty or absent means `offset`.",
    )
    compaction_strategy_header_format: HeaderFormat = Field(
        "long",
        alias="compaction.strategy.header.format",
        description="`long` (8 bytes big-endian) or `decimal` (ASCII integer); a value that does not parse counts as "
        "no header.",
    )
    compaction_strategy_tombstone: TombstoneRule = Field(
        "version",
        alias="compaction.strategy.tombstone",
        description="How a tombstone competes. `version`: with its own version (KIP-280's rule; one without the "
        "header, as Debezium writes deletes, loses to any versioned record); `latest`: a tombstone that is its "
        "key's latest record deletes it, whatever the versions.",
    )
    compaction_threshold_bytes: int | None = Field(
        None,
        alias="compaction.threshold.bytes",
        ge=0,
        description="Source bytes beyond the view's horizon that start a run; null: no byte trigger.",
    )
    min_compaction_lag_ms: int = Field(
        0,
        alias="min.compaction.lag.ms",
        ge=0,
        le=MAX_DURATION_MS,
        description="Records younger than this stay beyond the view's horizon (not compacted yet).",
    )
    delete_retention_ms: int = Field(
        86_400_000,
        alias="delete.retention.ms",
        ge=0,
        le=MAX_DURATION_MS,
        description="How long a winning tombstone stays in the view, so readers see the delete. Also taken as the "
        "topic's own `delete.retention.ms` for the tombstones' erasure deadline (metric "
        "`compactd_partition_time_to_erasure_seconds`, `compactd explain`): set it to the topic's value.",
    )
    compaction_view_grace_ms: int = Field(
        300_000,
        alias="compaction.view.grace.ms",
        ge=0,
        le=MAX_DURATION_MS,
        description="How long an older generation of the view stays readable after a newer one is published, for "
        "readers still on it.",
    )
    compaction_view_dirty_ratio: float = Field(
        0.5,
        alias="compaction.view.dirty.ratio",
        ge=0,
        le=1,
        description="A run appends the delta's winners to the view instead of rewriting it while the records appended "
        "since the last full rewrite are less than this share of the view's range (as Kafka's "
        "`min.cleanable.dirty.ratio`); 0: every run rewrites the view.",
    )
    compaction_retain_null_key: bool = Field(
        False,
        alias="compaction.retain.null.key",
        description="Keep records without a key in the view; false: they are dropped and counted.",
    )
    # compaction/takeover.py
    compaction_retention_takeover: bool = Field(
        False,
        alias="compaction.retention.takeover",
        description="Pulsar's rule that retention respects the compaction cursor: the source's `retention.ms` is "
        "set to -1 and compactd applies it as forced retention, capped at the view's horizon; put back when off.",
    )

    @field_validator("groups_include", "groups_exclude", "topics_exclude", mode="before")
    @classmethod
    def _regex_list(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        out = tuple(value)
        for pattern in out:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc
        return out

    @model_validator(mode="after")
    def _forced_not_below_consumed(self) -> Thresholds:
        if (
            self.forced_retention_ms is not None
            and self.consumed_retention_ms is not None
            and self.forced_retention_ms < self.consumed_retention_ms
        ):
            raise ValueError("forced.retention.ms must be >= consumed.retention.ms")
        return self


KNOWN_KEYS = frozenset(f.alias for f in Thresholds.model_fields.values() if f.alias)


def parse_scope(scope: str) -> tuple[str, str | None, int | None]:
    """Split `global`, `topic:<t>`, `partition:<t>/<n>` into (kind, topic, partition); `reader:<name>` (a declared
    reader's keys, policy/readers.py) is ("reader", None, None): it resolves no topic's thresholds."""
    if scope == "global":
        return "global", None, None
    if scope.startswith("reader:") and len(scope) > 7:
        return "reader", None, None
    if scope.startswith("topic:") and len(scope) > 6 and "/" not in scope[6:]:
        return "topic", scope[6:], None
    if scope.startswith("partition:"):
        try:
            topic, num = parse_partition_key(scope[10:])
        except ConfigError:
            pass
        else:
            return "partition", topic, num
    raise ConfigError(f"invalid scope {scope!r}: expected global, topic:<name>, partition:<topic>/<n> or reader:<name>")


def validate_layer(scope: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Reject unknown keys and bad values early, so a bad layer never reaches resolution."""
    if parse_scope(scope)[0] == "reader":
        from compactd.policy.readers import validate_reader

        return validate_reader(scope, values)
    unknown = sorted(set(values) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"unknown config key(s) in {scope}: {', '.join(unknown)}")
    try:
        # Validate the keys on their own; cross-key rules are checked after merging.
        Thresholds.model_validate({k: v for k, v in values.items()})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or scope
        raise ConfigError(f"invalid config in {scope}: {loc}: {first['msg']}") from exc
    return dict(values)


def resolve(layers: Mapping[str, Mapping[str, Any]], topic: str, partition: int | None = None) -> Thresholds:
    """Merge global < topic < partition; the most specific scope wins per key."""
    merged: dict[str, Any] = {}
    merged.update(layers.get("global", {}))
    merged.update(layers.get(f"topic:{topic}", {}))
    if partition is not None:
        merged.update(layers.get(f"partition:{partition_key(topic, partition)}", {}))
    try:
        return Thresholds.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"invalid effective config for {topic}/{partition}: {exc.errors()[0]['msg']}") from exc


def without_nudges(layers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The layers with max.compaction.lag.ms off in every scope: where the broker's cleaner cannot be seen (the admin
    agent's clusters), a nudge could never be seen answered, so none is decided."""
    lag = "max.compaction.lag.ms"
    return {scope: {k: v for k, v in values.items() if k != lag} for scope, values in layers.items()}


def partition_scopes(layers: Mapping[str, Mapping[str, Any]]) -> dict[str, frozenset[int]]:
    """topic -> the partitions that have a layer of their own (resolved one by one; the rest take the topic's)."""
    out: dict[str, set[int]] = {}
    for scope in layers:
        kind, topic, partition = parse_scope(scope)
        if kind == "partition" and topic is not None and partition is not None:
            out.setdefault(topic, set()).add(partition)
    return {t: frozenset(p) for t, p in out.items()}


def key_scope(
    layers: Mapping[str, Mapping[str, Any]], key: str, topic: str, partition: int | None = None
) -> str | None:
    """The scope whose layer gives `key` its effective value for a partition, as `resolve` merges them (the most
    specific that sets it); None when no layer sets it and the built-in default applies. For `compactd explain`."""
    scopes = [f"partition:{partition_key(topic, partition)}"] if partition is not None else []
    for scope in [*scopes, f"topic:{topic}", "global"]:
        if key in layers.get(scope, {}):
            return scope
    return None


def resolve_global(layers: Mapping[str, Mapping[str, Any]]) -> Thresholds:
    """The global scope alone: where process-wide keys (actions.per.second, compaction.max.concurrent) are read."""
    try:
        return Thresholds.model_validate(dict(layers.get("global", {})))
    except ValidationError as exc:
        raise ConfigError(f"invalid global config: {exc.errors()[0]['msg']}") from exc


INTERNAL_TOPIC_PREFIX = "__"


def topic_excluded(topic: str, thresholds: Thresholds, own_topics: frozenset[str] = frozenset()) -> str | None:
    """Why compactd never acts on a topic, or None: internal, compactd's own, or matched by topics.exclude."""
    if topic.startswith(INTERNAL_TOPIC_PREFIX):
        return "internal topic"
    if topic in own_topics:
        return "compactd's own topic"
    if any(re.fullmatch(p, topic) for p in thresholds.topics_exclude):
        return "excluded by topics.exclude"
    return None


# The groups of Spark's Kafka connector's offset reader while it reads compactd's sources (streaming/connector.py):
# compactd's own, assigned its own topics only, committing nothing. They never count, whatever the settings say.
SOURCE_GROUP_PREFIX = "compactd-source"


def group_counts(group: str, thresholds: Thresholds) -> bool:
    """Whether a consumer group holds data back (include list empty = every group; a required group always;
    compactd's own source groups never)."""
    if group.startswith(f"{SOURCE_GROUP_PREFIX}-"):
        return False
    if group in thresholds.groups_required:
        return True
    if thresholds.groups_include and not any(re.fullmatch(p, group) for p in thresholds.groups_include):
        return False
    return not any(re.fullmatch(p, group) for p in thresholds.groups_exclude)
