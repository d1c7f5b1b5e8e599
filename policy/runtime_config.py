"""Runtime configuration: the file's `thresholds` are the base layer, config events override it key by key.

Pure: applying an event to the applied layers gives the new layer or a reason to reject it. `version` is monotonic
per scope; an event whose version is not newer than the applied one is stale. A change is checked on the effective
result at every scope it touches (`forced.retention.ms >= consumed.retention.ms` after merging global, topic and
partition layers), so a change that would make any scope invalid changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from compactd.errors import ConfigError, Rejected
from compactd.labels import INVALID_CONFIG, STALE_VERSION
from compactd.policy.readers import declared
from compactd.policy.thresholds import parse_scope, resolve

Layers = Mapping[str, Mapping[str, Any]]
GROUP_KEYS = frozenset({"groups.include", "groups.exclude", "groups.required"})
MAX_DIGESTS = 1000  # applied events remembered per scope, so re-reading the topic from the start is a replay


class ConfigChange(Protocol):
    """What a config event asks (codec/config_events.py `ConfigEvent` is one, decoded and validated): the rules take
    its values, not the wire format."""

    @property
    def scope(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def ts(self) -> int: ...
    @property
    def set_(self) -> Mapping[str, Any]: ...
    @property
    def unset(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class AppliedLayer:
    """What config events have set at one scope (None disables a duration key there; unset falls back)."""

    values: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    ts: int = 0
    digests: tuple[str, ...] = ()  # every event applied here: re-reading one of them is a replay

    def to_json(self) -> dict[str, Any]:
        return {"values": self.values, "version": self.version, "ts": self.ts, "digests": list(self.digests)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AppliedLayer:
        return cls(dict(raw["values"]), int(raw["version"]), int(raw["ts"]), tuple(raw.get("digests", ())))


def effective_layers(base: Layers, applied: Mapping[str, AppliedLayer]) -> dict[str, dict[str, Any]]:
    """File layers overridden key by key by applied events (a null value disables that key at its scope)."""
    out = {scope: dict(values) for scope, values in base.items()}
    for scope, layer in applied.items():
        out.setdefault(scope, {}).update(layer.values)
    return out


@dataclass(frozen=True)
class Change:
    """An accepted event: the scope's new layer and what it affects."""

    scope: str
    layer: AppliedLayer
    groups_changed: bool


def _touched_scopes(scope: str, layers: Layers) -> Iterable[tuple[str, int | None]]:
    """(topic, partition) resolutions a change at `scope` can alter, as far as the layers name them."""
    kind, topic, partition = parse_scope(scope)
    named: set[tuple[str, int | None]] = set()
    for s in layers:
        k, t, p = parse_scope(s)
        if k in ("global", "reader"):
            continue
        assert t is not None
        named.add((t, p))
        named.add((t, None))
    if kind == "global":
        yield from sorted(named, key=str)
        yield "", None  # a topic no layer names resolves to global alone
    elif kind == "topic":
        yield topic or "", None
        yield from sorted(((t, p) for t, p in named if t == topic and p is not None), key=str)
    else:
        yield topic or "", partition


def apply_event(
    event: ConfigChange, raw_digest: str, base: Layers, applied: Mapping[str, AppliedLayer]
) -> Change | None:
    """The change an event makes, None for a replay of an applied event, or Rejected (stale, invalid result)."""
    current = applied.get(event.scope, AppliedLayer())
    if raw_digest in current.digests:
        return None
    if event.version <= current.version:
        raise Rejected(
            STALE_VERSION, f"{event.scope}: version {event.version} is not newer than applied {current.version}"
        )
    values = {**current.values, **event.set_}
    for key in event.unset:
        values.pop(key, None)
    layer = AppliedLayer(values, event.version, event.ts, (*current.digests[-MAX_DIGESTS:], raw_digest))
    proposed = effective_layers(base, {**applied, event.scope: layer})
    if parse_scope(event.scope)[0] == "reader":
        why = declared(proposed)[1].get(event.scope[len("reader:") :])
        if why is not None:
            raise Rejected(INVALID_CONFIG, f"{event.scope} v{event.version}: {why}")
    for topic, partition in _touched_scopes(event.scope, proposed):
        try:
            resolve(proposed, topic, partition)
        except ConfigError as exc:
            raise Rejected(INVALID_CONFIG, f"{event.scope} v{event.version}: {exc}") from None
    return Change(event.scope, layer, bool(GROUP_KEYS & (set(event.set_) | set(event.unset))))
