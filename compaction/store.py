"""Where a compaction's bookkeeping lives: the manifest topic (the truth), its mirror in Redis, the run lease, the
status operators poll.

The manifest topic is compacted and keyed by source topic: its last record per key is the published generation. A
Redis mirror lets the controller read it on every tick; the mirror is only trusted when it is not older than the
topic (`ManifestLog.read` is the authority, and the mirror is refreshed from it after a state loss).

Redis keys (one hash tag per topic, like the rest of the per-topic state):
  <prefix>:{<topic>}:cv:lease     the run lease: a token, with a TTL renewed while the run lives
  <prefix>:{<topic>}:cv:status    hash: status, generation, started_at, error, summary (JSON of the last run)
  <prefix>:{<topic>}:cv:manifest  the published manifest (JSON)
  <prefix>:cv:topics              set of topics with a manifest (the controller's index)
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from typing import Any

from compactd.compaction.manifest import Manifest
from compactd.errors import CompactdError, DeliveryTimeout
from compactd.kafka.config import KafkaConnection

MANIFEST_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1"}
LEASE_TTL_MS = 60_000
RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
RENEW_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"


class RunInProgress(CompactdError):
    """Another run holds the topic's lease."""


class ManifestLog:
    """The manifest topic: read the last manifest of a topic, write a new one (durably, before anyone trusts it)."""

    def __init__(self, conn: KafkaConnection, topic: str) -> None:
        self.conn = conn
        self.topic = topic

    def read_all(self, timeout_s: float = 30.0) -> dict[str, Manifest]:
        from compactd.kafka.reader import read_to_end

        out: dict[str, Manifest] = {}
        for key, value in read_to_end(self.conn, self.topic, timeout_s):
            if key is None:
                continue
            name = key.decode("utf-8", errors="replace")
            if value is None:
                out.pop(name, None)
                continue
            try:
                out[name] = Manifest.loads(value)
            except (ValueError, TypeError):
                continue  # not a manifest compactd wrote: ignored, never trusted
        return out

    def read(self, topic: str, timeout_s: float = 30.0) -> Manifest | None:
        return self.read_all(timeout_s).get(topic)

    def write(self, manifest: Manifest, timeout_s: float = 30.0) -> None:
        from confluent_kafka import Producer

        failed: list[str] = []
        producer = Producer(self.conn.client("producer", {"acks": "all", "linger.ms": 0}))
        producer.produce(
            self.topic,
            key=manifest.topic.encode(),
            value=manifest.dumps(),
            on_delivery=lambda err, _m: failed.append(str(err)) if err is not None else None,
        )
        if producer.flush(timeout_s):
            raise DeliveryTimeout(f"manifest of {manifest.topic} not delivered to {self.topic} within {timeout_s:g}s")
        if failed:
            raise DeliveryTimeout(f"manifest of {manifest.topic} refused by {self.topic}: {failed[0]}")


class CompactionState:
    """The Redis side: lease, status and the manifest mirror."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.r = redis
        self.prefix = prefix

    def _key(self, topic: str, what: str) -> str:
        return f"{self.prefix}:{{{topic}}}:cv:{what}"

    @property
    def index(self) -> str:
        return f"{self.prefix}:cv:topics"

    # -- the lease: at most one run per topic, whoever starts it (the job or the CLI)
    def take_lease(self, topic: str, ttl_ms: int = LEASE_TTL_MS) -> Lease:
        token = uuid.uuid4().hex
        if not self.r.set(self._key(topic, "lease"), token, nx=True, px=ttl_ms):
            raise RunInProgress(f"a compaction of {topic} is already running (lease {self._key(topic, 'lease')})")
        return Lease(self, topic, token, ttl_ms)

    def lease_holder(self, topic: str) -> str | None:
        raw = self.r.get(self._key(topic, "lease"))
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    # -- status
    def set_status(self, topic: str, status: str, **fields: Any) -> None:
        values = {"status": status, **{k: json.dumps(v) for k, v in fields.items()}}
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self._key(topic, "status"), mapping=values)
        pipe.sadd(self.index, topic)
        pipe.execute()

    def status(self, topic: str) -> dict[str, Any]:
        raw = self.r.hgetall(self._key(topic, "status"))
        out: dict[str, Any] = {}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else k
            text = v.decode() if isinstance(v, bytes) else v
            out[name] = text if name == "status" else json.loads(text)
        return out

    # -- the manifest mirror
    def mirror(self, manifest: Manifest) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self._key(manifest.topic, "manifest"), manifest.dumps())
        pipe.sadd(self.index, manifest.topic)
        pipe.execute()

    def manifest(self, topic: str) -> Manifest | None:
        raw = self.r.get(self._key(topic, "manifest"))
        return None if raw is None else Manifest.loads(raw)

    def topics(self) -> list[str]:
        return sorted(t.decode() if isinstance(t, bytes) else t for t in self.r.smembers(self.index))


class Lease:
    """A run's hold on its topic, renewed in the background; `held` turns False if it was lost (Redis wiped, or
    the run stalled past the TTL), and the run then does not publish."""

    def __init__(self, state: CompactionState, topic: str, token: str, ttl_ms: int) -> None:
        self.state, self.topic, self.token, self.ttl_ms = state, topic, token, ttl_ms
        self.held = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"compactd-lease-{topic}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        key = self.state._key(self.topic, "lease")
        while not self._stop.wait(self.ttl_ms / 4000):
            try:
                if not self.state.r.eval(RENEW_LUA, 1, key, self.token, self.ttl_ms):
                    self.held = False
                    return
            except Exception:  # Redis away: the TTL decides; `check` asks again before publishing
                continue

    def check(self) -> bool:
        """Still ours, asked of Redis now."""
        try:
            self.held = self.held and self.state.lease_holder(self.topic) == self.token
        except Exception:
            self.held = False
        return self.held

    def release(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):  # the TTL frees it
            self.state.r.eval(RELEASE_LUA, 1, self.state._key(self.topic, "lease"), self.token)
        self.held = False


def now_ms() -> int:
    return int(time.time() * 1000)
