"""Two jobs, one per Kafka cluster (two brokers), share one Redis: same topic names, no collisions."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from compactd.control.metrics import Metrics
from compactd.daemon.application import Application
from compactd.local.broker import kafka_broker
from tests.support.fixtures import Cluster

pytestmark = pytest.mark.spark
H = 3_600_000


def feed(cluster: Cluster, settings, topic: str, committed: int) -> None:
    now = int(time.time() * 1000)
    for t in (settings.topics.segments, settings.topics.commits):
        cluster.create(t)
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 300)
    segments = [
        {
            "type": "segment_rolled",
            "topic": topic,
            "partition": 0,
            "base_offset": b,
            "end_offset": b + 100,
            "first_batch_max_ts": now - 3 * H,
            "size_bytes": 100,
            "ts": now - 2 * H,
        }
        for b in (0, 100)
    ]
    cluster.send(settings.topics.segments, segments)
    commit = {
        "type": "offset_commit",
        "group": "billing",
        "topic": topic,
        "partition": 0,
        "offset": committed,
        "ts": now,
    }
    cluster.send(settings.topics.commits, [commit])


def test_two_jobs_two_brokers_one_redis(spark, cluster, job_settings, redis_url, tmp_path: Path) -> None:
    other_broker = kafka_broker(tmp_path / "broker-b")
    try:
        other = Cluster(f"127.0.0.1:{other_broker.port}")
        thresholds = {"global": {"dry.run": False, "consumed.retention.ms": H}}
        a = job_settings(cluster="east", thresholds=thresholds, checkpoint_dir=str(tmp_path / "a"))
        b = job_settings(
            cluster="west", thresholds=thresholds, checkpoint_dir=str(tmp_path / "b"), bootstrap_servers=other.bootstrap
        )
        b.topics = a.topics  # the same topic names on both clusters
        topic = cluster.name("orders")
        feed(cluster, a, topic, committed=150)
        feed(other, b, topic, committed=250)
        outputs = {}
        for name, settings in (("east", a), ("west", b)):
            metrics = Metrics(cluster=name)
            with Application(settings, spark=spark, metrics=metrics) as job:
                job.run(once=True)
            outputs[name] = generate_latest(metrics.registry).decode()
        assert a.redis_state().view(topic, 0).min_committed == 150
        assert b.redis_state().view(topic, 0).min_committed == 250
        east = cluster.read_all(a.topics.actions)
        west = other.read_all(b.topics.actions)
        assert [(x["cluster"], x["before_offset"], x["status"]) for x in east] == [("east", 100, "sent")]
        assert [(x["cluster"], x["before_offset"], x["status"]) for x in west] == [("west", 200, "sent")]
        assert cluster.watermarks(topic) == (100, 300) and other.watermarks(topic) == (200, 300)
        keys = {k.decode().split(":")[1] for k in a.redis_state().r.keys("cd:*")}
        assert keys == {"east", "west"}
        assert 'cluster="east"' in outputs["east"] and 'cluster="west"' not in outputs["east"]
    finally:
        other_broker.stop()
