"""compactd's stream reads its sources through Spark's Kafka connector: what an operator counts on, against the real
broker. Open transactions bound a batch, a batch cap splits a backlog, a source not created yet is not created by the
read, and records deleted before they were read give one line and no crash (`failOnDataLoss` is off)."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from compactd.control.metrics import Metrics
from compactd.daemon.source_loss import SourceLoss
from compactd.settings import Settings
from compactd.streaming.checkpoint import adopt_source
from compactd.streaming.connector import java_options
from compactd.streaming.decode import Decoder
from compactd.streaming.job import Batch, StreamingJob, StreamSpec
from tests.support.fixtures import Cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def read_once(spark, s: Settings, topics: list[str], checkpoint: Path, **spec: object) -> list[Batch]:
    """One `availableNow` run of the stream over `topics`: the batches it handed over."""
    got: list[Batch] = []
    job = StreamingJob(
        StreamSpec(
            kafka_options=java_options(s.kafka_connection()),
            topics=topics,
            decoder=Decoder(s.topics.segments, s.topics.commits),
            checkpoint=checkpoint,
            **spec,  # type: ignore[arg-type]
        ),
        spark,
        got.append,
    )
    assert job.start(once=True).awaitTermination(120), "the run did not end"
    assert job.failure() is None, job.failure()
    return got


def records(batches: list[Batch]) -> int:
    return sum(n for b in batches for n in b.collected.counts.values())


@pytest.mark.versions
def test_an_open_transaction_bounds_the_batch_and_its_records_follow_its_commit(
    spark, cluster: Cluster, job_settings, tmp_path: Path
) -> None:
    s = job_settings()
    topic = s.topics.segments
    cluster.create(topic, 1)
    cluster.fill(topic, 10)
    tx = cluster.open_transaction(topic, 5, b"uncommitted")
    started = time.monotonic()
    first = read_once(spark, s, [topic], tmp_path / "ckpt")
    assert records(first) == 10 and first[-1].end_offsets() == {topic: {"0": 10}}  # the last stable offset, not 15
    assert time.monotonic() - started < 60  # no read waits for the transaction
    tx.commit_transaction(10)
    # Kafka writes the commit marker after EndTxn answers: the last stable offset moves a moment later
    c = Consumer(cluster.conn.client("consumer", forced={"group.id": "lso", "isolation.level": "read_committed"}))
    stable = TopicPartition(topic, 0)
    wait_for("the commit marker", lambda: c.get_watermark_offsets(stable, 5, cached=False)[1] == 16, 10)
    c.close()
    then = read_once(spark, s, [topic], tmp_path / "ckpt")
    assert records(then) == 5 and then[-1].end_offsets() == {topic: {"0": 16}}
    assert {r["raw_value"] for b in then for r in b.collected.rejected} == {b"uncommitted"}  # not JSON: the DLQ's


def test_a_cap_splits_the_backlog_and_a_missing_source_is_not_created(
    spark, cluster: Cluster, job_settings, tmp_path: Path
) -> None:
    s = job_settings()
    topic, missing = s.topics.segments, s.topics.commits
    cluster.create(topic, 2)
    cluster.fill(topic, 20, partition=0)
    cluster.fill(topic, 5, partition=1)
    batches = read_once(spark, s, [topic, missing], tmp_path / "ckpt", max_rows_per_trigger=10)
    assert [records([b]) for b in batches] == [10, 10, 5]
    assert missing not in cluster.admin.list_topics(timeout=10).topics


def test_records_deleted_before_they_are_read_are_said_in_one_line(
    spark, cluster: Cluster, job_settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = job_settings()
    topic = s.topics.segments
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 10)
    metrics = Metrics(CollectorRegistry())
    checkpoint = tmp_path / "ckpt"
    loss = SourceLoss(s.kafka_connection(), checkpoint, metrics)
    assert records(read_once(spark, s, [topic], checkpoint, before_read=loss)) == 10
    cluster.fill(topic, 30)
    for fut in cluster.admin.delete_records([TopicPartition(topic, 0, 25)]).values():
        fut.result(30)  # what retention does to a job stopped too long
    with caplog.at_level(logging.WARNING, logger="compactd"):
        after = read_once(spark, s, [topic], checkpoint, before_read=loss)
    assert records(after) == 15 and after[-1].end_offsets() == {topic: {"0": 40}}  # read on from the log start
    said = [r.getMessage() for r in caplog.records if r.name.startswith("compactd")]
    assert said == [
        f"15 records of {topic} were deleted before compactd read them ({topic}/0 [10, 25)): their events are lost, "
        f"which only holds deletes back; raise retention.ms on {topic} above the time compactd may be stopped"
    ]
    assert metrics.source_records_lost.labels(topic)._value.get() == 15


def test_a_checkpoint_of_the_former_source_resumes_where_it_stopped(
    spark, cluster: Cluster, job_settings, tmp_path: Path
) -> None:
    """compactd's own Python source wrote each batch's offsets with Python's json.dumps and kept no `sources/` folder;
    the connector reads the same `{"topic": {"partition": offset}}` and goes on from there."""
    s = job_settings()
    topic = s.topics.segments
    cluster.create(topic, 2)
    cluster.fill(topic, 10, partition=0)
    cluster.fill(topic, 4, partition=1)
    checkpoint = tmp_path / "ckpt"
    assert records(read_once(spark, s, [topic], checkpoint)) == 14
    # the checkpoint as the former source left it
    shutil.rmtree(checkpoint / "sources")
    for path in (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()):
        lines = path.read_text().splitlines()
        lines[-1] = json.dumps(json.loads(lines[-1]))
        path.write_text("\n".join(lines))
    assert adopt_source(checkpoint) and not adopt_source(checkpoint)  # said once
    cluster.fill(topic, 3, partition=1)
    after = read_once(spark, s, [topic], checkpoint)
    assert records(after) == 3 and after[-1].end_offsets() == {topic: {"0": 10, "1": 7}}
