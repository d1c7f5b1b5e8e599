"""Riding out an outage of a dependency (Redis; Kafka on the batch path): the failing step waits and is tried again,
with one log line when it starts and one when it ends — never a traceback per batch, never an exit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis import exceptions as rx

log = logging.getLogger("compactd.state")

T = TypeVar("T")

# Errors that mean "Redis is not answering now" (down, loading its data, failing over), not "this call is wrong".
REDIS_DOWN: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    rx.ClusterDownError,
    rx.TryAgainError,
    rx.ReadOnlyError,
    rx.RedisClusterException,
)


class Outage:
    """Tracks whether a dependency is down, for every caller of one process (batches and the deadline ticker): the
    errors in `errors` mean "not answering now", anything else passes through."""

    def __init__(
        self,
        name: str,
        errors: tuple[type[BaseException], ...],
        max_backoff_s: float = 10.0,
        on_change: Callable[[bool], None] | None = None,
        down: str = "unreachable",
    ) -> None:
        self.name = name
        self.errors = errors
        self.down = down
        self.max_backoff_s = max_backoff_s
        self.on_change = on_change or (lambda down: None)
        self.down_since: float | None = None
        self.outages = 0

    def failed(self, exc: BaseException, what: str) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.outages += 1
            cause = (str(exc).splitlines() or [type(exc).__name__])[0] or type(exc).__name__
            log.warning("%s %s (%s): %s, retrying with backoff until it answers", self.name, self.down, cause, what)
            self.on_change(True)

    def answered(self, started: float | None = None) -> None:
        """A step the dependency answered. One that began before the outage was seen (`started`, monotonic) says
        nothing of now: its calls may all have been answered before it went (a batch's merge finishing while the
        ticker meets the dead server), and the outage would be announced twice."""
        if self.down_since is not None and (started is None or started >= self.down_since):
            log.info("%s answers again after %.1fs", self.name, time.monotonic() - self.down_since)
            self.down_since = None
            self.on_change(False)

    def retry(
        self,
        step: Callable[[], T],
        what: str,
        give_up: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], object] = time.sleep,
    ) -> T:
        """Run `step` until the dependency answers it; steps must be safe to repeat (merges are idempotent per batch
        id). `give_up()` true (a forced stop) re-raises the last error instead of waiting on."""
        delay = 0.2
        while True:
            started = time.monotonic()
            try:
                result = step()
            except self.errors as exc:
                self.failed(exc, what)
                if give_up():
                    raise
                sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
                continue
            self.answered(started)
            return result


class RedisOutage(Outage):
    """Redis, for every caller of one process."""

    def __init__(self, max_backoff_s: float = 10.0, on_change: Callable[[bool], None] | None = None) -> None:
        super().__init__("Redis", REDIS_DOWN, max_backoff_s, on_change)
