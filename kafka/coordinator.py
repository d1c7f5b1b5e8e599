"""Admin requests sent to a group's coordinator, in a process of their own, so that librdkafka cannot take compactd
down.

librdkafka 2.16 (confluent-kafka 2.16.1, the newest on PyPI) has two ways to kill the process whose Admin client sends
a request to a group coordinator while that coordinator moves (a broker killed or restarted, a preferred-leader
election, a reassignment):
- an OffsetFetch (ListConsumerGroupOffsets) answered NOT_COORDINATOR dereferences a null pointer: SIGSEGV
  (librdkafka#5040; seen here in a 3-node test, core dump in `rd_kafka_cgrp_op` from
  `rd_kafka_ListConsumerGroupOffsetsResponse_parse`);
- any coordinator request (ListConsumerGroupOffsets, DescribeConsumerGroups) whose send fails on a dropped connection
  frees the request's `eonce` while the coordinator state machine still uses it: `rd_kafka_enq_once_del_source_return:
  Assertion 'eonce->refcnt > 0' failed`, SIGABRT (librdkafka#4605, fix PR 5397 unreleased; it aborted compactd's job
  in the rolling-restart soak test, through DescribeConsumerGroups).
The job's check before every consumed-retention delete and the admin agent's polls send both.

`CoordinatorChild` sends them from a child (`python -m compactd.kafka.coordinator`), one JSON line per request and
per answer over its stdin and stdout. A child that dies, or does not answer in time, fails the groups of that request
with one line saying so (the reader then holds what they hold, as for any group that cannot be read), and the next
request starts a new child. The child exits when its stdin closes: it never outlives the process that started it.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from compactd.kafka.config import KafkaConnection
from compactd.model import PartitionOffsets

log = logging.getLogger(__name__)

# what a child's death by these signals is known to come from
KNOWN_DEATHS = {
    signal.SIGSEGV: " (librdkafka#5040: an OffsetFetch answered NOT_COORDINATOR)",
    signal.SIGABRT: " (librdkafka#4605: a coordinator request's send failed while its coordinator moved)",
}
START_S = 30.0  # a child's start (the interpreter and confluent_kafka) on a loaded machine, beyond the reads' timeout


class Committed(dict[tuple[str, int], int]):
    """A group's committed offsets, (topic, partition) -> offset, with each commit's leader epoch beside in `epochs`
    (KIP-320: the epoch of the last record the group had read; -1 where the committer gave none, as Spark and
    clients that commit an offset of their own choosing do). The epoch tells whether the records below the commit
    are still the ones the group read (policy/identity.py `commit_outlived`)."""

    def __init__(
        self, offsets: PartitionOffsets | None = None, epochs: dict[tuple[str, int], int] | None = None
    ) -> None:
        super().__init__(offsets or {})
        self.epochs: dict[tuple[str, int], int] = epochs or {}


class CoordinatorChildDied(RuntimeError):
    """The child sending coordinator requests died or stopped answering; the groups it was asked about are unknown."""


class CoordinatorChild:
    """Coordinator requests (OffsetFetch, DescribeGroups) through a child process; the module's docstring says why.
    Thread-safe: one request at a time."""

    def __init__(self, conn: KafkaConnection, timeout_s: float = 10.0, command: list[str] | None = None) -> None:
        """`command`: the child's command line (a test gives one that dies)."""
        self.conn = conn
        self.timeout_s = timeout_s
        self.command = command or [sys.executable, "-m", "compactd.kafka.coordinator"]
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.started = 0  # children started (a test reads it)

    def offsets(self, groups: list[str]) -> dict[str, PartitionOffsets | Exception]:
        """Each group's committed offsets (partitions with none left out), or the error its OffsetFetch met."""
        out: dict[str, PartitionOffsets | Exception] = {}
        for group, got in self._call("offsets", groups).items():
            if isinstance(got, Exception):
                out[group] = got
            else:
                rows = got["offsets"]
                out[group] = Committed({(t, p): o for t, p, o, _ in rows}, {(t, p): e for t, p, _, e in rows})
        return out

    def assignments(self, groups: list[str]) -> dict[str, frozenset[str] | Exception]:
        """The topics each group's members are assigned now (DescribeGroups / ConsumerGroupDescribe), or the error
        that group's describe met."""
        return {
            group: got if isinstance(got, Exception) else frozenset(got["topics"])
            for group, got in self._call("assignments", groups).items()
        }

    def _call(self, call: str, groups: list[str]) -> dict[str, dict[str, Any] | Exception]:
        if not groups:
            return {}
        with self._lock:
            try:
                answer = self._ask({"call": call, "groups": groups, "timeout_s": self.timeout_s})
            except CoordinatorChildDied as exc:
                self._stop()
                return dict.fromkeys(groups, exc)
        out: dict[str, dict[str, Any] | Exception] = {}
        for group in groups:
            got = answer.get(group, {"error": "no answer for the group"})
            out[group] = KafkaReadError(got["error"]) if "error" in got else got
        return out

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        fresh = self._child is None or self._child.poll() is not None
        child = self._start() if fresh else self._child
        assert child is not None and child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(json.dumps(request).encode() + b"\n")
            child.stdin.flush()
        except OSError:
            raise CoordinatorChildDied(self._death(child)) from None
        deadline = time.monotonic() + 2 * self.timeout_s + (START_S if fresh else 0)
        line = b""
        fd = child.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise CoordinatorChildDied(
                    f"the coordinator-request process did not answer within {2 * self.timeout_s:g} s"
                )
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise CoordinatorChildDied(self._death(child))
            line += chunk
        return json.loads(line)

    def _start(self) -> subprocess.Popen[bytes]:
        self._stop()
        # what crosses to the child is data: a callback (the logger, a caller's stats_cb) stays in this process
        conf = {k: v for k, v in self.conn.client("admin").items() if k != "logger" and not callable(v)}
        child = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert child.stdin is not None
        child.stdin.write(json.dumps(conf).encode() + b"\n")  # the settings (secrets included) never reach argv
        child.stdin.flush()
        self._child = child
        self.started += 1
        return child

    def _death(self, child: subprocess.Popen[bytes]) -> str:
        try:
            code = child.wait(5)
        except subprocess.TimeoutExpired:
            return "the coordinator-request process stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            return f"the coordinator-request process died of {name}{KNOWN_DEATHS.get(-code, '')}"
        return f"the coordinator-request process exited with {code}"

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
        if child.poll() is None:
            child.kill()
        child.wait(5)

    def close(self) -> None:
        """The child goes; the next request starts another, whose client learns the coordinators afresh."""
        with self._lock:
            self._stop()


class KafkaReadError(RuntimeError):
    """A group's request failed in the child; the message is librdkafka's."""


def error_text(exc: Exception) -> str:
    """librdkafka's own words for a failed group read, in the child and in kafka/groups.py alike."""
    from confluent_kafka import KafkaException

    cause = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    text = cause.str() if hasattr(cause, "str") else str(cause)
    return text or f"{type(exc).__name__}: no answer in time"  # a future's TimeoutError says nothing itself


def _serve() -> None:
    """The child: the first line is the client's settings, each next line a request; one answer line each."""
    from compactd.kafka.config import new_admin

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    conf = json.loads(stdin.readline() or "{}")
    admin = new_admin({**conf, "log_level": 0})  # its errors come back in the answers
    for line in stdin:
        request = json.loads(line)
        answer = CALLS[request["call"]](admin, request["groups"], float(request["timeout_s"]))
        stdout.write(json.dumps(answer).encode() + b"\n")
        stdout.flush()


def _offsets(admin: Any, groups: list[str], timeout_s: float) -> dict[str, Any]:
    """One ListConsumerGroupOffsets per group (librdkafka asks one group per request), all in flight at once."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

    futures = [
        (g, fut)
        for g in groups
        for fut in admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g)], request_timeout=timeout_s
        ).values()
    ]
    answer: dict[str, Any] = {}
    for group, fut in futures:
        try:
            result = fut.result(timeout_s)
            offsets = []
            for tp in result.topic_partitions:
                if tp.error is not None:
                    raise KafkaException(tp.error)
                if tp.offset >= 0:  # -1001: no committed offset on that partition
                    epoch = tp.leader_epoch if tp.leader_epoch is not None and tp.leader_epoch >= 0 else -1
                    offsets.append([tp.topic, tp.partition, tp.offset, epoch])
            answer[group] = {"offsets": offsets}
        except Exception as exc:
            answer[group] = {"error": error_text(exc)}
    return answer


def _assignments(admin: Any, groups: list[str], timeout_s: float) -> dict[str, Any]:
    """One DescribeConsumerGroups for them all (librdkafka sends one request per coordinator)."""
    answer: dict[str, Any] = {}
    for group, fut in admin.describe_consumer_groups(groups, request_timeout=timeout_s).items():
        try:
            desc = fut.result(timeout_s)
            topics = {tp.topic for m in desc.members for tp in (m.assignment.topic_partitions if m.assignment else [])}
            answer[group] = {"topics": sorted(topics)}
        except Exception as exc:
            answer[group] = {"error": error_text(exc)}
    return answer


# what the child serves, by a request's "call"
CALLS: dict[str, Callable[[Any, list[str], float], dict[str, Any]]] = {"offsets": _offsets, "assignments": _assignments}

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the job's process group: the job stops it
    _serve()
