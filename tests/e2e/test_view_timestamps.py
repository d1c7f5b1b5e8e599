"""A view's records keep their winners' timestamps on a broker whose defaults say otherwise.

The broker stamps records with `LogAppendTime` by default and refuses records more than a day old; the source topics
override both, as an operator does for a topic of historical records. A view that took the broker's defaults would
carry its write time (under `compaction.strategy: timestamp` every view record then outranks the newer source
records produced before it), or refuse the old winners and fail every run.

Ground truth is the broker: the view topic's configs as DescribeConfigs reports them, and the timestamps a plain
consumer reads from it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka.admin import ConfigResource, ResourceType

from compactd.compaction.service import Compactor, Overrides
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import CompactedReader, table
from compactd.local.broker import KafkaBroker, kafka_broker
from tests.support import kraft
from tests.support.compaction import Event, last_record_wins, produce, read_plain
from tests.support.fixtures import Cluster

pytestmark = pytest.mark.spark
DAY = 86_400_000
OLD_OK = {"message.timestamp.type": "CreateTime", "message.timestamp.before.max.ms": str(2**63 - 1)}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker that refuses records more than a day old by default; each test sets its default timestamp type."""
    b = kafka_broker(tmp_path_factory.mktemp("stamps"), extra={"log.message.timestamp.before.max.ms": str(DAY)})
    try:
        yield b
    finally:
        b.stop()


def compactor(broker: KafkaBroker, job_settings, redis_url: str, spark) -> Compactor:
    s = job_settings(bootstrap_servers=broker.bootstrap)
    layers = {"global": {"compaction.view.grace.ms": 0}}
    return Compactor(s, redis.Redis.from_url(redis_url), lambda: layers, lambda: spark)


def test_a_view_keeps_its_winners_timestamps_on_a_broker_that_stamps_log_append_time(
    broker: KafkaBroker, job_settings, redis_url, spark
) -> None:
    cluster = Cluster(broker.bootstrap)
    alter_default(cluster, "log.message.timestamp.type", "LogAppendTime")
    comp = compactor(broker, job_settings, redis_url, spark)
    strategy, overrides = Strategy.of("timestamp"), Overrides("timestamp")
    now = int(time.time() * 1000)
    topic = cluster.name("stamped")
    cluster.create(topic, 1, OLD_OK)
    sent = produce(cluster, topic, [Event(0, b"k%d" % i, b"old%d" % i, now - 3 * DAY + i) for i in range(20)], 1)
    assert comp.run(topic, overrides)["generation"] == 1
    # newer than the winners, older than the time the view was written
    sent[0] += produce(cluster, topic, [Event(0, b"k%d" % i, b"new%d" % i, now - DAY + i) for i in range(10)], 1)[0]
    assert comp.run(topic, overrides)["generation"] == 2
    manifest = comp.log.read(topic)
    assert manifest is not None
    want = {r.key: r.value for r in table(sent[0], strategy)}
    assert last_record_wins(read_plain(cluster, manifest.view)[0]) == want
    reader = CompactedReader(comp.conn, comp.settings.topics.compactions)
    got = {r.key: (r.value, r.timestamp) for _, r in reader.partition_records(topic, table_mode=True)}
    assert got == {r.key: (r.value, r.timestamp) for r in table(sent[0], strategy)}
    assert view_configs(cluster, manifest.view)["message.timestamp.type"] == "CreateTime"

    # a view created before compactd set these (or altered since) gets them at a process's first run over it
    cluster.alter(manifest.view, {"message.timestamp.type": "LogAppendTime"})  # shown before the run reads it
    fresh = compactor(broker, job_settings, redis_url, spark)
    sent[0] += produce(
        cluster, topic, [Event(0, b"k%d" % i, b"newer%d" % i, now - DAY + 100 + i) for i in range(5)], 1
    )[0]
    assert fresh.run(topic, overrides)["generation"] == 3
    assert view_configs(cluster, manifest.view)["message.timestamp.type"] == "CreateTime"
    want = {r.key: r.value for r in table(sent[0], strategy)}
    assert last_record_wins(read_plain(cluster, manifest.view)[0]) == want


def test_a_view_takes_winners_older_than_the_brokers_timestamp_bound(
    broker: KafkaBroker, job_settings, redis_url, spark
) -> None:
    cluster = Cluster(broker.bootstrap)
    alter_default(cluster, "log.message.timestamp.type", "CreateTime")
    comp = compactor(broker, job_settings, redis_url, spark)
    now = int(time.time() * 1000)
    topic = cluster.name("bounded")
    cluster.create(topic, 1, OLD_OK)
    old = produce(cluster, topic, [Event(0, b"k%d" % i, b"v%d" % i, now - 3 * DAY + i) for i in range(20)], 1)
    out = comp.run(topic, Overrides("timestamp"))
    assert (out["status"], out["generation"]) == ("SUCCESS", 1), out
    manifest = comp.log.read(topic)
    assert manifest is not None
    plain = read_plain(cluster, manifest.view)[0]
    assert sorted((r.key, r.timestamp) for r in plain) == sorted((r.key, r.timestamp) for r in old[0])


def view_configs(cluster: Cluster, topic: str) -> dict[str, str]:
    res = ConfigResource(ResourceType.TOPIC, topic)
    return {k: e.value for k, e in cluster.admin.describe_configs([res])[res].result(30).items()}


def alter_default(cluster: Cluster, key: str, value: str) -> None:
    """A broker's default for its topics (a dynamic config of node 1, as `kafka-configs --entity-type brokers` sets)."""
    kraft.alter(cluster.conn, ResourceType.BROKER, "1", {key: value})  # returns once the broker describes it
