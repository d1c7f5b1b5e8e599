"""Evaluation slices in Spark tasks (`evaluation_slices`): the same input, merged and planned by the driver or in
Spark tasks that each own a slice of the topics, leaves the same state and the same decisions."""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.control.slices import slice_of
from compactd.daemon.application import Application
from compactd.sinks.recording import RecordingSink
from compactd.streaming.connector import java_options
from compactd.streaming.decode import Decoder
from compactd.streaming.job import Batch, StreamingJob, StreamSpec

pytestmark = pytest.mark.spark
H = 3_600_000


def events(topics: list[str], rnd: random.Random, now: int) -> list[tuple[bool, dict]]:
    """(is a segment event, event): segments, cleaner and log-start events, commits and a group deletion."""
    out = []
    for i in range(1500):
        topic, p, group = rnd.choice(topics), rnd.randrange(6), f"g{rnd.randrange(3)}"
        roll = rnd.random()
        if roll < 0.45:
            out.append((False, {"type": "offset_commit", "group": group, "topic": topic, "partition": p,
                                "offset": rnd.randrange(1000), "ts": now - i}))  # fmt: skip
        elif roll < 0.47:
            out.append((False, {"type": "offset_delete", "group": group, "topic": topic, "partition": p, "ts": now}))
        elif roll < 0.48:
            out.append((False, {"type": "group_delete", "group": group, "ts": now - i}))
        elif roll < 0.85:
            base, age = rnd.randrange(8) * 100, rnd.randrange(6) * H
            out.append((True, {"type": "segment_rolled", "topic": topic, "partition": p, "base_offset": base,
                               "end_offset": base + 100, "first_batch_max_ts": now - age - H, "size_bytes": 10,
                               "ts": now - age}))  # fmt: skip
        else:
            kind, field = rnd.choice([("compacted", "cleaned_up_to"), ("log_start", "log_start_offset")])
            out.append((True, {"type": kind, "topic": topic, "partition": p, field: rnd.randrange(600), "ts": now}))
    return out


def test_shares_in_spark_tasks_decide_what_the_driver_decides(
    spark, cluster, job_settings, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = 1_800_000_000_000
    topics = [cluster.name(f"data{i}") for i in range(6)]
    layers = {"global": {"dry.run": False, "consumed.retention.ms": H, "forced.retention.ms": 4 * H,
                         "max.compaction.lag.ms": 2 * H}}  # fmt: skip
    base = job_settings(thresholds=layers)
    for name in (base.topics.segments, base.topics.commits):
        cluster.create(name, 2)
    for is_segment, ev in events(topics, random.Random(5), now):
        cluster.send_raw(base.topics.segments if is_segment else base.topics.commits, json.dumps(ev).encode())
    cluster.flush()
    redis.Redis.from_url(redis_url).flushall()

    def run(slices: int) -> tuple[Controller, RecordingSink]:
        settings = base.model_copy(update={"redis_prefix": f"cd{slices}", "evaluation_slices": slices})
        state = settings.redis_state()
        sink = RecordingSink()
        ctl = Controller(state, layers, sink, None, Metrics(CollectorRegistry()), clock=lambda: now)
        app = Application.__new__(Application)  # only what `_slices_of` reads
        app.settings, app.stream_id = settings, "s"

        def handle(batch: Batch) -> None:
            ctl.on_batch("s", batch.batch_id, batch.collected.changes, app._slices_of(batch))

        spec = StreamSpec(
            kafka_options=java_options(settings.kafka_connection()),
            topics=[settings.topics.segments, settings.topics.commits],
            decoder=Decoder(settings.topics.segments, settings.topics.commits),
            checkpoint=tmp_path / f"ckpt-{slices}",
            max_rows_per_trigger=1_000_000,
            slices=slices,
        )
        StreamingJob(spec, spark, handle).start(once=True).awaitTermination()
        return ctl, sink

    with caplog.at_level(logging.INFO, logger="compactd"):
        (here, here_sink), (tasks, tasks_sink) = run(0), run(3)
    keys = here.state.all_partitions()
    assert len(keys) > 20 and tasks.state.all_partitions() == keys
    assert tasks.state.views(keys) == here.state.views(keys)
    assert tasks.state.records(keys) == here.state.records(keys)
    assert [here.state.deadline(*k) for k in keys] == [tasks.state.deadline(*k) for k in keys]
    assert tasks.metrics.partitions._stats == here.metrics.partitions._stats
    assert here_sink.executed and [r.to_json() for r in tasks_sink.executed] == [
        r.to_json() for r in here_sink.executed
    ]
    # each task merged and planned its slice, and said so
    lines = [r.getMessage() for r in caplog.records if "per-topic work in" in r.getMessage()]
    assert lines and "in 3 tasks" in lines[0], lines
    # task i merged the partitions of the topics in slice i, as `slice_of` assigns them on the driver
    merged = [int(n) for n in re.findall(r" merged (\d+)", lines[0])]
    assert merged == [sum(slice_of(t, 3) == i for t, _ in keys) for i in range(3)], (lines[0], keys)
    print(lines[0], len(here_sink.executed), len(keys))


def test_spark_tasks_own_the_topics_share_of_assigns(spark, job_settings, tmp_path: Path) -> None:
    """The job's repartition sends topic t to task `slice_of(t, n)`: the driver's split and Spark's agree."""
    from pyspark.sql import functions as F

    settings = job_settings()
    names = [f"topic-{i}.{'x' * (i % 7)}" for i in range(300)]
    for slices in (2, 3, 5):
        decoder = Decoder(settings.topics.segments, settings.topics.commits)
        spec = StreamSpec(java_options(settings.kafka_connection()), [], decoder, tmp_path, slices=slices)
        job = StreamingJob(spec, spark, lambda batch: None)
        df = spark.createDataFrame([(n,) for n in names], "topic string")
        got = df.repartition(slices, job._slice_key()).select("topic", F.spark_partition_id().alias("task")).collect()
        assert {r["topic"]: r["task"] for r in got} == {n: slice_of(n, slices) for n in names}
