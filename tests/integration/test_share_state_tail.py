"""The `__share_group_state` tail (kafka/share_state.py) on a real Apache Kafka 4.4 whose share coordinator prunes its
topic every half second (as it does every 5 minutes by default) and snapshots every update, with ACLs enforced:
a tail that falls behind the prune re-reads from the start."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from compactd.demo.broker import KafkaBroker
from compactd.kafka.config import KafkaConnection
from compactd.kafka.share_state import STATE_TOPIC, ShareStateTail
from tests.support.fixtures import Cluster
from tests.support.groups import share_acknowledge
from tests.support.waiting import wait_for

PASSWORD = "tail-secret"
USER = "User:tail"
PRUNING = {
    "share.coordinator.state.topic.prune.interval.ms": "500",
    "share.coordinator.snapshot.update.records.per.snapshot": "0",  # every write a snapshot: all below it prunable
}


@pytest.fixture(scope="module")
def pruning(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("pruning-kafka"), users={"tail": PASSWORD}, extra=PRUNING)
    yield broker
    broker.stop()


def grant(admin, topic: str, *ops: AclOperation) -> None:
    bindings = [
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, USER, "*", op, AclPermissionType.ALLOW)
        for op in ops
    ]
    for fut in admin.create_acls(bindings).values():
        fut.result(30)


def state_partition(cluster: Cluster, group: str, topic: str) -> int:
    """The `__share_group_state` partition that holds `group`'s state on `topic` (the only one that grew)."""
    for p in range(5):
        if cluster.watermarks(STATE_TOPIC, p)[1] > 0:
            return p
    raise AssertionError(f"no share state for {group} on {topic}")


def test_a_tail_that_falls_behind_the_prune_reads_again_from_the_start(pruning, caplog) -> None:
    """The share coordinator deletes the records of `__share_group_state` below its latest snapshots. A tail whose
    next fetch is below the new log start must read that partition again from its start: at the end it would skip
    the snapshots in between (before the fix: librdkafka's default reset, `latest`)."""
    extra = {k: v for k, v in pruning.client("admin").items() if k != "bootstrap.servers"}
    cluster = Cluster(pruning.bootstrap, extra)
    data, share = cluster.name("queue"), cluster.name("workers")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 100)
    share_acknowledge(pruning.bootstrap, share, data, 10, extra)

    # queued.min.messages 1: the tail's consumer prefetches one fetch between reads, not the whole topic, as a
    # busy share coordinator outruns a prefetch queue
    tail = ShareStateTail(KafkaConnection(pruning.bootstrap, {**extra, "queued.min.messages": 1}))
    try:
        assert tail.read().groups[share] == {data: {0: 10}}
        p = state_partition(cluster, share, data)
        end = cluster.watermarks(STATE_TOPIC, p)[1]
        for upto in (20, 30, 40, 50, 60):  # a snapshot each
            share_acknowledge(pruning.bootstrap, share, data, upto, extra)
        wait_for(
            "the share coordinator pruned its topic past what the tail may have fetched",
            lambda: cluster.watermarks(STATE_TOPIC, p)[0] >= end + 3,
            30,
        )
        with caplog.at_level(logging.WARNING, "compactd.readers"):
            read = tail.read()
        assert not read.blind and read.groups.get(share) == {data: {0: 60}}, read
        said = [r.getMessage() for r in caplog.records if "from its start" in r.getMessage()]
        assert len(said) == 1 and f"{STATE_TOPIC}[{p}]" in said[0], said
    finally:
        tail.close()
