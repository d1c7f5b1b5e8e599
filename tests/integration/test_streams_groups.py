"""A streams group (KIP-1071) assigned a topic and not committed yet holds its consumed-retention deletes, as a
KIP-848 group's assignment does: a real Kafka Streams application on the real broker, before its first commit.
librdkafka neither lists nor describes streams groups; compactd reads their records in `__consumer_offsets`."""

from __future__ import annotations

import time

from compactd.codec.streams_group import Topology
from compactd.kafka.config import KafkaConnection
from compactd.kafka.groups import ClusterGroupOffsets, coordinator_partition
from tests.integration.test_cluster_offsets_check import controller, kafka_commit, three_segments_and_g1
from tests.support.groups import streams_assigned


def test_a_streams_group_assigned_and_not_committed_holds_the_topics_deletes(cluster, rclient) -> None:
    topic, actions, other = cluster.name("backfilled"), cluster.name("actions"), cluster.name("elsewhere")
    g1, app = cluster.name("g1"), cluster.name("enricher")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.create(other, 1, {"cleanup.policy": "delete"})
    cluster.create(actions)
    cluster.fill(topic, 3000)
    kafka_commit(cluster.bootstrap, g1, topic, 2500)  # the only group with a commit: it allows [0, 2000)
    clock = [int(time.time() * 1000)]
    offsets = ClusterGroupOffsets(KafkaConnection(cluster.bootstrap), ttl_s=0)
    ctl = controller(cluster, rclient, topic, actions, clock, offsets)
    try:
        with streams_assigned(cluster.bootstrap, app, topic):  # reads from the start, commits nothing
            ctl.on_batch("s", 0, three_segments_and_g1(topic, g1, clock[0]))
            [rec] = cluster.read_all(actions)
            assert (rec["status"], rec["before_offset"]) == ("skipped", 2000), rec
            assert rec["detail"]["why"] == (
                f"group {app} is assigned {topic} and has committed nothing there: its position is unknown"
            )
            assert cluster.watermarks(topic) == (0, 3000)
            # what the broker wrote for it, decoded: its topology reads this topic only, which is all it holds
            assert offsets.streams.reads([app]) == {app: Topology(frozenset({topic}))}
            assert app not in offsets.check(other).assigned
    finally:
        offsets.close()


def test_the_coordinator_partition_is_kafkas() -> None:
    """Java's String.hashCode, int32 overflow and Utils.abs (Integer.MIN_VALUE -> 0), as Kafka places a group."""
    assert coordinator_partition("", 50) == 0
    assert coordinator_partition("billing", 50) == 109829509 % 50  # "billing".hashCode() in Java: -109829509
    assert coordinator_partition("polygenelubricants", 50) == 0  # its hashCode is Integer.MIN_VALUE
    assert coordinator_partition("grüße", 10) == 98768023 % 10  # Java's hashCode: over UTF-16 code units
