"""The connection every part of the Redis state shares: the client (made on first use), the Lua scripts, startup
checks and key helpers. `RedisState` (`redis_store`) is this base plus one mixin per kind of data stored."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any, Self

import redis

from compactd.errors import DependencyUnavailable
from compactd.state.keys import RedisKeys

if TYPE_CHECKING:
    from collections.abc import Sequence

    from compactd.model import ActionRecord

MAX_SAFE_INT = 2**53  # Lua and zset scores are doubles: integers above this lose digits
# the scripts in lua/ (offsets.lua, part.lua, counted.lua and replicas.lua are included by them, not run)
SCRIPTS = (
    "merge",
    "recount",
    "explain",
    "explain_rank",
    "in_flight",
    "views",
    "live_records",
    "schedule",
    "layout",
    "reset",
)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _safe_url(url: str) -> str:
    """The URL without its password, for error lines."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url) if url else "(client given)"


class StoreBase:
    """The client, the scripts and the key names; the mixins of `RedisState` build on it."""

    def __init__(
        self, client: redis.Redis | Callable[[], Any], prefix: str = "cd", url: str = "", cluster: bool = False
    ) -> None:
        """`client`: a redis-py client, or a function making one on first use (a cluster client connects as it is
        made, and constructors here only configure)."""
        self._client: Any = None if callable(client) else client
        self._make_client: Callable[[], Any] | None = client if callable(client) else None
        self.prefix = prefix
        self.url = url
        self.cluster = cluster
        self.keys = RedisKeys(prefix)
        lua = resources.files(__package__ or "compactd.state").joinpath("lua")

        def source(name: str) -> str:
            """A script with its `--! include <file>` lines replaced by the files (shared Lua functions)."""
            return re.sub(
                r"--! include (\S+)\n", lambda m: lua.joinpath(m.group(1)).read_text(), lua.joinpath(name).read_text()
            )

        self._lua = {name: source(f"{name}.lua") for name in SCRIPTS}
        self._scripts: dict[str, Any] = {}
        self.k_deadlines = self.keys.deadlines
        self.k_rec = self.keys.records
        self.k_outbox = self.keys.outbox
        self.k_last = self.keys.last
        self.k_nudge = self.keys.nudge
        self.k_topics = self.keys.topics

    @property
    def r(self) -> Any:
        if self._client is None:
            assert self._make_client is not None
            self._client = self._make_client()
        return self._client

    def _script(self, name: str) -> Any:
        """A Lua script bound to the client (EVALSHA, loaded on first use, per node in a cluster)."""
        if name not in self._scripts:
            self._scripts[name] = self.r.register_script(self._lua[name])
        return self._scripts[name]

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "cd",
        timeout_s: float = 5.0,
        password: str | None = None,
        cluster: bool = False,
    ) -> Self:
        """Configure only: the client connects on first use (see `start`). `password` beats the URL's.

        `cluster`: `url` names any node of a Redis Cluster; the client discovers the others and routes each key to
        its slot. Every multi-key operation compactd makes stays within one hash tag (one slot).
        """
        extra: dict[str, Any] = {"socket_connect_timeout": timeout_s, "socket_timeout": max(timeout_s, 30.0)}
        if password is not None:
            extra["password"] = password
        if cluster:
            from redis.cluster import RedisCluster

            return cls(lambda: RedisCluster.from_url(url, **extra), prefix, url, cluster=True)
        return cls(redis.Redis.from_url(url, **extra), prefix, url)

    def start(self) -> None:
        """Connect and check the server answers: DependencyUnavailable names the setting to change. Then move any
        topic's state written by an earlier layout (`upgrade`)."""
        try:
            self.r.ping()
            self.upgrade()
            for key in self.keys.retired:
                self.r.unlink(key)
        except redis.exceptions.RedisClusterException as exc:
            raise DependencyUnavailable(
                "Redis Cluster", _safe_url(self.url), "--redis-url / redis_url (and redis_cluster)", str(exc)[:200]
            ) from None
        except redis.AuthenticationError as exc:
            raise DependencyUnavailable(
                "Redis", _safe_url(self.url), "--redis-url / redis_url (or redis_password)", str(exc)
            ) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            cause = str(exc).split(". ")[0] if str(exc) else type(exc).__name__
            raise DependencyUnavailable("Redis", _safe_url(self.url), "--redis-url / redis_url", cause) from None

    def upgrade(self) -> int:
        """Move partition state written before the packed layout (lua/layout.lua), topic by topic; a marker per topic
        makes this one cheap call per topic once done. Returns how many partitions were moved."""
        script = self._script("layout")
        return sum(int(script(keys=[self.topic_base(t)])) for t in self.topics())

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def size(self) -> tuple[int, int]:
        """(keys in the database, Redis used_memory bytes), for the state-size gauges; summed over a cluster."""
        where = {"target_nodes": "primaries"} if self.cluster else {}
        keys = self.r.dbsize(**where)
        info = self.r.info("memory", **where)
        if isinstance(keys, dict):
            keys = sum(keys.values())
        if "used_memory" in info:
            return int(keys), int(info["used_memory"])
        return int(keys), sum(int(node.get("used_memory", 0)) for node in info.values() if isinstance(node, dict))

    def topic_base(self, topic: str) -> str:
        return self.keys.topic_base(topic)

    def _delete(self, keys: list[Any]) -> int:
        if self.cluster:  # keys of different slots: one DEL each, pipelined per node by the client
            pipe = self.r.pipeline(transaction=False)
            for key in keys:
                pipe.delete(key)
            return sum(int(x) for x in pipe.execute())
        return int(self.r.delete(*keys))

    if TYPE_CHECKING:  # defined by mixins (read_store, outbox_store), called from others

        def topics(self) -> list[str]: ...

        def partitions(self, topic: str) -> list[int]: ...

        def live_records(self, topic: str, partitions: Sequence[int]) -> dict[int, list[ActionRecord]]: ...
