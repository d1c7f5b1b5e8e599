"""One outage, one line when it starts and one when it ends, whichever of the batch and the deadline ticker meets it:
a step that began before the outage was seen does not end it (a make test-slow run logged "Redis unreachable" twice for
one kill of Redis: a batch's merge finished a moment after the ticker had met the dead server)."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from compactd.state.outage import RedisOutage


def test_a_step_begun_before_the_outage_does_not_end_it(caplog: pytest.LogCaptureFixture) -> None:
    outage = RedisOutage()
    with caplog.at_level(logging.INFO, logger="compactd.state"):
        batch_started = time.monotonic()  # a batch's merge, under way
        outage.failed(redis.ConnectionError("Connection refused"), "deadline ticks wait")  # the ticker meets the kill
        outage.answered(batch_started)  # the merge's calls were answered before Redis went
        assert outage.down_since is not None
        outage.failed(redis.ConnectionError("Connection refused"), "deadline ticks wait")  # still down: no new line
        outage.answered(time.monotonic())  # a step begun after: Redis is back
        assert outage.down_since is None
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis unreachable" in line for line in lines) == 1, lines
    assert sum("Redis answers again" in line for line in lines) == 1, lines
    assert outage.outages == 1


def test_retry_ends_the_outage_with_the_step_that_began_after_it() -> None:
    outage, calls = RedisOutage(), []

    def step() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise redis.ConnectionError("Connection refused")
        return "merged"

    assert outage.retry(step, "merge waits", sleep=lambda s: None) == "merged"
    assert outage.down_since is None and outage.outages == 1 and len(calls) == 3
