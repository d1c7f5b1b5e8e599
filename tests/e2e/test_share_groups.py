"""Share groups (KIP-932) hold consumed retention like any group: their position is the share-partition start
offset Kafka keeps in `__share_group_state`, carried over the records they acknowledged. Real share consumers on
Apache Kafka 4.4; the deletes are judged by the broker's low watermark."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicCollection, TopicPartition

from compactd.codec.share_state import SNAPSHOT, UPDATE, decode_key, decode_value
from compactd.daemon.application import Application
from compactd.kafka.share_state import STATE_TOPIC, ShareStateTail
from compactd.policy.identity import topic_id_bytes
from tests.support.events import consumed_retention_job
from tests.support.groups import consume_and_commit, share_acknowledge

pytestmark = pytest.mark.spark
H = 3_600_000


def state_records(bootstrap: str) -> list[tuple[bytes, bytes | None]]:
    """Every record of `__share_group_state` as the broker wrote it."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "raw-share-state", "enable.auto.commit": False})
    out = []
    try:
        n = len(c.list_topics(STATE_TOPIC, timeout=10).topics[STATE_TOPIC].partitions)
        for p in range(n):
            lo, hi = c.get_watermark_offsets(TopicPartition(STATE_TOPIC, p), timeout=10, cached=False)
            if hi <= lo:
                continue
            c.assign([TopicPartition(STATE_TOPIC, p, lo)])
            last, deadline = lo - 1, time.monotonic() + 20
            while last < hi - 1 and time.monotonic() < deadline:
                for m in c.consume(500, timeout=0.5):
                    if m.error() is None:
                        last = m.offset()
                        out.append((m.key(), m.value()))
    finally:
        c.close()
    return out


def test_a_share_group_holds_consumed_retention_at_what_it_acknowledged(spark, kafka, cluster, job_settings) -> None:
    data = cluster.name("queue")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 400)
    share, classic = cluster.name("workers"), cluster.name("audit")
    consume_and_commit(kafka.bootstrap, classic, data, 400)  # a classic group has read everything
    share_acknowledge(kafka.bootstrap, share, data, 150)  # the share group acknowledged [0, 150)

    # what the broker wrote, decoded by compactd's codec: snapshots and updates of the share group on the topic
    topic_id = cluster.admin.describe_topics(TopicCollection([data]))[data].result(10).topic_id
    mine = [(decode_key(k), v) for k, v in state_records(kafka.bootstrap) if share.encode() in k]
    assert {k.kind for k, _ in mine} == {SNAPSHOT, UPDATE}
    assert {k.topic_id.bytes for k, _ in mine} == {topic_id_bytes(str(topic_id))}
    acked = [r for k, v in mine if v is not None for r in decode_value(k.kind, v).done]
    assert acked and max(last for _, last in acked) == 149

    tail = ShareStateTail(cluster.conn)
    try:
        assert tail.read().groups[share] == {data: {0: 150}}
    finally:
        tail.close()

    now = int(time.time() * 1000)
    settings = consumed_retention_job(job_settings, cluster, data, now)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    # the classic group is at 400, the share group at 150: only [0, 100) goes
    assert cluster.watermarks(data) == (100, 400)

    share_acknowledge(kafka.bootstrap, share, data, 400)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    assert cluster.watermarks(data) == (400, 400)
    actions = [(a["before_offset"], a["status"]) for a in cluster.read_all(settings.topics.actions)]
    assert actions == [(100, "sent"), (400, "sent")]
