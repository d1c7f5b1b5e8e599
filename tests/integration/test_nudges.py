"""Compaction nudges are put back whatever happens to Redis: the nudge ledger (a compacted topic) keeps each
original value from before the alter until it is back (real broker, real Redis; ground truth: the topic's config
as the broker describes it)."""

from __future__ import annotations

import os
import uuid
from typing import Any

from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from compactd.control.controller import NUDGE_CHECK_MS, Controller
from compactd.control.metrics import Metrics
from compactd.explain.text import _describe
from compactd.kafka.config import KafkaConnection
from compactd.kafka.topics import ClusterTopics
from compactd.local.broker import kafka_broker
from compactd.model import Segment
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.sinks.nudge_ledger import LifecycleRecords, NudgeLedger
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.integration.test_sinks_and_controller import topic_config
from tests.support import kraft
from tests.support.fixtures import Cluster

H = 3_600_000
T0 = 1_800_000_000_000
LAG = "max.compaction.lag.ms"


class Job:
    """A controller and its sink as the application wires them, on a clock the test moves."""

    def __init__(self, cluster, rclient, topic: str, rules: dict) -> None:
        self.clock = [T0]
        conn = KafkaConnection(cluster.bootstrap)
        self.ledger_topic = cluster.name("nudges")
        self.actions = cluster.name("actions")
        state = RedisState(rclient)
        self.sink = KafkaAdminSink(conn, state, ledger=NudgeLedger(conn, self.ledger_topic), clock=self.now)
        self.ctl = Controller(
            state,
            {"global": {"dry.run": False, "action.retry.ms": H}, f"topic:{topic}": rules},
            self.sink,
            AuditLog(conn, self.actions),
            Metrics(CollectorRegistry()),
            clock=self.now,
        )

    def now(self) -> int:
        return self.clock[0]

    def later(self, ms: int) -> None:
        self.clock[0] += ms


def setup(cluster, rclient, rules: dict | None = None) -> tuple[Job, str]:
    topic = cluster.name("ledger")
    cluster.create(topic, 1, {"cleanup.policy": "compact", LAG: "86400000"})
    for t in ("nudges", "actions"):
        cluster.create(cluster.name(t), 1, {"cleanup.policy": "compact"} if t == "nudges" else {})
    job = Job(cluster, rclient, topic, {LAG: H, **(rules or {})})
    overdue = Segment(0, 100, T0 - 2 * H, 1, T0 - 2 * H)
    c = BatchChanges()
    c.topic(topic).segments.append((0, overdue))
    job.ctl.on_batch("s", 0, c)
    assert topic_config(cluster.bootstrap, topic, LAG, want=("1", False)) == ("1", False)
    return job, topic


def test_a_nudge_is_put_back_after_redis_lost_it(cluster, rclient) -> None:
    job, topic = setup(cluster, rclient)
    [on] = job.sink.ledger.load()
    assert (on.topic, on.key, on.original, on.value) == (topic, LAG, "86400000", "1")

    rclient.flushall()  # the state is lost while the nudge is on
    job = Job(cluster, rclient, topic, {LAG: H})  # a restart (or a rebuild) on the empty Redis
    assert job.sink.recover_nudges() == 1
    assert job.ctl.state.nudged(topic) == {LAG: "86400000"}
    assert job.ctl.restore_nudges() == 1  # no compaction pending: the state knows none
    assert topic_config(cluster.bootstrap, topic, LAG, want=("86400000", False)) == ("86400000", False)
    assert job.sink.ledger.load() == [] and job.ctl.state.nudges() == []
    job.later(NUDGE_CHECK_MS)
    assert job.ctl.restore_nudges() == 0


def test_a_second_nudge_never_takes_compactds_own_value_for_the_original(cluster, rclient) -> None:
    """Redis flushed while a nudge was on, and the ledger not read back before the next nudge: the second nudge
    finds compactd's own `1` on the topic and takes the original from the ledger, never `1`."""
    job, topic = setup(cluster, rclient)
    rclient.flushall()
    job = Job(cluster, rclient, topic, {LAG: H})
    c = BatchChanges()
    c.topic(topic).segments.append((0, Segment(0, 100, T0 - 2 * H, 1, T0 - 2 * H)))
    job.ctl.on_batch("s", 0, c)  # nudged again: the topic holds `1` already, Redis remembers nothing
    assert job.ctl.state.nudged(topic) == {LAG: "86400000"}
    assert [n.original for n in job.sink.ledger.load()] == ["86400000"]
    c = BatchChanges()
    c.topic(topic).compacted.append((0, 100))  # the cleaner answers
    job.ctl.on_batch("s", 1, c)
    assert topic_config(cluster.bootstrap, topic, LAG, want=("86400000", False)) == ("86400000", False)


def test_with_nothing_remembered_anywhere_the_default_goes_back(cluster, rclient) -> None:
    """compactd's value on a topic with no record of it (Redis and the ledger both lost): the broker's default is
    put back, not `1` kept as if an operator had chosen it."""
    job, topic = setup(cluster, rclient)
    rclient.flushall()
    ledger = job.sink.ledger
    ledger.clear(topic, LAG)
    job = Job(cluster, rclient, topic, {LAG: H})
    c = BatchChanges()
    c.topic(topic).segments.append((0, Segment(0, 100, T0 - 2 * H, 1, T0 - 2 * H)))
    job.ctl.on_batch("s", 0, c)
    assert job.ctl.state.nudged(topic) == {LAG: None}
    c = BatchChanges()
    c.topic(topic).compacted.append((0, 100))
    job.ctl.on_batch("s", 1, c)
    kraft.until_config(cluster.conn, ResourceType.TOPIC, topic, LAG, lambda e: e.is_default, "the broker's default")


def test_an_unanswered_nudge_is_put_back_after_its_max_time_and_rests(cluster, rclient) -> None:
    job, topic = setup(cluster, rclient, {"compaction.nudge.max.ms": 10 * 60_000})
    job.later(NUDGE_CHECK_MS)
    assert job.ctl.restore_nudges() == 0  # a compaction is pending and the nudge is young
    assert topic_config(cluster.bootstrap, topic, LAG, want=("1", False)) == ("1", False)
    job.later(10 * 60_000)
    assert job.ctl.restore_nudges() == 1  # the cleaner never answered: put back anyway
    assert topic_config(cluster.bootstrap, topic, LAG, want=("86400000", False)) == ("86400000", False)
    job.later(H)  # the compaction is retried (action.retry.ms): the topic is resting, nothing is altered
    job.ctl.tick()
    assert topic_config(cluster.bootstrap, topic, LAG, want=("86400000", False)) == ("86400000", False)
    last = cluster.read_all(job.actions)[-1]
    assert (last["action"], last["status"]) == ("compact", "skipped")
    assert "compaction.nudge.max.ms" in last["detail"]["why"]


nudge_step = st.one_of(
    st.tuples(st.just("overdue")),
    st.tuples(st.just("answer")),
    st.tuples(st.just("redis_lost")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("time"), st.integers(1, 2 * H)),
)


@settings(
    max_examples=int(os.environ.get("COMPACTD_NUDGE_EXAMPLES", "8")),  # make soak: 60
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(nudge_step, min_size=3, max_size=12))
def test_every_nudge_is_eventually_put_back(cluster, rclient, history: list[tuple[Any, ...]]) -> None:
    """Generated: compactions falling overdue (a nudge), the cleaner answering, Redis losing everything, restarts and
    time passing, in any order; in the end the topic's config is what it was before compactd touched it."""
    rclient.flushall()
    topic = cluster.name(f"nudged-{uuid.uuid4().hex[:6]}")
    cluster.create(topic, 1, {"cleanup.policy": "compact", LAG: "86400000"})
    rules = {LAG: H, "compaction.nudge.max.ms": 3 * H}
    job, cleaned, batch = Job(cluster, rclient, topic, rules), 0, 0
    job.sink.recover_nudges()
    for op in history:
        c = BatchChanges()
        if op[0] == "overdue":  # a segment whose first record is past max.compaction.lag.ms
            closed = job.now() - 2 * H
            c.topic(topic).segments.append((0, Segment(cleaned, cleaned + 100, closed, 1, closed)))
            cleaned += 100
        elif op[0] == "answer":  # the cleaner caught up with everything rolled so far
            c.topic(topic).compacted.append((0, cleaned))
        elif op[0] in ("redis_lost", "restart"):
            if op[0] == "redis_lost":
                rclient.flushall()
            clock = job.clock
            job = Job(cluster, rclient, topic, rules)
            job.clock = clock
            job.sink.recover_nudges()  # what the application does at start and after a rebuild
        else:
            job.later(op[1])
            job.ctl.tick()
            job.ctl.restore_nudges()
        if c.topics:
            job.ctl.on_batch("s", batch, c)
            batch += 1
    # whatever happened, a nudge is put back within compaction.nudge.max.ms (and the next check)
    job.later(3 * H + NUDGE_CHECK_MS)
    job.ctl.restore_nudges()
    assert topic_config(cluster.bootstrap, topic, LAG, want=("86400000", False)) == ("86400000", False)
    assert job.ctl.state.nudges() == [] and [n for n in job.sink.ledger.load() if n.topic == topic] == []


def topic_config_source(bootstrap: str, topic: str, key: str) -> tuple[str, int]:
    """(value, ConfigSource) of a topic config as the broker describes it."""
    res = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = admin.describe_configs([res])[res].result(30)[key]
    return entry.value, entry.source


def test_a_restore_leaves_a_broker_wide_default_to_the_broker_and_an_operators_value_alone(rclient, tmp_path) -> None:
    """A broker-level dynamic config (`log.cleaner.max.compaction.lag.ms` set on the broker through the Admin API) is
    no override of the topic: the nudge is put back by deleting compactd's override, and the topic follows the
    broker's value after. A value an operator sets on the topic while the nudge is on is theirs: the restore leaves
    it. (A broker of its own: the setting reaches every topic on it.)"""
    broker = kafka_broker(tmp_path / "broker")
    try:
        cluster = Cluster(broker.bootstrap)
        conn = KafkaConnection(broker.bootstrap)
        kraft.alter(conn, ResourceType.BROKER, "1", {"log.cleaner.max.compaction.lag.ms": str(H)})
        dynamic_default = ConfigSource.DYNAMIC_BROKER_CONFIG.value
        probe = cluster.name("probe")  # the broker's value reaches its topics a moment after DescribeConfigs shows it
        cluster.create(probe, 1)
        kraft.until_config(conn, ResourceType.TOPIC, probe, LAG, lambda e: e.source == dynamic_default, "the broker's")
        topic = cluster.name("follows")
        cluster.create(topic, 1, {"cleanup.policy": "compact"})
        assert topic_config_source(broker.bootstrap, topic, LAG) == (str(H), dynamic_default)
        for t in ("nudges", "actions"):
            cluster.create(cluster.name(t), 1, {"cleanup.policy": "compact"} if t == "nudges" else {})
        job = Job(cluster, rclient, topic, {LAG: 60_000})
        c = BatchChanges()
        c.topic(topic).segments.append((0, Segment(0, 100, T0 - 2 * H, 1, T0 - 2 * H)))
        job.ctl.on_batch("s", 0, c)
        assert job.ctl.state.nudged(topic) == {LAG: None}  # the topic had no value of its own
        c = BatchChanges()
        c.topic(topic).compacted.append((0, 100))
        job.ctl.on_batch("s", 1, c)
        kraft.until_config(
            conn, ResourceType.TOPIC, topic, LAG, lambda e: e.source == dynamic_default, "compactd's override deleted"
        )
        assert topic_config_source(broker.bootstrap, topic, LAG) == (str(H), dynamic_default)

        # nudged again; an operator sets a value of their own on the topic meanwhile: the restore leaves it
        c = BatchChanges()
        c.topic(topic).segments.append((0, Segment(100, 200, T0 - 2 * H, 1, T0 - 2 * H)))
        job.later(H)
        job.ctl.on_batch("s", 2, c)
        kraft.until_config(conn, ResourceType.TOPIC, topic, LAG, lambda e: e.value == "1", "nudged again")
        cluster.alter(topic, {LAG: "5000"})  # the operator's value
        c = BatchChanges()
        c.topic(topic).compacted.append((0, 200))
        job.ctl.on_batch("s", 3, c)
        kraft.settled(conn)  # a restore the controller was sent would show by now
        assert topic_config_source(broker.bootstrap, topic, LAG) == ("5000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        assert job.ctl.state.nudges() == [] and job.sink.ledger.load() == []
    finally:
        broker.stop()


def test_a_nudge_kafka_would_refuse_is_raised_to_the_topics_min_compaction_lag(cluster, rclient) -> None:
    """Kafka refuses `max.compaction.lag.ms` below the topic's `min.compaction.lag.ms`: a nudge of `1` failed at every
    retry. The nudge takes the smallest value the topic allows, and the restore puts the original back."""
    topic = cluster.name("floored")
    cluster.create(topic, 1, {"cleanup.policy": "compact", LAG: "86400000", "min.compaction.lag.ms": "60000"})
    for t in ("nudges", "actions"):
        cluster.create(cluster.name(t), 1, {"cleanup.policy": "compact"} if t == "nudges" else {})
    job = Job(cluster, rclient, topic, {LAG: H})
    c = BatchChanges()
    c.topic(topic).segments.append((0, Segment(0, 100, T0 - 2 * H, 1, T0 - 2 * H)))
    job.ctl.on_batch("s", 0, c)
    assert topic_config(cluster.bootstrap, topic, LAG, want=("60000", False)) == ("60000", False)
    [sent] = cluster.read_all(job.actions)
    assert (sent["action"], sent["status"], sent["detail"]["value"]) == ("compact", "sent", "60000")
    # explain says why the value is not 1
    described = _describe(sent, T0)
    assert "nudged max.compaction.lag.ms=60000, the lowest its min.compaction.lag.ms allows" in described
    c = BatchChanges()
    c.topic(topic).compacted.append((0, 100))
    job.ctl.on_batch("s", 1, c)
    assert topic_config(cluster.bootstrap, topic, LAG, want=("86400000", False)) == ("86400000", False)


def test_a_topic_deleted_for_good_takes_its_nudges_original_with_it(cluster, rclient) -> None:
    """The topic is deleted while nudged and forgotten: its original leaves the ledger too, so a topic created later
    under the name, whose config is its own, is never given the old one's original by a recovery."""
    job, topic = setup(cluster, rclient)
    conn = KafkaConnection(cluster.bootstrap)
    ctl = Controller(
        job.ctl.state,
        {"global": {"dry.run": False}, f"topic:{topic}": {LAG: H}},
        job.sink,
        None,
        Metrics(CollectorRegistry()),
        clock=job.now,
        topics=ClusterTopics(conn),
        records=LifecycleRecords(job.sink.ledger, dict),
    )
    ctl.sweep_topics()  # records the topic's ID
    cluster.delete(topic)
    ctl.sweep_topics()
    ctl.sweep_topics()  # missing twice: forgotten
    assert job.ctl.state.nudges() == [] and job.sink.ledger.load() == []
    cluster.create(topic, 1, {"cleanup.policy": "compact", LAG: "5000"})  # again, under the same name
    assert job.sink.recover_nudges() == 0
    assert topic_config(cluster.bootstrap, topic, LAG, want=("5000", False)) == ("5000", False)
