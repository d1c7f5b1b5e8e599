"""Configuration kept in Redis: the runtime config layers applied from config events, and the topic config values
compaction nudges replaced (to be put back once the topic is compacted)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from compactd.model import Nudge
from compactd.state.store_base import StoreBase, _s


class ConfigStore(StoreBase):
    """Runtime config layers and compaction nudge bookkeeping."""

    # ---- runtime configuration -----------------------------------------------------------------

    def config_layers(self) -> dict[str, dict[str, Any]]:
        """Layers applied from config events, by scope, as stored (values, version, ts, digests)."""
        return {_s(k): json.loads(v) for k, v in self.r.hgetall(self.keys.config_layers).items()}

    def save_config_layer(self, scope: str, layer: dict[str, Any]) -> None:
        self.r.hset(self.keys.config_layers, scope, json.dumps(layer, sort_keys=True))

    # ---- compaction nudge bookkeeping ----------------------------------------------------------

    def remember_config(self, nudge: Nudge) -> Nudge:
        """Keep the value a nudge replaced; the first nudge of a topic wins (a second one sees compactd's own value).
        Returns the nudge stored."""
        field = f"{nudge.topic}|{nudge.key}"
        pipe = self.r.pipeline(transaction=True)
        pipe.hsetnx(self.k_nudge, field, msgspec.json.encode(nudge))
        pipe.hget(self.k_nudge, field)
        return _nudge(field, pipe.execute()[1])

    def nudges(self) -> list[Nudge]:
        """Every nudge not yet put back, over all topics (a few: compaction.max.concurrent bounds them)."""
        return [_nudge(_s(k), v) for k, v in self.r.hgetall(self.k_nudge).items()]

    def nudged(self, topic: str) -> dict[str, str | None]:
        """config key -> the value to put back, for the topic's nudges."""
        return {n.key: n.original for n in self.nudges() if n.topic == topic}

    def forget_config(self, topic: str, key: str) -> None:
        self.r.hdel(self.k_nudge, f"{topic}|{key}")

    def rest_nudges(self, topic: str, ms: int) -> None:
        """The cleaner did not answer a nudge in time: no new nudge of the topic for `ms`."""
        self.r.set(f"{self.k_nudge}-rest:{topic}", 1, px=max(ms, 1))

    def nudges_rest(self, topic: str) -> int:
        """Milliseconds until the topic may be nudged again (0: now)."""
        return max(int(self.r.pttl(f"{self.k_nudge}-rest:{topic}")), 0)


def _nudge(field: str, raw: bytes) -> Nudge:
    """A nudge as stored; the layout before the nudge ledger kept only the original value (JSON): its time is
    unknown, so `compaction.nudge.max.ms` counts as spent."""
    value = json.loads(raw)
    if isinstance(value, dict):
        return msgspec.convert(value, Nudge)
    topic, _, key = field.partition("|")
    return Nudge(topic, key, value, "", 0)
