"""Config events (`compactd.config`): one threshold change for one scope, versioned, optionally signed.

    {"type":"config","scope":"topic:orders","set":{"consumed.retention.ms":600000},"unset":["forced.retention.ms"],
     "version":2,"ts":1763800000000,"sig":"<hex HMAC-SHA256>"}

`sig` is HMAC-SHA256, hex, over the canonical JSON of the event without `sig`: keys sorted, no spaces, UTF-8
(`json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`). Any configured secret verifies;
the first one signs, so secrets rotate by listing the new one first, then dropping the old one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from compactd.codec.events import MAX_INT
from compactd.errors import ConfigError, Rejected
from compactd.labels import BAD_SIGNATURE, INVALID_CONFIG, MALFORMED_JSON, NULL_VALUE, OVERSIZED
from compactd.policy.thresholds import KNOWN_KEYS, parse_scope, validate_layer

MAX_CONFIG_EVENT_BYTES = 64 * 1024


class ConfigEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    type: Literal["config"]
    scope: str
    set_: dict[str, Any] = Field(default_factory=dict, alias="set")
    unset: tuple[str, ...] = ()
    version: int = Field(ge=1, le=MAX_INT, strict=True)
    ts: int = Field(ge=0, le=MAX_INT, strict=True)
    sig: str | None = None

    @field_validator("scope")
    @classmethod
    def _scope(cls, value: str) -> str:
        parse_scope(value)
        return value

    @field_validator("unset")
    @classmethod
    def _unset_known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - KNOWN_KEYS)
        if unknown:
            raise ValueError(f"unknown config key(s) to unset: {', '.join(unknown)}")
        return value

    @model_validator(mode="after")
    def _values(self) -> ConfigEvent:
        if not self.set_ and not self.unset:
            raise ValueError("an event must set or unset at least one key")
        both = sorted(set(self.set_) & set(self.unset))
        if both:
            raise ValueError(f"key(s) both set and unset: {', '.join(both)}")
        # known keys, types and bounds, regexes that compile; null disables a duration key at this scope
        validate_layer(self.scope, self.set_)
        return self


def canonical(event: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the event without `sig`, keys sorted, no spaces, UTF-8."""
    body = {k: v for k, v in event.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(event: Mapping[str, Any], secret: str) -> str:
    return hmac.new(secret.encode(), canonical(event), hashlib.sha256).hexdigest()


def digest(event: Mapping[str, Any]) -> str:
    """Identity of an event's content (signature included): a re-read of the same event is a replay."""
    return hashlib.sha256(json.dumps(event, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def parse_config_event(value: bytes | None, secrets: Sequence[str] = ()) -> tuple[ConfigEvent, dict[str, Any]]:
    """Validate one record of the config topic as a whole, or raise Rejected with a DLQ reason.

    Returns the event and the JSON object it came from (for signatures and digests).
    """
    if value is None:
        raise Rejected(NULL_VALUE, "record has no value")
    if len(value) > MAX_CONFIG_EVENT_BYTES:
        raise Rejected(OVERSIZED, f"value is {len(value)} bytes, limit {MAX_CONFIG_EVENT_BYTES}")
    try:
        raw = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected(MALFORMED_JSON, f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise Rejected(MALFORMED_JSON, "not a JSON object")
    try:
        event = ConfigEvent.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"]) or "event"
        raise Rejected(INVALID_CONFIG, f"{loc}: {err['msg']}"[:300]) from None
    except ConfigError as exc:
        raise Rejected(INVALID_CONFIG, str(exc)[:300]) from None
    if secrets:
        if not event.sig:
            raise Rejected(BAD_SIGNATURE, "unsigned event while config_secrets are set")
        body = canonical(raw)
        good = any(
            hmac.compare_digest(hmac.new(s.encode(), body, hashlib.sha256).hexdigest(), event.sig) for s in secrets
        )
        if not good:
            raise Rejected(BAD_SIGNATURE, "signature matches none of config_secrets")
    return event, raw
