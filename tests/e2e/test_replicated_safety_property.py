"""The deleteRecords safety property on three Kafka nodes with nodes dying under it, generated (`make soak`).

Histories interleave records written, a group's commits (forwards and rewinds, through its coordinator), segments
rolling, time passing, and a node killed with -9 and started again (one at a time: the KRaft quorum and min ISR 2 hold).
The real controller decides and sends through the real sinks and checks (the cluster's group offsets, the topic's
identity) on a 3-node cluster with replication factor 3. After every step the property is checked on the brokers' own
log starts, not on compactd's records:

- a partition's log start moves only to an end of a segment compactd was told of (nothing deleted that no rule made
  due);
- never past the group: a log start that moved is at or below an offset the group had committed since it last moved
  (a delete decided and sent before a rewind may complete after it, on a node that had stopped answering).

COMPACTD_REPLICATED_EXAMPLES sets the number of histories (default 8).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.kafka.config import KafkaConnection
from compactd.kafka.groups import ClusterGroupOffsets
from compactd.kafka.topics import ClusterTopics
from compactd.model import Segment
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support.fixtures import Cluster
from tests.support.groups import commit
from tests.support.kraft import unanswered
from tests.support.waiting import wait_until

H = 3_600_000
PARTS = (0, 1)
EXAMPLES = int(os.environ.get("COMPACTD_REPLICATED_EXAMPLES", "8"))

step = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(PARTS), st.integers(1, 200)),
    st.tuples(st.just("produce"), st.sampled_from(PARTS), st.integers(1, 200)),
    # where the group commits, as a share of the records above the log start: all of them (caught up), or any
    st.tuples(st.just("commit"), st.sampled_from(PARTS), st.just(1.0)),
    st.tuples(st.just("commit"), st.sampled_from(PARTS), st.floats(0, 1)),
    st.tuples(st.just("roll"), st.sampled_from(PARTS)),
    st.tuples(st.just("roll"), st.sampled_from(PARTS)),
    st.tuples(st.just("time"), st.integers(1, 3 * H)),
    st.tuples(st.just("kill"), st.sampled_from((1, 2, 3))),
    st.tuples(st.just("restart")),
)


def produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    """`n` records with acks=all, by a producer of its own: one made before a node died kept asking it for 30 s."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 120_000})
    for i in range(n):
        producer.produce(topic, value=b"x", key=b"k%d" % i, partition=partition)
    assert producer.flush(150) == 0, f"{topic}/{partition}: records not delivered in 150 s"


@pytest.mark.soak
# no shrinking: each history kills and starts nodes (tens of seconds), and one shrink took over five minutes without
# progress; the failing history is reported as generated
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(st.lists(step, min_size=4, max_size=16))
def test_no_delete_past_the_group_nor_off_a_known_segment_end_while_nodes_die(
    kafka3: Any, rclient: redis.Redis, history: list[tuple[Any, ...]]
) -> None:
    for node in kafka3.nodes:  # an earlier history may have ended with one down
        node.start()
    rclient.flushall()
    cluster = Cluster(kafka3.bootstrap, replication=3)
    conn = KafkaConnection(kafka3.bootstrap)
    topic, actions = cluster.name(f"prop{uuid.uuid4().hex[:6]}"), cluster.name("actions")
    group = cluster.name("billing")
    cluster.create(topic, len(PARTS), {"cleanup.policy": "delete"})
    cluster.create(actions, exist_ok=True)
    now = [int(time.time() * 1000)]
    state = RedisState(rclient)
    ctl = Controller(
        state,
        {"global": {"dry.run": False, "action.retry.ms": 1000}, f"topic:{topic}": {"consumed.retention.ms": H}},
        KafkaAdminSink(conn, state, timeout_s=5.0),
        AuditLog(conn, actions, timeout_s=5.0),
        Metrics(CollectorRegistry()),
        clock=lambda: now[0],
        cluster_offsets=ClusterGroupOffsets(conn, ttl_s=0, timeout_s=5.0).check,
        topics=ClusterTopics(conn, timeout_s=5.0),
    )
    batches = iter(range(1_000_000))

    def merge(changes: BatchChanges) -> None:
        ctl.on_batch("s", next(batches), changes)

    def watermarks(p: int) -> tuple[int, int]:
        return wait_until(f"{topic}/{p}'s watermarks", lambda: cluster.watermarks(topic, p), lambda _: True, 60,
                          tolerate=unanswered)  # fmt: skip

    # every partition starts with 300 records in a closed segment compactd knows: a commit past it makes a delete due
    bound = BatchChanges()
    bound.topic(topic).log_start.extend((p, 0) for p in PARTS)
    for p in PARTS:
        produce(kafka3.bootstrap, topic, p, 300)
        bound.topic(topic).segments.append((p, Segment(0, 300, now[0] - 2 * H, 100, now[0] - 2 * H)))
    merge(bound)  # the topic's ID bound to its state too
    ends = dict.fromkeys(PARTS, 300)  # where the last segment compactd was told of ends
    known = {p: {0, 300} for p in PARTS}  # the offsets a log start may move to: 0 and those segment ends
    allowed = dict.fromkeys(PARTS, -1)  # the highest commit of the group since the log start last moved
    committed: dict[int, int] = {}
    low = dict.fromkeys(PARTS, 0)
    down: int | None = None
    try:
        for op in history:
            if op[0] == "produce":
                produce(kafka3.bootstrap, topic, op[1], op[2])
            elif op[0] == "commit":
                p = op[1]
                start, high = watermarks(p)
                offset = start + int(op[2] * (high - start))  # forwards or back, never below the log start
                commit(kafka3.bootstrap, group, topic, {p: offset})
                committed[p] = offset
                allowed[p] = max(allowed[p], offset)
                c = BatchChanges()
                c.topic(topic).offsets.append((group, p, offset))
                merge(c)
            elif op[0] == "roll":
                p = op[1]
                high = watermarks(p)[1]
                if high > ends[op[1]]:
                    c = BatchChanges()
                    closed = now[0] - 2 * H
                    c.topic(topic).segments.append((p, Segment(ends[p], high, closed, 100, closed)))
                    ends[p] = high
                    known[p].add(high)
                    merge(c)
            elif op[0] == "time":
                now[0] += op[1]
                ctl.tick()
            elif op[0] == "kill" and down is None:
                kafka3.node(op[1]).kill()
                down = op[1]
            elif op[0] == "restart" and down is not None:
                kafka3.node(down).start()
                down = None
            for p in PARTS:  # the property, on the brokers' log starts
                now_low = watermarks(p)[0]
                if now_low != low[p]:
                    assert now_low in known[p], f"{topic}/{p}: log start {now_low} is no segment end compactd knew"
                    assert now_low <= allowed[p], (
                        f"{topic}/{p}: log start {now_low} past every commit of the group since it last moved "
                        f"(highest {allowed[p]}, now {committed.get(p)})"
                    )
                    event("a delete reached the brokers")
                    low[p], allowed[p] = now_low, committed.get(p, -1)
    finally:
        if down is not None:
            kafka3.node(down).start()
        ctl.sink.close()
