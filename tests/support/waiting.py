"""Waiting in tests for something a running job does, with a deadline that names what did not happen."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(what: str, check: Callable[[], object], timeout_s: float, every_s: float = 0.1) -> None:
    until = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < until, what
        time.sleep(every_s)
