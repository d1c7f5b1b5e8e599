"""Waiting in tests for something a running job or the broker does, with a deadline: a failure names what did not
happen and what was seen last, so a slow machine's failure tells a late answer from a wrong one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _never(_exc: Exception) -> bool:
    return False


def wait_until(
    what: str,
    observe: Callable[[], T],
    ok: Callable[[T], object] = bool,
    timeout_s: float = 60.0,
    every_s: float = 0.1,
    *,
    tolerate: Callable[[Exception], bool] = _never,
) -> T:
    """`observe()` again until `ok` accepts what it returns, which is returned. An exception `tolerate` accepts is an
    answer not there yet (a partition without a leader), asked again; the deadline only bounds a failure, whose
    message says what was last seen (or raised)."""
    until = time.monotonic() + timeout_s
    last: object = "nothing (never asked)"
    while True:
        try:
            seen = observe()
        except Exception as exc:
            if not tolerate(exc):
                raise
            last = f"raised {exc!r}"
        else:
            if ok(seen):
                return seen
            last = seen
        if time.monotonic() >= until:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last seen: {last!r}")
        time.sleep(every_s)


def wait_for(
    what: str,
    check: Callable[[], object],
    timeout_s: float = 60.0,
    every_s: float = 0.1,
    *,
    last: Callable[[], object] | None = None,
    tolerate: Callable[[Exception], bool] = _never,
) -> object:
    """`check()` again until it is truthy (returned). A check that answers only yes or no can name what it looked at
    through `last`, read once at the deadline for the failure's message."""
    try:
        return wait_until(what, check, bool, timeout_s, every_s, tolerate=tolerate)
    except AssertionError as exc:
        if last is None:
            raise
        raise AssertionError(f"{exc}; then: {last()!r}") from None


def holds_for(
    what: str, observe: Callable[[], T], ok: Callable[[T], object], window_s: float, every_s: float = 0.2
) -> T:
    """That something does NOT happen: `observe()` over `window_s` seconds, each answer `ok` must accept (the last is
    returned). A negative check, never a wait for an answer: a slow machine only does less in the window, so it
    cannot fail for the machine's speed; the failure names what changed and when."""
    start = time.monotonic()
    while True:
        seen = observe()
        if not ok(seen):
            raise AssertionError(f"{what}: after {time.monotonic() - start:.1f} s, saw {seen!r}")
        if time.monotonic() - start >= window_s:
            return seen
        time.sleep(every_s)
