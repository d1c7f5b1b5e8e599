"""Group offsets are read in a process of their own (kafka/offset_fetch.py): librdkafka 2.16 crashes the process
whose Admin OffsetFetch is answered NOT_COORDINATOR (librdkafka#5040), which a coordinator moving causes."""

from __future__ import annotations

import sys

from compactd.kafka.groups import GroupReader
from compactd.kafka.offset_fetch import FetchProcessDied, OffsetFetcher
from tests.support.fixtures import Cluster
from tests.support.groups import consume_and_commit

CRASHING = [sys.executable, "-m", "tests.support.crashing_fetch"]


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
        assert reader.fetch([group]) == {group: {(data, 0): 20}} and reader.offsets.started == 1  # one child
    finally:
        reader.close()


def test_a_child_that_dies_fails_only_its_request_and_the_next_one_starts_another(cluster: Cluster) -> None:
    data = cluster.name("data")
    cluster.create(data, 1)
    cluster.fill(data, 10)
    group = cluster.name("billing")
    consume_and_commit(cluster.bootstrap, group, data, 7)
    fetcher = OffsetFetcher(cluster.conn, timeout_s=10, command=CRASHING)
    try:
        [(name, failed)] = fetcher.fetch([group]).items()
        assert name == group and isinstance(failed, FetchProcessDied)
        assert str(failed) == (
            "the offset-fetch process died of SIGSEGV (librdkafka#5040: an OffsetFetch answered NOT_COORDINATOR)"
        )
        fetcher.command = OffsetFetcher(cluster.conn).command  # the real child from here on
        assert fetcher.fetch([group]) == {group: {(data, 0): 7}} and fetcher.started == 2
    finally:
        fetcher.close()
