"""A compaction's read of a range fails when it stops progressing, never for how long the whole range takes: ranges
are 1M offsets, and 1M records of 10 KB never fit a fixed deadline (every run failed, the horizon never moved). Both
readers, on the real broker: the JVM task (`ViewRun.java`, through `run_in_jvm`) and the Python one
(`kafka/range_read.py`, the shuffle path's and the view's reader).

Small scale, the same rule: a stall deadline of STALL_MS (`compaction_read_stall_ms`), a range whose records arrive one
at a time for several times that long (the read always progressing), and a range whose end never arrives (the read
stuck: "read stalled"). The full size (1.2M records of 20 KB in one partition, 24 GB) is the compaction benchmark's:
`COMPACTD_BENCH_RECORDS=1200000 COMPACTD_BENCH_PARTITIONS=1 COMPACTD_BENCH_VALUE_BYTES=20480 python bench/compaction.py`
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Producer

from compactd.compaction.spark_run import ReadRange, RunInput, WriteSpec, run_in_jvm
from compactd.kafka.range_read import KafkaRange, read_messages, reader_conf
from compactd.streaming.connector import java_options

# a stall deadline 10 times the records' pace, so a loaded machine's slow fetch is not a stall; the range still takes
# longer than two deadlines in all (the last record comes 7.2 s after the first)
STALL_MS = 3_000
AT_ONCE, TRICKLED, EVERY_S = 10, 24, 0.3
NOW = 1_800_000_000_000


def send(producer: Producer, topic: str, i: int) -> None:
    producer.produce(topic, key=f"k{i}".encode(), value=b"v" * 100, partition=0)
    producer.flush(10)


def written(cluster: Any, topic: str, count: int) -> None:
    """`count` records into partition 0 at once: the range a stuck read has read before its end never comes."""
    producer = Producer(cluster.conn.client("producer", {"linger.ms": 0}))
    for i in range(count):
        send(producer, topic, i)


@contextmanager
def trickle(cluster: Any, topic: str) -> Iterator[None]:
    """AT_ONCE records into partition 0 now, then TRICKLED more, one every EVERY_S seconds, from a thread: a range
    that grows under its reader as a slow fetch of large records would."""
    producer = Producer(cluster.conn.client("producer", {"linger.ms": 0}))
    for i in range(AT_ONCE):
        send(producer, topic, i)

    def rest() -> None:
        for i in range(AT_ONCE, AT_ONCE + TRICKLED):
            time.sleep(EVERY_S)  # the pace of the records' arrival, not a wait for a condition
            send(producer, topic, i)

    thread = threading.Thread(target=rest, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(30)


def topics(cluster: Any, base: str) -> str:
    topic = cluster.name(f"{base}{uuid.uuid4().hex[:6]}")
    cluster.create(topic, 1)
    cluster.create(f"{topic}.compacted", 1)
    return topic


def jvm_run(cluster: Any, spark: Any, topic: str, end: int) -> list[dict]:
    spec = WriteSpec({}, {}, f"{topic}.compacted", NOW, 0, java_options(cluster.conn))
    job = RunInput([ReadRange(topic, 0, 0, end, False)], {"kind": "offset"}, False, 1, stall_ms=STALL_MS)
    return run_in_jvm(spark, {}, job, spec)


@pytest.fixture
def warm(cluster: Any, spark: Any) -> None:
    """One finished task first: a cold JVM's first task loads the Kafka client's classes and connects (seconds on
    these machines), which is no read's stall; the timed runs borrow the connected clients it gave back."""
    topic = topics(cluster, "jvmwarm")
    cluster.fill(topic, 1)
    jvm_run(cluster, spark, topic, 1)


def python_read(cluster: Any, topic: str, end: int) -> list[int]:
    conf = reader_conf(cluster.conn)
    return [
        m.offset() for msgs in read_messages(conf, KafkaRange(topic, 0, 0, end), STALL_MS, strict=True) for m in msgs
    ]


@pytest.mark.spark
def test_the_jvm_task_reads_a_range_longer_than_its_stall_deadline_while_it_progresses(
    cluster: Any, spark: Any, warm: None
) -> None:
    topic = topics(cluster, "jvmslow")
    end = AT_ONCE + TRICKLED
    t0 = time.monotonic()
    with trickle(cluster, topic):
        reports = jvm_run(cluster, spark, topic, end)
    took = time.monotonic() - t0
    assert [(r["partition"], r["records_in"], r["written"]) for r in reports] == [(0, end, end)]
    assert took > 2 * STALL_MS / 1000  # the whole range took longer than the deadline: it is one on progress


@pytest.mark.spark
def test_the_jvm_task_still_fails_a_read_that_stops_progressing(cluster: Any, spark: Any, warm: None) -> None:
    from compactd.streaming.job import root_cause

    topic = topics(cluster, "jvmstuck")
    end = AT_ONCE + TRICKLED
    written(cluster, topic, end)
    with pytest.raises(Exception) as failed:
        jvm_run(cluster, spark, topic, end + 5)  # the last 5 offsets never come
    line = root_cause(f"{type(failed.value).__name__}: {failed.value}")
    assert line.startswith(f"ViewRunException: {topic}/0: read stalled at {end} of [0,{end + 5})"), line
    assert cluster.watermarks(f"{topic}.compacted", 0) == (0, 0)  # nothing written


def test_the_python_reader_reads_a_range_longer_than_its_stall_deadline_while_it_progresses(cluster: Any) -> None:
    topic = topics(cluster, "pyslow")
    end = AT_ONCE + TRICKLED
    t0 = time.monotonic()
    with trickle(cluster, topic):
        offsets = python_read(cluster, topic, end)
    assert offsets == list(range(end))
    assert time.monotonic() - t0 > 2 * STALL_MS / 1000


def test_the_python_reader_still_fails_a_read_that_stops_progressing(cluster: Any) -> None:
    from compactd.errors import SourceReadError

    topic = topics(cluster, "pystuck")
    end = AT_ONCE + TRICKLED
    written(cluster, topic, end)
    with pytest.raises(SourceReadError, match=rf"^{topic}/0: read stalled at {end} of \[0,{end + 5}\)"):
        python_read(cluster, topic, end + 5)
