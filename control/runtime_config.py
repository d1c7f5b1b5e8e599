"""Applies config events while the job runs: validate, check version and signature, store, take effect.

The layers applied from events live in Redis (with version and ts per scope), so a restart, or a re-read of the
config topic from the start, ends in the same configuration. An event that fails any check changes nothing and
goes to the DLQ (`stream=config`) with its reason: malformed_json, invalid_config, bad_signature, stale_version.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from compactd.codec.config_events import digest, parse_config_event
from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.errors import Rejected
from compactd.policy.runtime_config import AppliedLayer, apply_event, effective_layers
from compactd.policy.thresholds import parse_scope
from compactd.state.redis_store import RedisState

log = logging.getLogger("compactd.config")


@dataclass
class ConfigOutcome:
    """What one batch's config events did."""

    rejected: list[dict[str, Any]] = field(default_factory=list)  # DLQ rows
    applied: list[str] = field(default_factory=list)  # "scope vN"
    evaluate_all: bool = False
    evaluate: list[tuple[str, int]] = field(default_factory=list)


class Overlay(Protocol):
    """What the job adds over the operators' layers (daemon/application.py `JobOverlay`: the retention takeovers'
    forced retention, no nudges where the cleaner cannot be seen)."""

    def __call__(self, layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]: ...


def no_overlay(layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return layers


class RuntimeConfig:
    def __init__(
        self,
        state: RedisState,
        base: Mapping[str, Mapping[str, Any]],
        secrets: Sequence[str],
        controller: Controller,
        metrics: Metrics,
        overlay: Overlay = no_overlay,
    ) -> None:
        self.state = state
        self.base = {scope: dict(values) for scope, values in base.items()}
        self.secrets = list(secrets)
        self.controller = controller
        self.metrics = metrics
        self.overlay = overlay
        self.applied: dict[str, AppliedLayer] = {}

    def load(self) -> None:
        """Read what earlier runs applied; the controller starts with file layers overridden by it."""
        self.applied = {s: AppliedLayer.from_json(v) for s, v in self.state.config_layers().items()}
        self.controller.set_layers(self.effective())
        for scope, layer in self.applied.items():
            self.metrics.config_version.labels(scope).set(layer.version)

    def effective(self) -> dict[str, dict[str, Any]]:
        return self.overlay(effective_layers(self.base, self.applied))

    def apply(self, rows: Sequence[Mapping[str, Any]]) -> ConfigOutcome:
        """Apply config records in log order; each is accepted or rejected as a whole."""
        out = ConfigOutcome()
        recount: set[str | None] = set()
        for row in rows:
            try:
                event, raw = parse_config_event(row.get("raw_value"), self.secrets)
                change = apply_event(event, digest(raw), self.base, self.applied)
            except Rejected as exc:
                out.rejected.append({**row, "error": exc.reason, "message": exc.message})
                self.metrics.config_events.labels("rejected").inc()
                log.warning("config event rejected (%s): %s", exc.reason, exc.message)
                continue
            if change is None:
                self.metrics.config_events.labels("replayed").inc()
                continue
            self.state.save_config_layer(change.scope, change.layer.to_json())
            self.applied[change.scope] = change.layer
            self.metrics.config_events.labels("applied").inc()
            self.metrics.config_version.labels(change.scope).set(change.layer.version)
            out.applied.append(f"{change.scope} v{change.layer.version}")
            log.info("config applied: %s v%d set %s unset %s", change.scope, event.version, event.set_, event.unset)
            kind, topic, partition = parse_scope(change.scope)
            if change.groups_changed:
                recount.add(None if kind == "global" else topic)
            if kind in ("global", "reader"):  # a reader may hold any topic
                out.evaluate_all = True
            elif kind == "topic" and topic is not None:
                out.evaluate.extend((topic, p) for p in self.state.partitions(topic))
            elif topic is not None and partition is not None:
                out.evaluate.append((topic, partition))
        if out.applied:
            self.controller.set_layers(self.effective())
        if recount:
            topics = None if None in recount else sorted(t for t in recount if t is not None)
            out.evaluate.extend(self.controller.recount_groups(topics))
        return out
