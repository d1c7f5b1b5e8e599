"""Redis calls run beside the planning that needs them: one worker thread, in the order they were asked for.

An evaluation used to take turns with Redis: read a chunk, plan it, store its deadlines, read the next. With two cores
and Redis in its own process, one waited while the other worked (at a million partitions, 6 s of Redis
and 2.5 s of Python, one after the other). Here the next chunks' reads are asked for before this one is planned and the
deadlines are stored behind them, so Redis works while Python plans. One thread keeps the calls in order: a read
never overtakes an earlier write. `settled()` waits for every call, so nothing is still writing when an evaluation
returns or raises.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

R = TypeVar("R")


class IoAhead:
    def __init__(self, depth: int = 2) -> None:
        """`depth`: how many reads are asked for before the first result is taken."""
        self.depth = depth
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[Any]] = deque()

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run `fn(*args)` after every call submitted before it."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compactd-redis")
        future = self._pool.submit(fn, *args)
        self._pending.append(future)
        return future

    def ahead(self, fn: Callable[..., R], calls: Sequence[tuple[Any, ...]]) -> Iterator[R]:
        """`fn(*args)` for each `args` in `calls`, as an iterator of results in order: the first `depth` calls are
        asked for now, each later one when the result `depth` places before it is taken."""
        asked: deque[Future[R]] = deque(self.submit(fn, *args) for args in calls[: self.depth])
        rest = iter(calls[self.depth :])

        def results() -> Iterator[R]:
            while asked:
                first = asked.popleft()
                nxt = next(rest, None)
                if nxt is not None:
                    asked.append(self.submit(fn, *nxt))
                yield first.result()

        return results()

    @contextmanager
    def settled(self) -> Iterator[None]:
        """Wait for every call when the block ends; raise the first call's failure if the block itself did not."""
        try:
            yield
        except BaseException:
            self._wait()
            raise
        failure = self._wait()
        if failure is not None:
            raise failure

    def _wait(self) -> BaseException | None:
        failure = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except BaseException as exc:  # every call waited for first: none is still running when this returns
                failure = failure or exc
        return failure

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
