"""Readers the operator declares (issue 40): a reader that commits no group offsets, pinned at a position with a
lease, holds consumed retention like a group until its lease ends; then it no longer counts, and the job says so in
one line naming the reader and the key to change. Declared in the file, changed by config events; judged by the
broker's low watermark."""

from __future__ import annotations

import logging
import time

import pytest

from compactd.app.application import Application
from compactd.app.explain_cli import explain
from tests.support.events import consumed_retention_job
from tests.support.groups import consume_and_commit

pytestmark = pytest.mark.spark
H = 3_600_000


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
    query = (
        spark.readStream.format("kafka")
        .option("subscribe", data)
        .option("startingOffsets", "earliest")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
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
