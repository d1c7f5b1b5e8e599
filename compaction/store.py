"""Where a compaction's bookkeeping lives: the manifest topic (the truth), its mirror in Redis, the run lease, the
status operators poll.

The manifest topic is compacted and keyed `<topic>/<generation>/<run>`: each run's manifest is a record of its own,
and of two manifests of one generation the first on the topic is the published one (the partition's order is the
same for every reader, and compaction keeps it). A run paused past its lease that publishes late loses to the run
that published first, and knows it (`publish` reads its own generation back). Records two generations old are
deleted (tombstones). Records keyed by the bare topic (before fencing) are read as before. A Redis mirror lets the
controller read the published manifest on every tick; `ManifestLog.read` is the authority.

Redis keys (one hash tag per topic, like the rest of the per-topic state):
  <prefix>:{<topic>}:cv:lease     the run lease: JSON {token, host, pid, started, boot}, with a short TTL renewed while
                                  the run lives (a dead run on this host is seen at once: its pid is gone)
  <prefix>:{<topic>}:cv:status    hash: status, generation, started_at, error, summary (JSON of the last run)
  <prefix>:{<topic>}:cv:manifest  the published manifest (JSON)
  <prefix>:{<topic>}:cv:retention the source's retention.ms as the controller last read it, and its takeover:
                                  JSON {retention_ms, at, takeover}
  <prefix>:cv:topics              set of topics with a manifest (the controller's index)
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compactd.clock import now_ms
from compactd.compaction.manifest import Manifest
from compactd.errors import CompactdError, DeliveryTimeout
from compactd.kafka.config import KafkaConnection, new_producer

log = logging.getLogger("compactd.compaction")

MANIFEST_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1"}
LEASE_TTL_MS = 10_000
RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
RENEW_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
TAKEOVER_LUA = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) end "
    "return false"
)


class RunInProgress(CompactdError):
    """Another run holds the topic's lease."""


class ManifestLog:
    """The manifest topic: read the last manifest of a topic, write a new one (durably, before anyone trusts it)."""

    def __init__(self, conn: KafkaConnection, topic: str) -> None:
        self.conn = conn
        self.topic = topic
        # one consumer for every scan, connected on the first (a new one connects first: 0.05 s of a run that may
        # take 0.3 s) and kept until `close`; scans of concurrent runs take turns, a few ms each
        self._lock = threading.Lock()
        self._consumer: Any = None

    def close(self) -> None:
        """Close the reader (the job's stop, the command's end); a later scan connects a new one."""
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _scan(self, timeout_s: float) -> dict[str, Published]:
        from compactd.kafka.reader import read_to_end, reader

        with self._lock:
            if self._consumer is None:
                self._consumer = reader(self.conn)
            try:
                return self._parse_all(read_to_end(self.conn, self.topic, timeout_s, consumer=self._consumer))
            except Exception:  # a failed read may leave it anywhere: the next scan starts from a new one
                consumer, self._consumer = self._consumer, None
                with contextlib.suppress(Exception):
                    consumer.close()
                raise

    @staticmethod
    def _parse_all(records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[str, Published]:
        out: dict[str, Published] = {}
        for key, value in records:
            if key is None:
                continue
            name = key.decode("utf-8", errors="replace")
            if "/" not in name:  # a record of before fencing, keyed by topic: the last one is the manifest
                if value is None:
                    out.pop(name, None)
                    continue
                manifest = _parse(value)
                if manifest is not None:
                    out[name] = Published(manifest, {**out[name].keys} if name in out else {})
                continue
            if value is None:
                continue  # an old generation's record deleted: it was never the newest
            manifest = _parse(value)
            if manifest is None:
                continue
            held = out.setdefault(manifest.topic, Published(manifest, {}))
            first = held.keys.setdefault(manifest.generation, name)  # the first record of a generation wins
            if first == name and manifest.generation > held.manifest.generation:
                held.manifest = manifest
        return out

    def read_all(self, timeout_s: float = 30.0) -> dict[str, Manifest]:
        return {t: p.manifest for t, p in self._scan(timeout_s).items()}

    def read(self, topic: str, timeout_s: float = 30.0) -> Manifest | None:
        held = self._scan(timeout_s).get(topic)
        return None if held is None else held.manifest

    def write(self, manifest: Manifest, timeout_s: float = 30.0) -> None:
        """Write a manifest (a claim, generation 0, or a generation). Whether it is the published one: `publish`."""
        self._produce([(manifest_key(manifest), manifest.dumps())], manifest.topic, timeout_s)

    def publish(self, manifest: Manifest, timeout_s: float = 30.0) -> Manifest | None:
        """Write `manifest` and read its generation back: the published manifest of that generation, which is this
        one unless another run published the same generation first. Records two generations older are deleted."""
        self.write(manifest, timeout_s)
        held = self._scan(timeout_s).get(manifest.topic)
        if held is None:
            return None
        stale = [(k, None) for g, k in held.keys.items() if g < manifest.generation - 1 and "/" in k]
        if stale:
            with contextlib.suppress(DeliveryTimeout):  # left for the next publish
                self._produce(stale, manifest.topic, timeout_s)
        key = held.keys.get(manifest.generation)
        return manifest if key == manifest_key(manifest) else held.manifest

    def _produce(self, records: list[tuple[str, bytes | None]], topic: str, timeout_s: float) -> None:
        failed: list[str] = []
        producer = new_producer(self.conn.client("producer", {"acks": "all", "linger.ms": 0}))
        for key, value in records:
            producer.produce(
                self.topic,
                key=key.encode(),
                value=value,
                on_delivery=lambda err, _m: failed.append(str(err)) if err is not None else None,
            )
        if producer.flush(timeout_s):
            raise DeliveryTimeout(f"manifest of {topic} not delivered to {self.topic} within {timeout_s:g}s")
        if failed:
            raise DeliveryTimeout(f"manifest of {topic} refused by {self.topic}: {failed[0]}")


@dataclass
class Published:
    """A topic's published manifest and, per generation, the key of its first (winning) record."""

    manifest: Manifest
    keys: dict[int, str]


def manifest_key(m: Manifest) -> str:
    return f"{m.topic}/{m.generation}/{m.run or 'claim'}"


def _parse(value: bytes) -> Manifest | None:
    try:
        return Manifest.loads(value)
    except (ValueError, TypeError):
        return None  # not a manifest compactd wrote: ignored, never trusted


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
        """The topic's lease, or RunInProgress naming who holds it and until when. A holder on this host whose
        process is gone is taken over at once (a `kill -9`ed run): nothing waits for its TTL."""
        key = self._key(topic, "lease")
        holder = Holder.me()
        value = holder.dumps()
        if self.r.set(key, value, nx=True, px=ttl_ms):
            return Lease(self, topic, value, ttl_ms)
        raw, left = self.r.get(key), self.r.pttl(key)
        if raw is None:  # released meanwhile
            if self.r.set(key, value, nx=True, px=ttl_ms):
                return Lease(self, topic, value, ttl_ms)
            raw, left = self.r.get(key), self.r.pttl(key)
        other = Holder.loads(raw)
        if other is not None and other.dead_here() and self.r.eval(TAKEOVER_LUA, 1, key, raw, value, ttl_ms):
            import logging

            logging.getLogger("compactd.compaction").warning(
                "compaction of %s: took over the lease of a run that is gone (pid %d on %s)",
                topic,
                other.pid,
                other.host,
            )
            return Lease(self, topic, value, ttl_ms)
        who = "another run" if other is None else f"{other.who()}"
        until = f", lease for {max(0, int(left or 0)) / 1000:.1f} s more" if left and left > 0 else ""
        raise RunInProgress(f"a compaction of {topic} is already running: {who}{until}")

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

    def status_and_holder(self, topic: str) -> tuple[dict[str, Any], str | None]:
        """The topic's status and its lease's holder, read at one instant (MULTI: both keys share the topic's slot).
        Read one after the other, a run that wrote SUCCESS and released its lease between the two reads showed as
        RUNNING without a holder, which `status` reports as a run that died (seen once in `make test`)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(self._key(topic, "status"))
        pipe.get(self._key(topic, "lease"))
        raw, holder = pipe.execute()
        return self._status(raw), None if holder is None else holder.decode() if isinstance(holder, bytes) else holder

    def status(self, topic: str) -> dict[str, Any]:
        return self._status(self.r.hgetall(self._key(topic, "status")))

    @staticmethod
    def _status(raw: Mapping[Any, Any]) -> dict[str, Any]:
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

    # -- the source's retention, as the controller read it (for `explain`, which reads Redis only)
    def set_retention(
        self, topic: str, retention_ms: int | None, at: int, takeover: dict[str, Any] | None = None
    ) -> None:
        value = {"retention_ms": retention_ms, "at": at, "takeover": takeover}
        self.r.set(self._key(topic, "retention"), json.dumps(value))

    def retention(self, topic: str) -> dict[str, Any] | None:
        """{"retention_ms": int | None, "at": epoch ms, "takeover": the takeover in force or None} (None: never
        read)."""
        raw = self.r.get(self._key(topic, "retention"))
        return None if raw is None else json.loads(raw)

    def topics(self) -> list[str]:
        return sorted(t.decode() if isinstance(t, bytes) else t for t in self.r.smembers(self.index))


def _boot_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc): a pid reused by another process differs."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: the token is unique per run; host, pid and boot say whether its process still exists."""

    token: str
    host: str
    pid: int
    started: int
    boot: str | None
    user: str = ""

    @classmethod
    def me(cls) -> Holder:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
            user = str(os.getuid())
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid(), now_ms(), _boot_time(os.getpid()), user)

    def dumps(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, raw: bytes | str | None) -> Holder | None:
        try:
            return cls(**json.loads(raw)) if raw is not None else None
        except (ValueError, TypeError):
            return None  # a lease of before this format: a plain token

    def dead_here(self) -> bool:
        """Its process was on this host and is gone (or its pid now belongs to another process)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return self.boot is not None and _boot_time(self.pid) != self.boot

    def who(self) -> str:
        started = time.strftime("%H:%M:%S", time.gmtime(self.started / 1000))
        return f"pid {self.pid} on {self.host} since {started} UTC"


class Lease:
    """A run's hold on its topic, renewed every quarter of its TTL; `held` turns False when it is lost (Redis wiped,
    the run stalled past the TTL, or a renewal failed), and the run then stops at its next step, never publishing."""

    def __init__(self, state: CompactionState, topic: str, token: str, ttl_ms: int) -> None:
        self.state, self.topic, self.token, self.ttl_ms = state, topic, token, ttl_ms
        holder = Holder.loads(token)
        self.run = holder.token if holder is not None else token  # what the manifest records
        self.holder = holder
        self.held = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"compactd-lease-{topic}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        key = self.state._key(self.topic, "lease")
        while not self._stop.wait(self.ttl_ms / 4000):
            try:
                renewed = self.state.r.eval(RENEW_LUA, 1, key, self.token, self.ttl_ms)
            except Exception:  # Redis away: the lease may expire and another run start; this one stops
                renewed = False
            if not renewed:
                self.held = False
                return

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
