"""The compaction's JVM task (streaming/jvm/java/io/compactd/compaction/ViewRun.java) against the pure rules, through
the real broker: on generated histories (keys reused and absent, tombstones, timestamps tied and out of order, version
headers missing, null, malformed, out of a long's range, of another name or given twice), each strategy under both
tombstone rules writes into the view exactly what `reduce.reduce_partition` keeps, in source-offset order, with the
contract's headers, and counts what the reference counts. A second generation reads the first one back from the view."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactd.compaction.reduce import Record, reduce_partition
from compactd.compaction.spark_run import (
    OFFSET_HEADER,
    RESERVED,
    ReadRange,
    ReadTask,
    RunInput,
    WriteSpec,
    jvm_task,
    view_run,
)
from compactd.compaction.strategy import LONG_MAX, LONG_MIN, Strategy, header_version
from compactd.streaming.connector import java_options
from tests.support.examples import examples

pytestmark = pytest.mark.spark

STRATEGIES = [
    Strategy.of(kind, "v" if kind == "header" else None, fmt, tombstone)  # type: ignore[arg-type]
    for kind, fmt in (("offset", "long"), ("timestamp", "long"), ("header", "long"), ("header", "decimal"))
    for tombstone in ("version", "latest")
]
ODD_VALUES = [b"12", b" -7 ", b"+5", b"\x1f3\x0b", b"x", b"", b"1e3", b"\xff1", b"007", b"99999999999999999999",
              b"-9223372036854775808", b"9223372036854775808", b"\t+0\r", b"+", b"-", b"\x85"]  # fmt: skip
header_value = (
    st.none()
    | st.sampled_from(ODD_VALUES)
    | st.integers(LONG_MIN, LONG_MAX).map(lambda v: v.to_bytes(8, "big", signed=True))
    | st.binary(max_size=9)
)
# compactd's own header names on source records (a topic mirrored from a view): they must mean nothing there
headers = st.lists(st.tuples(st.sampled_from(["v", "v", "w", *sorted(RESERVED)]), header_value), max_size=3)
record = st.tuples(
    st.sampled_from([None, b"a", b"b", b"c", b"d"]),  # key
    st.sampled_from([None, b"x", b"y"]),  # value: None is a tombstone
    st.integers(-5, 5),  # timestamps tie and go back
    headers,
)
NOW = 1_800_000_000_000


def send(conn: Any, topic: str, history: list[list[tuple]], base_ts: int) -> dict[int, list[Record]]:
    """The history into `topic`, partition by partition; the records as a run reads them: as stored, without
    compactd's own headers (RESERVED: a source record's copy means nothing, spark_run.message_fields)."""
    producer = Producer(conn.client("producer", {"linger.ms": 5}))
    stored: dict[int, list[Record]] = {p: [] for p in range(len(history))}
    for p, recs in enumerate(history):
        for k, v, dt, h in recs:

            def done(err: Any, msg: Any, k: Any = k, v: Any = v, ts: int = base_ts + dt, h: Any = h) -> None:
                assert err is None, err
                own = tuple((name, raw) for name, raw in h if name not in RESERVED)
                stored[msg.partition()].append(Record(msg.offset(), ts, k, v, own))

            producer.produce(topic, key=k, value=v, partition=p, timestamp=base_ts + dt, headers=h, on_delivery=done)
        producer.flush(30)
    for recs in stored.values():
        recs.sort(key=lambda r: r.offset)
    return stored


def read_views(cluster: Any, ends: dict[tuple[str, int], int]) -> dict[tuple[str, int], list[tuple]]:
    """Every record of the views' partitions up to `ends`, by (view, partition): (key, value, timestamp, headers)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(cluster.conn.client("consumer", forced={"group.id": f"t-{uuid.uuid4()}", "enable.auto.commit": False}))
    c.assign([TopicPartition(t, p, 0) for (t, p), end in ends.items() if end > 0])
    out: dict[tuple[str, int], list[tuple]] = {tp: [] for tp in ends}
    deadline = time.monotonic() + 60
    while sum(map(len, out.values())) < sum(ends.values()) and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            assert m.error() is None, m.error()
            out[(m.topic(), m.partition())].append((m.key(), m.value(), m.timestamp()[1], tuple(m.headers() or ())))
    c.close()
    return out


def run_tasks(spark: Any, spec: WriteSpec, tasks: dict[str, str]) -> dict[str, dict[int, dict]]:
    """Several `ViewRun` tasks (one per view) as one Spark job, the way `run_in_jvm` runs them; reports by view."""
    from pyspark.sql import functions as F

    name = view_run(spark, spec)
    df = spark.createDataFrame(list(tasks.items()), "view string, task string").repartition(len(tasks))
    rows = df.select("view", F.call_udf(name, F.col("task")).alias("report")).collect()
    return {r["view"]: {rep["partition"]: rep for rep in json.loads(r["report"])} for r in rows}


def strategy_options(s: Strategy) -> dict[str, Any]:
    return {"kind": s.kind, "header": s.header, "header_format": s.header_format, "tombstone": s.tombstone}


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(
    history=st.lists(st.lists(record, max_size=30), min_size=1, max_size=3),
    split=st.integers(0, 30),
    hold=st.sampled_from([250_000, 0]),  # 0: every partition read twice, its keys in the task's map
)
def test_the_jvm_task_writes_what_the_pure_rules_keep(
    cluster: Any, spark: Any, history: list, split: int, hold: int
) -> None:
    topic = cluster.name(f"jvm{uuid.uuid4().hex[:6]}")
    parts = len(history)
    views = {s: f"{topic}.v{i}" for i, s in enumerate(STRATEGIES)}
    for t in (topic, *views.values()):
        cluster.create(t, parts)
    stored = send(cluster.conn, topic, history, int(time.time() * 1000) - 60_000)
    java = java_options(cluster.conn)
    cut = {p: min(split, len(stored[p])) for p in range(parts)}
    # generation 1: the first `split` records of each partition, tombstones kept (stamped NOW); generation 2: the view
    # read back plus the rest, at NOW + 1 with a retention of 1 ms (generation 1's tombstones expire, new ones stay)
    gens = ((NOW, 2**62), (NOW + 1, 1))
    ranges = {s: [ReadRange(topic, p, 0, cut[p], False) for p in range(parts)] for s in STRATEGIES}
    previous: dict[Strategy, dict[int, list[Record]]] = {s: {p: [] for p in range(parts)} for s in STRATEGIES}
    written: dict[tuple[Strategy, int], list[tuple]] = {}
    for gen, (now, retention) in enumerate(gens, 1):
        tasks = {
            views[s]: jvm_task(ReadTask(tuple(ranges[s])),
                               RunInput([], strategy_options(s), False, parts, hold, stall_ms=30_000),
                               WriteSpec({}, {}, views[s], now, retention, java))
            for s in STRATEGIES
        }  # fmt: skip
        reports = run_tasks(spark, WriteSpec({}, {}, "", now, retention, java), tasks)
        for s in STRATEGIES:
            nxt: list[ReadRange] = []
            for p in range(parts):
                source = stored[p][: cut[p]] if gen == 1 else stored[p][cut[p] :]
                kept, counts = reduce_partition(previous[s][p], source, s, now, retention)
                rep = reports[views[s]].get(p)
                if not source and not previous[s][p]:
                    assert rep is None, (s, gen, p)
                    continue
                assert rep is not None, (s, gen, p)
                assert (rep["records_in"], rep["null_keys"], rep["keys"], rep["tombstones"], rep["expired"]) == (
                    counts.records_in, counts.null_keys, counts.keys, counts.tombstones, counts.tombstones_expired
                ), (s, gen, p)  # fmt: skip
                assert rep["written"] == rep["view_end"] - rep["view_start"] == len(kept), (s, gen, p)
                want = [(r.key, r.value, r.timestamp, (*r.headers, (OFFSET_HEADER, str(r.offset).encode())))
                        for r in kept]  # fmt: skip
                written[(s, p)] = written.get((s, p), []) + want
                # the view's records as the next generation reads them: its own offset headers are the view's
                previous[s][p] = [
                    Record(r.offset, r.timestamp, r.key, r.value, tuple(h for h in r.headers if h[0] != OFFSET_HEADER))
                    for r in kept
                ]
                nxt.append(ReadRange(views[s], p, rep["view_start"], rep["view_end"], True))
            ranges[s] = nxt + [ReadRange(topic, p, cut[p], len(stored[p]), False) for p in range(parts)]
    got = read_views(cluster, {(views[s], p): len(recs) for (s, p), recs in written.items()})
    for (s, p), want in written.items():
        assert got[(views[s], p)] == want, (s, p)


def test_header_versions_parse_as_the_pure_rule_parses(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    values = [None, *ODD_VALUES, *(v.to_bytes(8, "big", signed=True) for v in (0, -1, LONG_MIN, LONG_MAX, 7)),
              b"\x00" * 7, b"\x00" * 9]  # fmt: skip
    cases = [[("v", v)] for v in values] + [[], [("w", b"5")], [("v", b"5"), ("v", b"x")], [("v", b"x"), ("v", b"6")]]
    for fmt in ("long", "decimal"):
        for case in cases:
            headers = jvm.java.util.ArrayList()
            for name, value in case:
                headers.add(jvm.org.apache.kafka.common.header.internals.RecordHeader(name, value))
            got = jvm.io.compactd.compaction.ViewRun.headerVersion(headers, "v", fmt == "decimal")
            assert got == header_version(case, "v", fmt), (fmt, case)  # type: ignore[arg-type]


def test_records_deleted_under_a_task_fail_it_with_one_line(cluster: Any, spark: Any) -> None:
    """A range whose start the source's retention (or a deleteRecords) took after the run planned it: the task fails,
    never skips (what the deleted records replaced would come back), and the run's error is one line naming it."""
    from confluent_kafka import TopicPartition

    from compactd.compaction.spark_run import run_in_jvm
    from compactd.streaming.job import root_cause

    topic = cluster.name("jvmgone")
    cluster.create(topic, 1)
    cluster.create(f"{topic}.compacted", 1)
    send(cluster.conn, topic, [[(b"k", b"v", 0, [])] * 10], int(time.time() * 1000))
    for fut in cluster.admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        fut.result(30)
    spec = WriteSpec({}, {}, f"{topic}.compacted", NOW, 0, java_options(cluster.conn))
    with pytest.raises(Exception) as failed:
        run_in_jvm(
            spark, {}, RunInput([ReadRange(topic, 0, 0, 10, False)], strategy_options(Strategy()), False, 1), spec
        )
    line = root_cause(f"{type(failed.value).__name__}: {failed.value}")
    assert line == (
        f"ViewRunException: {topic}/0: offsets from 0 were deleted before they were read (the topic's retention, "
        "or a deleteRecords)"
    )
    assert cluster.watermarks(f"{topic}.compacted", 0) == (0, 0)  # nothing written


def test_a_task_takes_idle_clients_and_a_failed_task_closes_its_own(cluster: Any, spark: Any) -> None:
    """Tasks pool their Java clients by settings (a new set connects three clients first); a failed task's set may
    be in any state, so it is closed, never handed to the next task."""
    from confluent_kafka import TopicPartition

    from compactd.compaction.spark_run import clients_json, run_in_jvm

    pool = spark.sparkContext._jvm.io.compactd.compaction.ViewRun
    topic = cluster.name("jvmpool")
    cluster.create(topic, 1)
    cluster.create(f"{topic}.compacted", 1)
    send(cluster.conn, topic, [[(b"k", b"v", 0, [])] * 10], int(time.time() * 1000))
    spec = WriteSpec({}, {}, f"{topic}.compacted", NOW, 0, java_options(cluster.conn))
    job = RunInput([ReadRange(topic, 0, 0, 10, False)], strategy_options(Strategy()), False, 1)
    key = clients_json(spec)
    run_in_jvm(spark, {}, job, spec)
    idle = pool.idleSets(key)
    assert idle >= 1  # the task gave its set back
    run_in_jvm(spark, {}, job, spec)
    assert pool.idleSets(key) == idle  # the next task took it and gave it back: no new set
    for fut in cluster.admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        fut.result(30)
    with pytest.raises(Exception, match="were deleted before they were read"):
        run_in_jvm(spark, {}, job, spec)
    assert pool.idleSets(key) == idle - 1  # taken, failed, closed


def test_the_clients_credentials_stay_out_of_the_query() -> None:
    """A task's JSON is a literal of the Spark query, and Spark shows plans with their literals (UI, event logs,
    `explain`): the Kafka clients' settings, a SASL password among them, travel inside the function instead."""
    secret = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cret";'
    spec = WriteSpec({}, {}, "t.compacted", NOW, 0, {"bootstrap.servers": "b:9092", "sasl.jaas.config": secret})
    task = jvm_task(ReadTask((ReadRange("t", 0, 0, 10, False),)), RunInput([], {"kind": "offset"}, False, 1), spec)
    assert "s3cret" not in task and "b:9092" not in task
    assert json.loads(task)["ranges"] == [
        {"topic": "t", "partition": 0, "start": 0, "end": 10, "from_view": False, "below": -1}
    ]
