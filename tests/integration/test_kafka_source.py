"""The Spark source's planning and reading against the real broker (no Spark needed for these parts)."""

from __future__ import annotations

import time

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from compactd.demo.broker import kafka_broker
from compactd.streaming.kafka_source import KafkaRange, KafkaStreamReader, read_range, split_limit
from tests.support.fixtures import Cluster
from tests.support.waiting import wait_for


def reader(cluster, topics: str, **options: str) -> KafkaStreamReader:
    return KafkaStreamReader({"subscribe": topics, "kafka.bootstrap.servers": cluster.bootstrap, **options})


def test_open_transaction_bounds_the_batch_and_the_read_does_not_stall(cluster) -> None:
    topic = cluster.name("tx")
    cluster.create(topic, 1)
    cluster.fill(topic, 10)
    tx = cluster.open_transaction(topic, 5, b"uncommitted")
    r = reader(cluster, topic)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {topic: {"0": 10}}  # the last stable offset, not the high watermark (15)
    started = time.monotonic()
    rows = sum(b.num_rows for b in read_range(r.conf, KafkaRange(topic, 0, 0, 10), timeout_ms=20_000))
    assert rows == 10 and time.monotonic() - started < 10
    tx.commit_transaction(10)
    # Kafka writes the commit marker after EndTxn answers: the last stable offset moves a moment later
    wait_for("the commit marker", lambda: r.latestOffset(end, ReadAllAvailable())[topic]["0"] == 16, 10)
    batches = list(read_range(r.conf, KafkaRange(topic, 0, 10, 16), timeout_ms=20_000))
    assert [v for b in batches for v in b.column("value").to_pylist()] == [b"uncommitted"] * 5


def test_row_cap_is_shared_and_missing_topics_are_not_created(cluster) -> None:
    a, b = cluster.name("a"), cluster.name("b")
    cluster.create(a, 2)
    cluster.create(b, 1)
    cluster.fill(a, 10, partition=0)
    cluster.fill(a, 1, partition=1)
    cluster.fill(b, 10)
    missing = cluster.name("not-there")
    r = reader(cluster, f"{a},{b},{missing}", maxOffsetsPerTrigger="9")
    start = r.initialOffset()
    assert r.getDefaultReadLimit() == ReadMaxRows(9)
    end = r.latestOffset(start, ReadMaxRows(9))
    assert sum(end[t][p] - start[t][p] for t in end for p in end[t]) == 9
    assert end[a]["1"] == 1  # the small partition is not starved
    assert missing not in cluster.admin.list_topics(timeout=10).topics
    assert split_limit({"t": {"0": 5}}, {"t": {"0": 5}}, 100) == {"t": {"0": 5}}


def test_a_broker_down_between_triggers_means_no_new_data_not_a_failed_query(tmp_path) -> None:
    """Kafka killed with -9 while the query runs: a trigger that cannot ask the cluster plans nothing new (the query
    would otherwise fail and take the job with it); once the broker is back, the next trigger reads on."""
    broker = kafka_broker(tmp_path / "broker")
    try:
        cluster = Cluster(broker.bootstrap)
        topic = cluster.name("t")
        cluster.create(topic, 1)
        cluster.fill(topic, 10)
        r = reader(cluster, topic)
        start = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        assert start == {topic: {"0": 10}}
        broker.kill()
        assert r.latestOffset(start, ReadAllAvailable()) == start  # down: nothing new, no exception
        broker.start()
        cluster.fill(topic, 5)
        wait_for(
            "the next trigger reads on", lambda: r.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 15}}, 30
        )
    finally:
        broker.stop()
