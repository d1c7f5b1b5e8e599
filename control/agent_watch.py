"""The admin agent as the job sees it (`offsets_source: admin`): its poll marks on the agent topic.

The agent writes a mark after each poll whose events it flushed (agent/admin_poll.py `poll_mark`). Until a mark of
this cluster exists, the commits topic may hold only part of a poll, or nothing, so the job's delete gate stays closed
(`AGENT_WAIT`); once one exists, the gate is armed on the commits topic as it stands then. A mark older than a few
poll intervals means the agent stopped: the job says so once (its facts age; every delete is still checked against
the cluster's own committed offsets first).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from compactd.kafka.config import KafkaConnection
from compactd.kafka.reader import read_to_end
from compactd.keys import mark_key

log = logging.getLogger("compactd.job")

AGENT_WAIT = "waiting for the admin agent's first complete poll"
NO_AGENT = (
    "no complete poll from the admin agent in {s:.0f} s: deletes wait for one; is `compactd agent --admin` running "
    "against this cluster with the same `cluster` ({cluster})? (offsets_source: admin)"
)
SILENT = (
    "the admin agent's last complete poll was {age:.0f} s ago (it polls every {every:.0f} s): its commits and slices "
    "are getting old; is `compactd agent --admin` still running?"
)
TAIL = 1000  # offsets read back per partition of the agent topic: the newest marks of every cluster sharing it
STALE_POLLS = 3  # intervals without a mark before the agent is called silent


class AgentWatch:
    def __init__(
        self,
        conn: KafkaConnection,
        topic: str,
        cluster: str,
        read: Callable[[], dict[str, Any] | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`read`: the newest mark of this cluster (default: the agent topic's tail)."""
        self.conn, self.topic, self.cluster = conn, topic, cluster
        self.read = read or self._read
        self.clock = clock
        self.mark: dict[str, Any] | None = None
        self.silent = False

    def _read(self) -> dict[str, Any] | None:
        key = mark_key(self.cluster).encode()
        newest: dict[str, Any] | None = None
        for k, v in read_to_end(self.conn, self.topic, timeout_s=10.0, tail=TAIL):
            if k == key and v is not None:
                try:
                    newest = json.loads(v)
                except ValueError:
                    continue
        return newest

    def refresh(self) -> bool:
        """Read the newest mark; True when this is the first one seen (the gate may be armed now)."""
        first = self.mark is None
        mark = self.read()
        if mark is not None:
            self.mark = mark
        return first and self.mark is not None

    def check_silence(self) -> None:
        """Say once that the agent stopped marking, and once that it is back."""
        if self.mark is None:
            return
        age = self.clock() - int(self.mark.get("at", 0)) / 1000
        every = max(int(self.mark.get("interval_ms", 60_000)) / 1000, 1.0)
        silent = age > STALE_POLLS * every
        if silent and not self.silent:
            log.warning(SILENT.format(age=age, every=every))
        elif self.silent and not silent:
            log.info("the admin agent polls again (poll %s)", self.mark.get("poll"))
        self.silent = silent
