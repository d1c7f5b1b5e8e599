"""Config events: validated as a whole, signed, versioned per scope, checked on the effective result."""

from __future__ import annotations

import json

import pytest

from compactd.codec.config_events import canonical, digest, parse_config_event, sign
from compactd.errors import Rejected
from compactd.policy.runtime_config import AppliedLayer, apply_event, effective_layers

BASE = {"global": {"dry.run": False}, "topic:orders": {"forced.retention.ms": 7_200_000}}


def event(scope: str = "topic:orders", version: int = 1, **fields) -> dict:  # type: ignore[no-untyped-def]
    return {
        "type": "config",
        "scope": scope,
        "set": {"max.compaction.lag.ms": 60_000},
        "version": version,
        "ts": 1,
        **fields,
    }


def parse(ev: dict, secrets: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return parse_config_event(json.dumps(ev).encode(), secrets)


def reason(ev: dict | bytes, secrets: tuple[str, ...] = ()) -> str:
    raw = ev if isinstance(ev, bytes) else json.dumps(ev).encode()
    with pytest.raises(Rejected) as exc:
        parse_config_event(raw, secrets)
    return exc.value.reason


# (event, reason): also fed to the metrics test, which checks each reason is exported from start-up
INVALID_EVENTS: list[tuple[dict | bytes, str]] = [
    (b"{oops", "malformed_json"),
    (b"[1]", "malformed_json"),
    (event(scope="topik:x"), "invalid_config"),
    (event(set={"no.such.key": 1}), "invalid_config"),
    (event(set={"max.compaction.lag.ms": -5}), "invalid_config"),
    (event(set={"consumed.retention.ms": 10**15}), "invalid_config"),  # absurd: more than ten years
    (event(set={"groups.include": ["(unclosed"]}), "invalid_config"),
    (event(set={"dry.run": "maybe"}), "invalid_config"),
    (event(set={"dry.run": None}), "invalid_config"),  # only durations can be disabled with null
    (event(set={}), "invalid_config"),
    (event(unset=["nope"]), "invalid_config"),
    (event(version=0), "invalid_config"),
    (event(version="2"), "invalid_config"),
]


@pytest.mark.parametrize(("ev", "why"), INVALID_EVENTS)
def test_invalid_events_are_rejected_with_a_reason(ev: dict | bytes, why: str) -> None:
    assert reason(ev) == why


def test_signature_is_hmac_over_canonical_json_and_any_secret_verifies() -> None:
    ev = event(note="ünïcode kept as UTF-8")
    assert canonical(ev) == json.dumps(ev, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    signed = {**ev, "sig": sign(ev, "new")}
    assert parse(signed, ("new", "old"))[0].version == 1  # rotation: new first, old still verifies
    assert parse({**ev, "sig": sign(ev, "old")}, ("new", "old"))[0].version == 1
    assert reason({**ev, "sig": sign(ev, "stolen")}, ("new", "old")) == "bad_signature"
    assert reason(ev, ("new",)) == "bad_signature"  # unsigned while secrets are set
    assert reason({**signed, "version": 2}, ("new",)) == "bad_signature"  # tampered after signing


def apply(ev: dict, applied: dict[str, AppliedLayer]):  # type: ignore[no-untyped-def]
    parsed, raw = parse(ev)
    return apply_event(parsed, digest(raw), BASE, applied)


def test_versions_are_monotonic_per_scope_and_replays_are_ignored() -> None:
    first = apply(event(version=3), {})
    assert first is not None and first.layer.version == 3
    applied = {"topic:orders": first.layer}
    assert apply(event(version=3), applied) is None  # the same event again: a replay
    with pytest.raises(Rejected, match="not newer") as exc:
        apply(event(version=3, set={"max.compaction.lag.ms": 1}), applied)
    assert exc.value.reason == "stale_version"
    assert apply(event(scope="topic:other", version=1), applied) is not None  # versions are per scope


def test_set_and_unset_override_the_file_key_by_key() -> None:
    a = apply(event(set={"consumed.retention.ms": 1000, "forced.retention.ms": None}), {})
    assert a is not None
    layers = effective_layers(BASE, {"topic:orders": a.layer})
    assert layers["topic:orders"] == {"forced.retention.ms": None, "consumed.retention.ms": 1000}
    b = apply(event(version=2, set={"dry.run": True}, unset=["forced.retention.ms"]), {"topic:orders": a.layer})
    assert b is not None
    layers = effective_layers(BASE, {"topic:orders": b.layer})
    assert layers["topic:orders"]["forced.retention.ms"] == 7_200_000  # the file's value again
    assert not a.groups_changed and apply(event(set={"groups.exclude": ["tmp-.*"]}), {}).groups_changed  # type: ignore[union-attr]


def test_forced_below_consumed_is_checked_on_the_effective_result_at_every_scope() -> None:
    # global consumed 3h is fine globally, but topic:orders keeps forced 2h from the file: 2h < 3h there
    ev = event(scope="global", set={"consumed.retention.ms": 3 * 3_600_000})
    with pytest.raises(Rejected, match="orders") as exc:
        apply(ev, {})
    assert exc.value.reason == "invalid_config"
    assert apply(event(scope="global", set={"consumed.retention.ms": 3_600_000}), {}) is not None
    with pytest.raises(Rejected):
        apply(event(scope="partition:orders/3", set={"consumed.retention.ms": 3 * 3_600_000}), {})
