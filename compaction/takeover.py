"""`compaction.retention.takeover`: Pulsar's rule that retention respects the compaction cursor, for a Kafka topic.

The source's own time retention deletes records whether or not a generation holds them yet (a gap in the view).
With the takeover on, compactd sets the topic's `retention.ms` to -1, records what it replaced, and applies the
replaced retention itself as forced retention — which, like every delete of compactd, never passes the view's
horizon. When the takeover ends (the key or the service turned off, dry run turned on, the view of another log) the
original goes back. The record of what was replaced is written to the nudge ledger (a compacted topic a Redis loss
cannot take) before the topic is altered, and removed only once the original is back.

The rules are pure; the IO is `Takeovers` (the trigger calls it every check).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from compactd.compaction.manifest import Manifest
from compactd.policy.thresholds import Thresholds, parse_scope, resolve

log = logging.getLogger("compactd.compaction")

KEY = "retention.ms"
OURS = "-1"  # the value compactd sets: no time retention on the broker's side


@dataclass(frozen=True)
class Takeover:
    """A topic whose time retention compactd applies: what the topic had (`original`: its own `retention.ms`, None
    for the broker's default) and the retention that value means (`applies_ms`)."""

    topic: str
    original: str | None
    applies_ms: int
    at: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Takeover | None:
        try:
            return cls(str(raw["topic"]), raw.get("original"), int(raw["applies_ms"]), int(raw.get("at") or 0))
        except (KeyError, TypeError, ValueError):
            return None


def wanted(th: Thresholds, manifest: Manifest | None, other_log: bool, policy: str, segments_known: bool) -> str | None:
    """Why the topic's retention is not (or no longer) to be taken over; None: it is. Only a topic whose view is
    published, of this log, that deletes by time, outside dry run (an alter is a change to the cluster), and whose
    segments compactd knows (forced retention deletes closed segments: without them nothing would delete at all)."""
    if not (th.compaction_service and th.compaction_retention_takeover):
        return "compaction.retention.takeover is off"
    if th.dry_run:
        return "dry.run is on: compactd changes nothing on the cluster"
    if not segments_known:
        return "no segment events for the topic: compactd could not apply its retention"
    if manifest is None or manifest.generation <= 0:
        return "no generation published yet"
    if other_log:
        return "the view is of another log"
    if "delete" not in policy.replace(" ", "").split(","):
        return f"cleanup.policy={policy}: retention.ms deletes nothing"
    return None


def overlay(layers: Mapping[str, Mapping[str, Any]], takeovers: Iterable[Takeover]) -> dict[str, dict[str, Any]]:
    """The threshold layers with each taken-over retention applied as forced retention (the lower of the two where
    `forced.retention.ms` is set too, in the topic scope and in every partition scope of the topic that sets it)."""
    out = {scope: dict(values) for scope, values in layers.items()}
    for tk in takeovers:
        scope = f"topic:{tk.topic}"
        forced = resolve(layers, tk.topic).forced_retention_ms
        applied = tk.applies_ms if forced is None else min(forced, tk.applies_ms)
        out.setdefault(scope, {})["forced.retention.ms"] = applied
        for name, values in layers.items():
            kind, topic, _ = parse_scope(name)
            if kind == "partition" and topic == tk.topic and values.get("forced.retention.ms") is not None:
                out[name]["forced.retention.ms"] = min(int(values["forced.retention.ms"]), tk.applies_ms)
    return out


class TopicConfig:
    """What the takeover asks of the cluster: a topic's retention.ms and cleanup.policy, and an alter."""

    def __init__(self, admin: Any, timeout_s: float) -> None:
        self.admin, self.timeout_s = admin, timeout_s

    def read(self, topic: str) -> tuple[str | None, int | None, str]:
        """(the topic's own retention.ms or None when it is the broker's default, the effective value in ms or None
        for none, cleanup.policy)."""
        from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

        res = ConfigResource(ResourceType.TOPIC, topic)
        entries = self.admin.describe_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)
        entry = entries.get(KEY)
        policy = entries.get("cleanup.policy")
        own = None
        if entry is not None and entry.value is not None and entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value:
            own = str(entry.value)
        value = int(entry.value) if entry is not None and entry.value not in (None, "") else None
        return own, value if value is not None and value > 0 else None, str(policy.value if policy else "delete")

    def alter(self, topic: str, value: str | None) -> None:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
        entry = ConfigEntry(KEY, value, incremental_operation=op)
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
        self.admin.incremental_alter_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)


class TopicRetention(Protocol):
    """What a takeover asks of the cluster (compaction/cluster.py `CompactionCluster`)."""

    def topic_config(self, topic: str) -> tuple[str | None, int | None, str]: ...

    def set_retention(self, topic: str, value: str | None) -> None: ...


class TakeoverLedger(Protocol):
    """Where a takeover is recorded before the topic is altered (sinks/nudge_ledger.py `NudgeLedger`)."""

    def record_takeover(self, topic: str, value: dict[str, Any]) -> None: ...

    def clear_takeover(self, topic: str) -> None: ...

    def load_takeovers(self) -> dict[str, dict[str, Any]]: ...


class Takeovers:
    """The takeovers in force: loaded from the ledger (the truth), taken and given back by the trigger's checks."""

    def __init__(self, cluster: TopicRetention, ledger: TakeoverLedger, clock: Callable[[], int]) -> None:
        self.cluster, self.ledger, self.clock = cluster, ledger, clock
        self.held: dict[str, Takeover] | None = None

    def overlay(self, layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The layers with every retention taken over applied as forced retention (as they are until the ledger is
        read: the safe side, less is deleted)."""
        if not self.held:
            return layers
        return overlay(layers, self.held.values())

    def current(self) -> dict[str, Takeover]:
        if self.held is None:
            loaded = (Takeover.from_json(raw) for raw in self.ledger.load_takeovers().values())
            self.held = {tk.topic: tk for tk in loaded if tk is not None}
        return self.held

    def take(self, topic: str) -> Takeover | None:
        """Record the topic's retention, then set it to -1. None: the topic has no time retention to take."""
        own, effective, _ = self.cluster.topic_config(topic)
        if effective is None:
            return None  # retention.ms -1 already (an operator's choice): nothing deletes by time
        tk = Takeover(topic, own, effective, self.clock())
        self.ledger.record_takeover(tk.topic, tk.to_json())  # durable before the alter: it can always go back
        self.cluster.set_retention(topic, OURS)
        self.current()[topic] = tk
        log.warning(
            "compaction of %s: retention.ms (%s) taken over: set to -1 on the topic, applied by compactd as forced "
            "retention capped at the view's horizon; it goes back when compaction.retention.takeover is off",
            topic, own if own is not None else f"the broker's default, {effective}",
        )  # fmt: skip
        return tk

    def give_back(self, topic: str, why: str) -> str:
        """Put the original back (only over compactd's own -1: a value someone set since is theirs), then forget."""
        tk = self.current()[topic]
        own, _, _ = self.cluster.topic_config(topic)
        if own == OURS:
            self.cluster.set_retention(topic, tk.original)
            done = f"retention.ms put back to {tk.original if tk.original is not None else 'the broker default'}"
        else:
            done = f"retention.ms left as it is now ({own if own is not None else 'default'}): not compactd's -1"
        self.ledger.clear_takeover(topic)
        del self.current()[topic]
        log.warning("compaction of %s: takeover ended (%s): %s", topic, why, done)
        return done

    def forget(self, topic: str) -> None:
        """The topic is gone: nothing to put back."""
        if topic in self.current():
            self.ledger.clear_takeover(topic)
            del self.current()[topic]
