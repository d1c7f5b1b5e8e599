"""The admin agent as the job sees it: its first complete poll arms the gate, a silent agent is said once."""

from __future__ import annotations

import logging

import pytest

from compactd.agent.admin_poll import poll_mark
from compactd.control.agent_watch import AgentWatch
from compactd.kafka.config import KafkaConnection


def test_the_first_mark_is_told_once_and_a_silent_agent_once_until_it_polls_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    marks: list[dict | None] = [None]
    now = [1_000.0]
    watch = AgentWatch(
        KafkaConnection("unused:1"), "compactd.agent", "prod", read=lambda: marks[-1], clock=lambda: now[0]
    )
    assert watch.refresh() is False and watch.mark is None  # no complete poll yet: the gate stays waiting
    marks.append(poll_mark("prod", 1, 1_000_000, 10_000, groups=3, partitions=12))
    assert watch.refresh() is True  # the first: arm the gate now
    marks.append(poll_mark("prod", 2, 1_010_000, 10_000, groups=3, partitions=12))
    assert watch.refresh() is False and watch.mark is not None and watch.mark["poll"] == 2
    marks.append(None)  # a read that finds nothing keeps the last mark seen
    assert watch.refresh() is False and watch.mark["poll"] == 2

    caplog.set_level(logging.INFO, "compactd.job")
    now[0] = 1_010.0 + 25  # 2.5 intervals: not yet silent
    watch.check_silence()
    now[0] = 1_010.0 + 31
    watch.check_silence()
    watch.check_silence()
    silent = [r.getMessage() for r in caplog.records if "last complete poll" in r.getMessage()]
    assert len(silent) == 1 and "31 s ago" in silent[0] and "every 10 s" in silent[0]
    marks.append(poll_mark("prod", 3, 1_041_000, 10_000, groups=3, partitions=12))
    watch.refresh()
    watch.check_silence()
    assert any("polls again (poll 3)" in r.getMessage() for r in caplog.records)
