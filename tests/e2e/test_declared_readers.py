"""Readers the operator declares: a reader that commits no group offsets, pinned at a position with a
lease, holds consumed retention like a group until its lease ends; then it no longer counts, and the job says so in
one line naming the reader and the key to change. Declared in the file, changed by config events; judged by the
broker's low watermark."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from compactd.app.explain_cli import explain
from compactd.daemon.application import Application
from tests.support.events import consumed_retention_job, old_segments
from tests.support.groups import consume_and_commit

pytestmark = pytest.mark.spark
H = 3_600_000
V2 = {  # Spark 4.2's offset log v2 (OffsetMap: offsets by source name), and the source names it is keyed by
    "spark.sql.streaming.offsetLog.formatVersion": "2",
    "spark.sql.streaming.queryEvolution.enableSourceEvolution": "true",
}


def run_query(spark, bootstrap: str, checkpoint: Path, sources: dict[str, dict[str, str]], conf: dict | None = None):
    """A user's Spark query through Spark's own Kafka connector, run until it has read what there is
    (`availableNow`): one source per entry, `name -> options` (`subscribe` or `subscribePattern`), unioned; named
    with `.name(...)` when `conf` is V2. `conf`: SQL settings for this query only."""
    conf = conf or {}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        frames = []
        for name, options in sources.items():
            reader = spark.readStream.format("kafka")
            if conf is V2:
                reader = reader.name(name)
            reader = reader.option("startingOffsets", "earliest").option("kafka.bootstrap.servers", bootstrap)
            frames.append(reader.options(**options).load())
        df = frames[0]
        for other in frames[1:]:
            df = df.union(other)
        query = df.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
        query.trigger(availableNow=True).start().awaitTermination(120)
    finally:
        for k in conf:
            spark.conf.unset(k)


def test_a_pinned_reader_holds_until_its_lease_ends(spark, kafka, cluster, job_settings, caplog) -> None:
    data = cluster.name("exported")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 400)
    consume_and_commit(kafka.bootstrap, cluster.name("etl"), data, 400, "consumer")  # the only group: read it all
    now = int(time.time() * 1000)
    pin = {"nightly-export": {"pin": {data: {0: 150}}, "expires_ms": now + 10 * 60_000}}
    settings = consumed_retention_job(job_settings, cluster, data, now, readers=pin)
    cluster.create(settings.topics.config)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        # explain and the metrics name the reader that holds the rest, as they name a group
        (e,) = explain(job.state, settings, f"{data}/0", int(time.time() * 1000))
        named = {
            (s.labels["reader"], s.labels["kind"], s.labels["state"])
            for m in job.metrics.registry.collect()
            for s in m.samples
            if s.name == "compactd_reader" and s.value == 1 and s.labels["kind"] != "share_group"
        }  # other tests' share groups share the broker: the gauge names them too
    assert named == {("nightly-export", "pin", "counting")}
    assert cluster.watermarks(data) == (100, 400)  # the pin at 150 holds [100, 400)
    consumed = e["rules"]["consumed_retention"]
    assert consumed["now"]["min_committed"] == 150 and consumed["now"]["counted_groups"] == 2
    assert [b["why"] for b in consumed["blocked_by"]] == [
        "reader nightly-export at offset 150, a reader: it commits no group offsets"
    ]

    # the operator moves the pin by a config event: the next run follows it
    scope = "reader:nightly-export"
    moved = {"type": "config", "scope": scope, "set": {"pin": {data: {"0": 300}}}, "version": 1, "ts": now}
    cluster.send(settings.topics.config, [moved], key=scope)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    assert cluster.watermarks(data) == (300, 400)

    # the lease ends: the pin no longer counts, and one line says so
    ended = {"type": "config", "scope": scope, "set": {"expires_ms": now - 1}, "version": 2, "ts": now}
    cluster.send(settings.topics.config, [ended], key=scope)
    with caplog.at_level(logging.WARNING, logger="compactd.readers"), Application(settings, spark=spark) as job:
        job.run(once=True)
    assert cluster.watermarks(data) == (400, 400)
    said = [r.getMessage() for r in caplog.records if r.name == "compactd.readers"]
    assert len(said) == 1 and "reader nightly-export" in said[0] and "reader:nightly-export expires_ms" in said[0]
    actions = [(a["before_offset"], a["status"]) for a in cluster.read_all(settings.topics.actions)]
    assert actions == [(100, "sent"), (300, "sent"), (400, "sent")]


def test_a_spark_query_holds_by_its_checkpoint(spark, kafka, cluster, job_settings, tmp_path) -> None:
    """A Spark Structured Streaming query reads a topic and commits nothing to Kafka: its position is its
    checkpoint. Declared as a reader (`spark_checkpoint`), it holds consumed retention at the offsets of its latest
    committed batch while a group is ahead. The query reads through Spark's own Kafka connector, as users' do."""
    data = cluster.name("etl-input")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 300)
    checkpoint = tmp_path / "etl-checkpoint"
    run_query(spark, kafka.bootstrap, checkpoint, {"orders": {"subscribe": data}})
    assert (checkpoint / "commits" / "0").exists()  # the query read [0, 300) and committed its batch
    cluster.fill(data, 100)
    consume_and_commit(kafka.bootstrap, cluster.name("ahead"), data, 400, "consumer")
    now = int(time.time() * 1000)
    settings = consumed_retention_job(
        job_settings, cluster, data, now, readers={"etl": {"spark_checkpoint": str(checkpoint)}}
    )
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    assert cluster.watermarks(data) == (300, 400)  # the query's position, not the group's 400


def test_a_query_with_the_v2_offset_log_holds_and_an_unknown_version_is_blind(
    spark, kafka, cluster, job_settings, tmp_path
) -> None:
    """Spark 4.2's offset log v2 (`spark.sql.streaming.offsetLog.formatVersion=2`) writes each source's offset as
    `<name>:<json>`: read as v1 it is no Kafka position at all, and the reader held nothing. Read right, the query
    holds at its batch's offsets; a version compactd does not know makes it blind (it holds), never empty."""
    data, side = cluster.name("v2-input"), cluster.name("v2-side")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.create(side, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 300)
    cluster.fill(side, 20)
    checkpoint = tmp_path / "v2-checkpoint"
    run_query(
        spark, kafka.bootstrap, checkpoint, {"orders_in": {"subscribe": data}, "side_in": {"subscribe": side}}, V2
    )
    written = (checkpoint / "offsets" / "0").read_text().splitlines()
    assert written[0] == "v2" and {line.split(":", 1)[0] for line in written[2:]} == {"orders_in", "side_in"}
    cluster.fill(data, 100)
    consume_and_commit(kafka.bootstrap, cluster.name("ahead"), data, 400, "consumer")
    now = int(time.time() * 1000)
    readers = {"etl": {"spark_checkpoint": str(checkpoint)}}
    settings = consumed_retention_job(job_settings, cluster, data, now, readers=readers)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        status = job.readers.status()["etl"]
    assert cluster.watermarks(data) == (300, 400)  # the query's position, not the group's 400
    assert status["positions"] == {data: {0: 300}, side: {0: 20}}

    # a version it does not know (a later Spark's): blind, it holds what it was last read on; nothing more goes
    (checkpoint / "offsets" / "0").write_text("\n".join(["v3", *written[1:]]))
    cluster.send(settings.topics.segments, old_segments(data, [100, 200, 300, 400], now))  # evaluated again
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        status = job.readers.status()["etl"]
    assert status["state"] == "blind" and "version" in status["why"]
    assert cluster.watermarks(data) == (300, 400)


def test_a_pattern_query_holds_a_topic_created_after_its_last_batch(spark, kafka, cluster, job_settings, tmp_path):
    """A query subscribed by `subscribePattern` reads a topic created after its last batch from the start (Spark's
    pattern subscription finds it at the next batch). Not yet in its checkpoint, the topic is held whole by the
    reader's declared pattern; once the query has read it, by its position there."""
    first, later = cluster.name("pat-first"), cluster.name("pat-later")
    pattern = f"{cluster.prefix}\\.pat-.*"
    cluster.create(first, 1, {"cleanup.policy": "delete"})
    cluster.fill(first, 50)
    checkpoint = tmp_path / "pattern-checkpoint"
    run_query(spark, kafka.bootstrap, checkpoint, {"all": {"subscribePattern": pattern}})
    cluster.create(later, 1, {"cleanup.policy": "delete"})
    cluster.fill(later, 400)
    consume_and_commit(kafka.bootstrap, cluster.name("ahead"), later, 400, "consumer")
    now = int(time.time() * 1000)
    readers = {"etl": {"spark_checkpoint": str(checkpoint), "subscribe_pattern": pattern}}
    settings = consumed_retention_job(job_settings, cluster, later, now, readers=readers)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        (e,) = explain(job.state, settings, f"{later}/0", int(time.time() * 1000))
    assert cluster.watermarks(later) == (0, 400)  # the query will read all of it: nothing deleted
    assert "reader etl" in repr(e["rules"]["consumed_retention"])

    run_query(spark, kafka.bootstrap, checkpoint, {"all": {"subscribePattern": pattern}})  # finds it, reads it
    cluster.send(settings.topics.segments, old_segments(later, [100, 200, 300, 400], now))  # evaluated again
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        assert job.readers.status()["etl"]["positions"] == {first: {0: 50}, later: {0: 400}}
    assert cluster.watermarks(later) == (400, 400)


def test_a_recreated_topic_is_not_held_nor_released_by_the_old_checkpoint(
    spark, kafka, cluster, job_settings, tmp_path
) -> None:
    """A checkpoint's offsets name no topic ID. The query read 300 records of a topic that is then deleted and
    created again with 400 new ones, which a group has read: the old offsets (300) say nothing of the new log and
    must not let a delete go there; the reader holds the topic (blind) until a batch planned since commits, and
    then counts by that batch's position, not the old one."""
    data, other = cluster.name("reborn"), cluster.name("elsewhere")
    for topic in (data, other):
        cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 300)
    cluster.fill(other, 400)
    checkpoint = tmp_path / "reborn-checkpoint"
    run_query(spark, kafka.bootstrap, checkpoint, {"orders": {"subscribe": data}})
    now = int(time.time() * 1000)
    readers = {"etl": {"spark_checkpoint": str(checkpoint)}}
    # a first run reads the reader (while deciding on another topic) and records the incarnation its offsets are on
    settings = consumed_retention_job(job_settings, cluster, other, now, readers=readers)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        assert job.readers.status()["etl"]["positions"] == {data: {0: 300}}
        assert job.state.readers() is not None

    cluster.recreate(data, 1, {"cleanup.policy": "delete"})
    cluster.fill(data, 400)
    consume_and_commit(kafka.bootstrap, cluster.name("ahead"), data, 400, "consumer")
    settings = consumed_retention_job(job_settings, cluster, data, now, readers=readers)
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        status = job.readers.status()["etl"]
    assert cluster.watermarks(data) == (0, 400)  # not released by the old log's 300
    assert status["state"] == "counting" and status["other_incarnation"] == [data]

    run_query(spark, kafka.bootstrap, checkpoint, {"orders": {"subscribe": data}})  # a batch on the new log: 400
    cluster.send(settings.topics.segments, old_segments(data, [100, 200, 300, 400], now))  # evaluated again
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    assert cluster.watermarks(data) == (400, 400)  # counted by its new batch, not held back by the old one
