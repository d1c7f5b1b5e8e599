"""Apache Kafka killed with -9 before it checkpointed a deleteRecords' log start: it comes back with the older log
start (the first offset of the segment the delete cut into). The topic is the same log (same topic ID), so the
compacted view keeps its lineage, and with it every key that lived only in the view (read as
another log, the view was rebuilt from the source alone and those keys were lost).

Ground truth is the broker: its low watermark before and after the kill, and what the source held at each step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from confluent_kafka import TopicPartition

from compactd.compaction.service import Compactor
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import CompactedReader, table
from compactd.local.broker import kafka_broker
from tests.support.compaction import Event, produce
from tests.support.fixtures import Cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark
BIG = b"x" * 100_000  # ten records a 1 MiB segment (Kafka's smallest segment.bytes)


def test_a_log_start_that_goes_back_after_a_broker_kill_keeps_the_views_lineage_and_its_keys(
    spark, job_settings, redis_url, tmp_path: Path
) -> None:
    # the log start is checkpointed every hour, not every second as the test broker does: a kill loses it
    broker = kafka_broker(tmp_path / "broker", extra={"log.flush.start.offset.checkpoint.interval.ms": "3600000"})
    try:
        cluster = Cluster(broker.bootstrap)
        topic = cluster.name("accounts")
        cluster.create(topic, 1, {"segment.bytes": str(1 << 20)})
        now = int(time.time() * 1000)
        old = [Event(0, b"a%d" % i, BIG, now - 60_000 + i) for i in range(30)]  # only the view will hold these
        sent = produce(cluster, topic, old, partitions=1)[0]
        sent += produce(cluster, topic, [Event(0, b"b%d" % i, b"b", now - 30_000 + i) for i in range(10)], 1)[0]

        s = job_settings(bootstrap_servers=broker.bootstrap)
        comp = Compactor(s, redis.Redis.from_url(redis_url), lambda: {"global": {"compaction.view.grace.ms": 0}},
                         lambda: spark)  # fmt: skip
        assert comp.run(topic)["generation"] == 1
        # what consumed retention does below the view's horizon: the segments wholly below 25 go, and the log
        # start moves into the one holding offset 25
        for fut in cluster.admin.delete_records([TopicPartition(topic, 0, 25)]).values():
            fut.result(30)
        data = broker.log_dir / f"{topic}-0"
        wait_for(f"{topic}-0's segments below offset 25 deleted", lambda: min(segments(data)) > 0, 30)
        cut = min(segments(data))  # the base offset of the segment the delete cut into
        assert 0 < cut < 25 and cluster.watermarks(topic) == (25, 40)
        sent += produce(cluster, topic, [Event(0, b"c%d" % i, b"c", now + i) for i in range(5)], 1)[0]
        second = comp.run(topic)
        assert second["generation"] == 2 and second["lineage"] == 1  # its manifest holds the log start 25

        broker.kill()
        broker.start()
        wait_for(f"{topic} led again", lambda: _low(cluster, topic) is not None, 60)
        assert cluster.watermarks(topic) == (cut, 45)  # the older log start is back: the source holds [cut, 45)
        sent += produce(cluster, topic, [Event(0, b"d%d" % i, b"d", now + 100 + i) for i in range(5)], 1)[0]

        third = comp.run(topic)
        assert third["generation"] == 3
        reader = CompactedReader(comp.conn, s.topics.compactions)
        got = [(r.offset, r.key, r.value) for _, r in reader.partition_records(topic, table_mode=True)]
        want = [(r.offset, r.key, r.value) for r in table(sent, Strategy())]
        lost = sorted({w[1] for w in want} - {g[1] for g in got})
        assert not lost, f"keys that lived only in the view were lost: {lost}"
        assert got == want
        assert (third["lineage"], third["lineage_why"]) == (1, ""), third  # same topic ID: the same log
    finally:
        broker.stop()


def segments(partition_dir: Path) -> list[int]:
    """The base offsets of a partition's segments on disk (what a deleted segment leaves is renamed `.deleted`)."""
    return [int(f.name.split(".")[0]) for f in partition_dir.glob("*.log")]


def _low(cluster: Cluster, topic: str) -> int | None:
    try:
        return cluster.watermarks(topic)[0]
    except Exception:  # still electing a leader after the restart
        return None
