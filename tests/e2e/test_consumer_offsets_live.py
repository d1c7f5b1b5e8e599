"""Consumed retention from Kafka's own `__consumer_offsets`, written by the broker for real groups: a classic group
and a KIP-848 consumer-protocol group (`group.protocol=consumer`). Nothing is hand-encoded: the records are what
Apache Kafka 4.x writes (OffsetCommitValue v4 with its topic-ID tag, consumer-group records of key versions 3-8),
and the deletes are judged by the broker's low watermark."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupType, TopicPartition

from compactd.codec.offsets import decode_record
from compactd.daemon.application import Application
from tests.support.events import consumed_retention_job, old_segments
from tests.support.groups import consume_and_commit, newest_protocol, streams_read, writes_topic_ids

pytestmark = pytest.mark.spark
H = 3_600_000


def raw_offset_records(bootstrap: str, groups: set[str]) -> list[dict]:
    """Every `__consumer_offsets` record of `groups`, decoded by compactd's reference codec."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4()}", "enable.auto.commit": False})
    out: list[dict] = []
    try:
        md = c.list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"]
        for p in md.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition("__consumer_offsets", p), timeout=10, cached=False)
            if hi <= lo:
                continue
            c.assign([TopicPartition("__consumer_offsets", p, lo)])
            last, deadline = lo - 1, time.monotonic() + 20
            while last < hi - 1 and time.monotonic() < deadline:
                for m in c.consume(500, timeout=0.5):
                    if m.error() is None:
                        last = m.offset()
                        rec = decode_record(m.key(), m.value())
                        if rec.get("group") in groups or (
                            rec["kind"] == "skipped" and any(g.encode() in m.key() for g in groups)
                        ):
                            out.append(rec)
    finally:
        c.close()
    return out


def input_counts(job: Application) -> dict[str, float]:
    return {
        s.labels["kind"]: s.value
        for metric in job.metrics.registry.collect()
        for s in metric.samples
        if s.name == "compactd_input_records_total" and s.labels.get("stream") == "consumer_offsets"
    }


@pytest.mark.versions
def test_real_groups_in_consumer_offsets_drive_consumed_retention(spark, kafka, cluster, job_settings) -> None:
    data = cluster.name("data")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 400)
    classic, modern = cluster.name("classic"), cluster.name("kip848")
    consume_and_commit(kafka.bootstrap, classic, data, 350)
    protocol = newest_protocol()  # a broker before 4.0 (the version matrix) has classic groups only
    consume_and_commit(kafka.bootstrap, modern, data, 150, protocol)

    # what the broker wrote: on 4.x v4 commit values with the topic's ID, and KIP-848 records compactd does not need;
    # before 4.0, v3 values without an ID and classic groups' records only
    raw = raw_offset_records(kafka.bootstrap, {classic, modern})
    commits = [r for r in raw if r["kind"] == "offset_commit"]
    assert {(r["group"], r["offset"]) for r in commits} == {(classic, 350), (modern, 150)}
    if writes_topic_ids():
        assert {r["value_version"] for r in commits} == {4} and all(r["topic_id"] for r in commits)
    else:
        assert {r["value_version"] for r in commits} == {3} and not any(r.get("topic_id") for r in commits)
    kip848 = any(r["kind"] == "skipped" and r["key_version"] >= 3 for r in raw)  # a consumer group's own records
    assert kip848 == (protocol == "consumer")

    now = int(time.time() * 1000)
    settings = job_settings(
        offsets_source="consumer_offsets",  # Kafka's own record of every group: the default
        thresholds={"global": {"dry.run": False}, f"topic:{data}": {"consumed.retention.ms": H}},
    )
    assert settings.topics.consumer_offsets == "__consumer_offsets"
    cluster.send(settings.topics.segments, old_segments(data, [100, 200, 300, 400], now))
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        counts = input_counts(job)
    # the slower group (the KIP-848 one, at 150) holds everything from [100, 200) on
    assert cluster.watermarks(data) == (100, 400)
    assert not cluster.read_all(settings.topics.dlq, timeout=2)  # Kafka's other record types are not bad input
    assert counts.get("offset_commit", 0) >= 2
    assert (sum(v for k, v in counts.items() if k.startswith("skipped_key_v")) > 0) == kip848, counts

    consume_and_commit(kafka.bootstrap, modern, data, 400, protocol)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    assert cluster.watermarks(data) == (300, 400)  # the classic group, now the slower one at 350, holds [300, 400)

    # the classic group is deleted (the broker writes its tombstones): it holds nothing any more
    for fut in cluster.admin.delete_consumer_groups([classic]).values():
        fut.result(30)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        assert job.state.view(data, 0).min_committed == 400
    assert cluster.watermarks(data) == (400, 400)
    actions = [(a["before_offset"], a["reason"], a["status"]) for a in cluster.read_all(settings.topics.actions)]
    assert actions == [(b, "consumed_retention", "sent") for b in (100, 300, 400)]


def test_a_classic_group_migrated_to_the_consumer_protocol_keeps_holding(spark, kafka, cluster, job_settings) -> None:
    """Kafka's online migration of a classic group to the consumer protocol (a `group.protocol=consumer` member joins
    it) writes a group-metadata tombstone and keeps the group's offsets. It is not a group deletion: the group still
    holds the topic at its committed offset (before the fix it was wiped, and a faster group's offset let the delete
    through)."""
    data = cluster.name("migrated")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 400)
    slow, fast = cluster.name("mig"), cluster.name("ahead")
    consume_and_commit(kafka.bootstrap, fast, data, 400, "consumer")

    def member(protocol: str) -> Consumer:
        c = Consumer(
            {"bootstrap.servers": kafka.bootstrap, "group.id": slow, "group.protocol": protocol,
             "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )  # fmt: skip
        c.subscribe([data])
        return c

    classic = member("classic")
    read, deadline = -1, time.monotonic() + 60
    while read < 149:
        assert time.monotonic() < deadline, "the classic member read nothing"
        for m in classic.consume(50, timeout=0.5):
            if m.error() is None and m.offset() < 150:
                read = max(read, m.offset())
    classic.commit(offsets=[TopicPartition(data, 0, 150)], asynchronous=False)
    modern = member("consumer")  # joins the classic group: Kafka migrates it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        classic.poll(0.1)
        modern.poll(0.1)
        kinds = {g.group_id: g.type for g in cluster.admin.list_consumer_groups().result(10).valid}
        if kinds.get(slow) == ConsumerGroupType.CONSUMER:
            break
    classic.close()
    modern.close()
    assert kinds.get(slow) == ConsumerGroupType.CONSUMER, kinds.get(slow)
    raw = [r for r in raw_offset_records(kafka.bootstrap, {slow}) if r.get("group") == slow]
    assert "group_tombstone" in [r["kind"] for r in raw]  # what the migration wrote ...
    assert "offset_tombstone" not in [r["kind"] for r in raw]  # ... and not: its offsets stay

    now = int(time.time() * 1000)
    settings = consumed_retention_job(job_settings, cluster, data, now)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        assert job.state.view(data, 0).min_committed == 150
    assert cluster.watermarks(data) == (100, 400)  # the migrated group at 150 holds [100, 200) on


def test_a_consumer_protocol_group_assigned_but_not_committed_holds(spark, kafka, cluster, job_settings) -> None:
    """A new KIP-848 group backfilling from the start has members assigned the topic and no commit yet: its position
    is unknown, so the delete a faster group allows is held (before: nothing held it, and its backlog went). Once
    it commits, its offset decides."""
    data = cluster.name("backfill")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 400)
    fast, backfill = cluster.name("ahead"), cluster.name("backfill")
    consume_and_commit(kafka.bootstrap, fast, data, 400, "consumer")
    member = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": backfill, "group.protocol": "consumer",
         "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )  # fmt: skip
    try:
        member.subscribe([data])
        deadline = time.monotonic() + 60
        while not member.assignment():
            assert time.monotonic() < deadline, "the KIP-848 member was never assigned"
            member.poll(0.2)
        now = int(time.time() * 1000)
        settings = job_settings(
            offsets_source="consumer_offsets",
            # a held delete is decided again after action.retry.ms: 1 s here
            thresholds={"global": {"dry.run": False, "action.retry.ms": 1000},
                        f"topic:{data}": {"consumed.retention.ms": H}},
        )  # fmt: skip
        cluster.send(settings.topics.segments, old_segments(data, [100, 200, 300, 400], now))
        with Application(settings, spark=spark) as job:
            job.run(once=True)
        assert cluster.watermarks(data) == (0, 400)  # held: the backfilling group's position is unknown
        skipped = [a for a in cluster.read_all(settings.topics.actions) if a["status"] == "skipped"]
        assert skipped and f"group {backfill} is assigned {data}" in skipped[-1]["detail"]["why"]

        member.commit(offsets=[TopicPartition(data, 0, 200)], asynchronous=False)
        time.sleep(1.1)
        with Application(settings, spark=spark) as job:
            job.run(once=True)
        assert cluster.watermarks(data) == (200, 400)
    finally:
        member.close()


def test_a_streams_group_counts_and_is_listed(spark, kafka, cluster, job_settings) -> None:
    """A Kafka Streams application in a streams group (KIP-1071, `group.protocol=streams`, on by default in Kafka 4.4)
    commits ordinary offsets; its group's own records (key versions above 2) are skipped and counted, never DLQ'd;
    and the cluster lists it, so a strict cluster check vouches for it (ListGroups as librdkafka types it left it out:
    strict held every delete on its topics as "not listed")."""
    data = cluster.name("streamed")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 300)
    app = cluster.name("enricher")
    streams_read(kafka.bootstrap, app, data, 300)  # the streams group at 300
    cluster.fill(data, 100)
    consume_and_commit(kafka.bootstrap, cluster.name("ahead"), data, 400, "consumer")

    raw = raw_offset_records(kafka.bootstrap, {app})
    # its commits, in log order: under load the application may commit once before it has read all 300
    commits = [(r["group"], r["offset"]) for r in raw if r["kind"] == "offset_commit"]
    assert commits and commits[-1] == (app, 300) and all(g == app and o <= 300 for g, o in commits), commits
    assert any(r["kind"] == "skipped" and r["key_version"] >= 3 for r in raw)  # the streams group's own records

    now = int(time.time() * 1000)
    settings = consumed_retention_job(job_settings, cluster, data, now, cluster_check="strict")
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        unlisted = job.state.unlisted(data)
    assert cluster.watermarks(data) == (300, 400)  # up to the streams group, vouched for by the cluster
    assert unlisted is None
    assert not cluster.read_all(settings.topics.dlq, timeout=2)
