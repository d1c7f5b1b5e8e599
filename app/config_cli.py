"""`compactd config set` and `config get`: change thresholds at runtime, and show them as the job applies them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from compactd.clock import now_ms
from compactd.codec.config_events import digest, parse_config_event, sign
from compactd.errors import Rejected, UsageError
from compactd.kafka.reader import read_to_end
from compactd.kafka.writer import JsonTopicWriter
from compactd.policy.runtime_config import AppliedLayer, apply_event, effective_layers
from compactd.policy.thresholds import Thresholds, parse_scope, resolve
from compactd.settings import Settings


def parse_assignment(text: str) -> tuple[str, Any]:
    """`KEY=VALUE`: VALUE as JSON when it parses (numbers, booleans, null, lists), else as text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise UsageError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def applied_layers(settings: Settings) -> dict[str, AppliedLayer]:
    """What the running job has applied (Redis is the system of record); one line if Redis does not answer."""
    state = settings.redis_state()
    state.start()
    try:
        return {scope: AppliedLayer.from_json(v) for scope, v in state.config_layers().items()}
    finally:
        state.close()


def topic_versions(settings: Settings, scope: str) -> int:
    """Highest version already written for a scope, applied or not yet (the job may be behind)."""
    highest = 0
    for _key, value in read_to_end(settings.kafka_connection(), settings.topics.config):
        try:
            raw = json.loads(value or b"null")
        except ValueError:
            continue
        if isinstance(raw, dict) and raw.get("scope") == scope and isinstance(raw.get("version"), int):
            highest = max(highest, raw["version"])
    return highest


def config_set(settings: Settings, scope: str, assignments: Sequence[str], unset: Sequence[str]) -> int:
    """Validate locally (exit 2 on a bad key or value), sign, produce; returns the version written."""
    parse_scope(scope)
    values = dict(parse_assignment(a) for a in assignments)
    applied = applied_layers(settings)
    current = applied.get(scope, AppliedLayer()).version
    version = max(current, topic_versions(settings, scope)) + 1
    event: dict[str, Any] = {"type": "config", "scope": scope, "set": values, "version": version, "ts": now_ms()}
    if unset:
        event["unset"] = list(unset)
    secrets = settings.secrets()
    if secrets:
        event["sig"] = sign(event, secrets[0])
    try:
        parsed, raw = parse_config_event(json.dumps(event).encode(), secrets)
        apply_event(parsed, digest(raw), settings.thresholds, applied)  # the effective result must be valid too
    except Rejected as exc:
        raise UsageError(f"{exc.reason}: {exc.message}") from None
    writer = JsonTopicWriter(settings.kafka_connection(), settings.topics.config, what="config events")
    try:
        writer.write(scope, event)
        writer.flush(30)
    finally:
        writer.close()
    return version


def config_get(settings: Settings, scope: str) -> dict[str, Any]:
    """The effective thresholds at a scope (defaults included) and the version applied at each layer it merges."""
    kind, topic, partition = parse_scope(scope)
    applied = applied_layers(settings)
    layers = effective_layers(settings.thresholds, applied)
    if kind == "reader":  # a declared reader's keys, as the job merges them (file, then events)
        versions = {scope: {"version": applied[scope].version, "ts": applied[scope].ts}} if scope in applied else {}
        return {"scope": scope, "values": dict(layers.get(scope, {})), "versions": versions}
    if kind == "global":
        effective = Thresholds.model_validate(layers.get("global", {}))
        chain = ["global"]
    else:
        assert topic is not None
        effective = resolve(layers, topic, partition)
        chain = ["global", f"topic:{topic}"] + ([scope] if kind == "partition" else [])
    versions = {s: {"version": applied[s].version, "ts": applied[s].ts} for s in chain if s in applied}
    return {"scope": scope, "values": effective.model_dump(by_alias=True, mode="json"), "versions": versions}
