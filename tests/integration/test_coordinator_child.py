"""Requests to a group's coordinator go out from a process of their own (kafka/coordinator.py): librdkafka 2.16 kills
the process whose Admin client sends one while the coordinator moves, by SIGSEGV (an OffsetFetch answered
NOT_COORDINATOR, librdkafka#5040) or by SIGABRT (a failed send, librdkafka#4605)."""

from __future__ import annotations

import sys
import time

import pytest
from confluent_kafka import Consumer

from compactd.kafka.coordinator import CoordinatorChild, CoordinatorChildDied
from compactd.kafka.groups import ClusterGroupOffsets, GroupReader
from tests.support.fixtures import Cluster
from tests.support.groups import consume_and_commit


def crashing(signal_name: str, call: str = "") -> list[str]:
    """A child dying of `signal_name` on its first request (`call`: only on a request of that call)."""
    return [sys.executable, "-m", "tests.support.crashing_child", signal_name] + ([call] if call else [])


def assigned_member(cluster: Cluster, group: str, topic: str) -> Consumer:
    """A live member of `group`, subscribed to `topic` and assigned it (the caller closes it)."""
    member = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    member.subscribe([topic])
    deadline = time.monotonic() + 60
    while not member.assignment():
        assert time.monotonic() < deadline, f"{group} was never assigned {topic}"
        member.poll(0.2)
    return member


def test_the_child_reads_what_the_groups_committed(cluster: Cluster) -> None:
    data = cluster.name("data")
    cluster.create(data, 2)
    cluster.fill(data, 30, partition=0)
    group, idle = cluster.name("billing"), cluster.name("idle")
    consume_and_commit(cluster.bootstrap, group, data, 20)
    reader = GroupReader(cluster.conn, timeout_s=10)
    try:
        got = reader.fetch([group, idle])
        assert got == {group: {(data, 0): 20}, idle: {}}
        assert reader.fetch([group]) == {group: {(data, 0): 20}} and reader.coordinator.started == 1  # one child
    finally:
        reader.close()


def test_a_connection_with_a_callback_reaches_the_child_without_it(cluster: Cluster) -> None:
    """A caller's librdkafka callback (bench/admin_poll.py counts requests with `stats_cb`) stays in this process:
    the settings the child gets are data (before: TypeError, the method not JSON serializable, on the first fetch)."""
    from compactd.kafka.config import KafkaConnection

    data, group = cluster.name("data"), cluster.name("billing")
    cluster.create(data, 1)
    cluster.fill(data, 10)
    consume_and_commit(cluster.bootstrap, group, data, 10)
    seen: list[str] = []
    conn = KafkaConnection(cluster.bootstrap, {"statistics.interval.ms": 100, "stats_cb": seen.append})
    reader = GroupReader(conn, timeout_s=10)
    try:
        assert reader.fetch([group]) == {group: {(data, 0): 10}}
    finally:
        reader.close()


def test_the_child_describes_what_a_live_member_is_assigned(cluster: Cluster) -> None:
    data, other = cluster.name("data"), cluster.name("other")
    cluster.create(data, 1)
    cluster.create(other, 1)
    group, idle = cluster.name("live"), cluster.name("idle")
    member = assigned_member(cluster, group, data)
    reader = GroupReader(cluster.conn, timeout_s=10)
    try:
        got = reader.assignments([group, idle])
        assert got == {group: frozenset({data}), idle: frozenset()}, got
        assert reader.coordinator.started == 1 and reader.describes == 2
    finally:
        member.close()
        reader.close()


@pytest.mark.parametrize(
    ("signal_name", "known"),
    [
        ("SIGSEGV", "librdkafka#5040: an OffsetFetch answered NOT_COORDINATOR"),
        ("SIGABRT", "librdkafka#4605: a coordinator request's send failed while its coordinator moved"),
    ],
)
def test_a_child_that_dies_fails_only_its_request_and_the_next_one_starts_another(
    cluster: Cluster, signal_name: str, known: str
) -> None:
    data = cluster.name("data")
    cluster.create(data, 1)
    cluster.fill(data, 10)
    group = cluster.name("billing")
    consume_and_commit(cluster.bootstrap, group, data, 7)
    child = CoordinatorChild(cluster.conn, timeout_s=10, command=crashing(signal_name))
    try:
        [(name, failed)] = child.offsets([group]).items()
        assert name == group and isinstance(failed, CoordinatorChildDied)
        assert str(failed) == f"the coordinator-request process died of {signal_name} ({known})"
        [(name, failed)] = child.assignments([group]).items()  # a second crashing child, started for this request
        assert name == group and isinstance(failed, CoordinatorChildDied) and child.started == 2
        child.command = CoordinatorChild(cluster.conn).command  # the real child from here on
        assert child.offsets([group]) == {group: {(data, 0): 7}} and child.started == 3
        assert child.assignments([group]) == {group: frozenset()}  # the group has no member now
    finally:
        child.close()


def test_a_group_whose_describe_died_counts_as_assigned_on_every_topic(cluster: Cluster) -> None:
    """The job's process lives through the death, and what it did not learn holds: a group with members that could
    not be described may be assigned anything, so the check names it as assigned on a topic it does not read."""
    data, other = cluster.name("data"), cluster.name("other")
    cluster.create(data, 1)
    cluster.create(other, 1)
    group = cluster.name("live")
    member = assigned_member(cluster, group, data)
    offsets = ClusterGroupOffsets(cluster.conn, ttl_s=0.0, timeout_s=10)
    try:
        offsets.reader.coordinator.command = crashing("SIGABRT", "assignments")
        assert group in offsets.check(other).assigned
        offsets.reader.coordinator.command = CoordinatorChild(cluster.conn).command
        assert group not in offsets.check(other).assigned  # described: its member reads `data` only
        assert group in offsets.check(data).assigned
    finally:
        member.close()
        offsets.close()
