"""The `__share_group_state` tail (kafka/share_state.py) on a real Apache Kafka 4.4 whose share coordinator prunes its
topic every half second (as it does every 5 minutes by default) and snapshots every update, with ACLs enforced:
a tail that falls behind the prune re-reads from the start, and a topic ID one naming round could not name is asked
again in the next."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from compactd.kafka.config import KafkaConnection
from compactd.kafka.share_state import STATE_TOPIC, ShareStateTail
from compactd.local.broker import KafkaBroker
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


def grant(admin, kind: ResourceType, name: str, *ops: AclOperation) -> None:
    bindings = [
        AclBinding(kind, name, ResourcePatternType.LITERAL, USER, "*", op, AclPermissionType.ALLOW) for op in ops
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
        # one line each time the tail is pruned past (the coordinator, pruning every 0.5 s, may do it again meanwhile)
        assert said and all(f"{STATE_TOPIC}[{p}]" in line for line in said), said
    finally:
        tail.close()


def test_a_topic_id_no_round_could_name_is_asked_again_in_the_next(pruning) -> None:
    """A share group's topic the tail cannot name yet (here: its principal may not Describe it, so the cluster's
    listing leaves it out) is not a deleted topic for ever: the next naming round asks for it again, and once the
    topic is visible the share group holds it (before the fix: asked again only when another new ID appeared)."""
    extra = {k: v for k, v in pruning.client("admin").items() if k != "bootstrap.servers"}
    cluster = Cluster(pruning.bootstrap, extra)
    data, share = cluster.name("hidden"), cluster.name("workers")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 100)
    share_acknowledge(pruning.bootstrap, share, data, 40, extra)
    grant(cluster.admin, ResourceType.TOPIC, STATE_TOPIC, AclOperation.DESCRIBE, AclOperation.READ)
    grant(cluster.admin, ResourceType.GROUP, "compactd-share-state", AclOperation.READ)

    clock = [0.0]
    tail = ShareStateTail(KafkaConnection(pruning.bootstrap, pruning.client("tail")), monotonic=lambda: clock[0])
    try:
        seen = tail.read()
        assert not seen.blind and data not in seen.groups.get(share, {})  # not visible: not named
        grant(cluster.admin, ResourceType.TOPIC, data, AclOperation.DESCRIBE)
        topic_id = cluster.admin.describe_topics(TopicCollection([data]))[data].result(10).topic_id
        assert topic_id is not None
        clock[0] += 60.0  # a round later; no other share-state topic ID has appeared meanwhile

        def named() -> bool:
            clock[0] += 60.0
            return tail.read().groups.get(share, {}).get(data) == {0: 40}

        wait_for(f"the share group's position on {data} once the topic is visible", named, 10)
    finally:
        tail.close()


def test_a_recreated_topic_keeps_none_of_the_old_incarnations_share_positions(pruning) -> None:
    """Share state is keyed by topic ID: the broker writes tombstones for a deleted topic's share-partitions, and the
    tail names IDs, not names. The same name created again holds nothing for the share group until it reads it."""
    extra = {k: v for k, v in pruning.client("admin").items() if k != "bootstrap.servers"}
    cluster = Cluster(pruning.bootstrap, extra)
    data, share = cluster.name("again"), cluster.name("workers")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 200)
    share_acknowledge(pruning.bootstrap, share, data, 150, extra)
    tail = ShareStateTail(cluster.conn)
    try:
        assert tail.read().groups[share] == {data: {0: 150}}
        cluster.recreate(data)
        cluster.fill(data, 400)
        wait_for(
            f"the old {data}'s share positions gone",
            lambda: (read := tail.read()).blind == "" and data not in read.groups.get(share, {}),
            10,
        )
    finally:
        tail.close()
