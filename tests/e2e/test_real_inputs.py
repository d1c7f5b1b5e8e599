"""End to end with Kafka's own formats: binary __consumer_offsets records, and a watched log directory."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from compactd.agent.agent import KafkaPublisher, SegmentAgent, run_agent
from compactd.codec.offsets import (
    GroupValue,
    Member,
    OffsetValue,
    encode_assignment,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.daemon.application import Application
from compactd.kafka.config import KafkaConnection
from compactd.model import Segment
from compactd.policy.plan import NOT_CAUGHT_UP
from compactd.policy.readiness import Readiness
from compactd.policy.rules import earliest_uncompacted_ts
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support.events import old_segments
from tests.support.segments import encode_batch_v2, write_checkpoint

H = 3_600_000


def membership(now: int, assigned: dict[str, list[int]]) -> bytes:
    """A consumer group's metadata record (value v3) with one member per assigned topic, or none (Empty)."""
    members = tuple(
        Member(f"m-{t}", "c", "/127.0.0.1", 30_000, b"", encode_assignment({t: ps}), 60_000, None)
        for t, ps in assigned.items()
    )
    return encode_group_value(GroupValue(3, "consumer", 1, "range" if members else None, None, now, members))


@pytest.mark.spark
def test_binary_offsets_drive_deletes_and_group_tombstone_frees_the_minimum(spark, cluster, job_settings) -> None:
    now = int(time.time() * 1000)
    data, offsets_topic = cluster.name("data"), cluster.name("offsets")
    cluster.create(data, 1, {"cleanup.policy": "delete"})
    cluster.create(offsets_topic, 3)
    cluster.fill(data, 300)
    settings = job_settings(
        offsets_source="consumer_offsets",
        thresholds={"global": {"dry.run": False}, f"topic:{data}": {"consumed.retention.ms": H}},
    )
    settings.topics.consumer_offsets = offsets_topic
    cluster.send(settings.topics.segments, old_segments(data, [100, 200], now))
    commits = [("slow", 50, 1, 3), ("fast", 120, 1, 4), ("fast", 250, 0, 2), ("other", 260, 1, 0)]
    home = {"slow": 0, "fast": 1, "other": 2}  # a group's records live in one partition, as on a broker
    for group, offset, key_version, value_version in commits:
        value = OffsetValue(value_version, offset, "", now, leader_epoch=3 if value_version >= 3 else -1)
        cluster.send_raw(
            offsets_topic,
            encode_offset_value(value),
            encode_offset_key(group, data, 0, key_version),
            partition=home[group],
        )
    cluster.send_raw(offsets_topic, b"\x00\x07garbage", encode_offset_key("bad", data, 0))  # undecodable value
    cluster.send_raw(offsets_topic, b"x", b"\x00\x09share-group-record")  # key v9: skipped, not failed
    cluster.flush()

    with Application(settings, spark=spark) as job:
        job.run(once=True)
        assert job.readiness.ready()
    assert [a for a in cluster.read_all(settings.topics.actions)] == []  # "slow" at 50 holds both segments
    assert [d["reason"] for d in cluster.read_all(settings.topics.dlq)] == ["undecodable"]

    # "slow" is deleted as Kafka deletes a group (its offsets' tombstones, then the group's), but "newbie" now has a
    # member assigned to the partition and has committed nothing
    cluster.send_raw(offsets_topic, None, encode_offset_key("slow", data, 0), partition=home["slow"])
    cluster.send_raw(offsets_topic, None, encode_group_key("slow"), partition=home["slow"])
    cluster.send_raw(offsets_topic, membership(now, {data: [0]}), encode_group_key("newbie"), partition=2)
    cluster.flush()
    with Application(settings, spark=spark) as job:
        job.run(once=True)
        assert job.state.view(data, 0).min_committed is None
    assert cluster.read_all(settings.topics.actions) == []
    cluster.send_raw(offsets_topic, membership(now, {}), encode_group_key("newbie"), partition=2)  # it left
    cluster.flush()
    with Application(settings, spark=spark) as job:
        job.run(once=True)
    got = cluster.read_all(settings.topics.actions)
    assert [(a["action"], a["before_offset"], a["reason"], a["status"]) for a in got] == [
        ("delete_records", 200, "consumed_retention", "sent")
    ]
    assert cluster.watermarks(data) == (200, 300)


def test_readiness_gate_skips_deletes_until_caught_up(cluster, rclient) -> None:
    topic = cluster.name("gate")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 300)
    actions = cluster.name("actions")
    cluster.create(actions)
    gate = Readiness({"offsets": {"0": 10, "1": 5}})
    state = RedisState(rclient)
    ctl = Controller(
        state,
        {"global": {"dry.run": False}, f"topic:{topic}": {"forced.retention.ms": 0}},
        KafkaAdminSink(KafkaConnection(cluster.bootstrap), state),
        AuditLog(KafkaConnection(cluster.bootstrap), actions),
        Metrics(CollectorRegistry()),
        deletes_allowed=gate.ready,
    )
    c = BatchChanges()
    c.topic(topic).segments.append((0, Segment(0, 100, 0, 1, 0)))
    ctl.on_batch("s", 0, c)
    assert [(a["status"], a["detail"]["why"]) for a in cluster.read_all(actions)] == [("skipped", NOT_CAUGHT_UP)]
    assert cluster.watermarks(topic) == (0, 300)
    assert not gate.observe({"offsets": {"0": 10, "1": 4}})
    assert gate.observe({"offsets": {"0": 12, "1": 5}})
    ctl.evaluate_all()
    assert [a["status"] for a in cluster.read_all(actions)] == ["skipped", "sent"]
    assert cluster.watermarks(topic) == (100, 300)


@pytest.mark.versions
@pytest.mark.spark
def test_agent_new_segment_file_moves_earliest_uncompacted(spark, cluster, job_settings, redis_url, tmp_path) -> None:
    t0 = int(time.time() * 1000) - 10 * H
    logs = tmp_path / "kafka-logs"
    pdir = logs / "orders-0"
    pdir.mkdir(parents=True)
    (pdir / f"{0:020d}.log").write_bytes(encode_batch_v2(0, t0, t0 + 1))
    (pdir / f"{100:020d}.log").write_bytes(encode_batch_v2(100, t0 + 50, t0 + 51))  # active
    settings = job_settings(trigger_interval_ms=500)
    cluster.create(settings.topics.segments)
    state = settings.redis_state()
    stop = threading.Event()

    def wait_for(predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, what
            time.sleep(0.2)

    agent = SegmentAgent([logs])
    publisher = KafkaPublisher(KafkaConnection(cluster.bootstrap), settings.topics.segments)
    threads = []
    with Application(settings, spark=spark) as job:
        threads = [
            threading.Thread(target=job.run, kwargs={"stop": stop}),
            threading.Thread(target=run_agent, args=(agent, publisher, 0.3, stop)),
        ]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: earliest_uncompacted_ts(state.view("orders", 0)) == t0 + 1, "first segment not merged")
            # the cleaner compacts segment 0, and the broker rolls: segment 100 is closed now
            write_checkpoint(logs / "cleaner-offset-checkpoint", {("orders", 0): 100})
            (pdir / f"{200:020d}.log").write_bytes(encode_batch_v2(200, t0 + 90, t0 + 91))
            wait_for(lambda: earliest_uncompacted_ts(state.view("orders", 0)) == t0 + 51, "new segment not seen")
        finally:
            stop.set()
            for t in threads:
                t.join(120)
    view = state.view("orders", 0)
    assert view.cleaned_up_to == 100 and [s.base_offset for s in view.segments] == [0, 100]
    assert view.segments[1] == Segment(100, 200, t0 + 51, 61, view.segments[1].closed_at)
