"""DeleteRecords on a replicated partition (three nodes, replication factor 3, min ISR 2).

The leader moves its log start at once, but answers only when every in-sync replica has moved its own: a follower
that stopped answering makes the request time out while the delete has happened (the follower leaves the ISR after
`replica.lag.time.max.ms`, and the delete is then complete). The audit must say what the broker did, not "failed",
and a retry must never delete more than was decided."""

from __future__ import annotations

import os
import signal

import redis
from confluent_kafka import TopicCollection

from compactd.kafka.config import KafkaConnection
from compactd.model import ActionRecord
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.state.redis_store import RedisState
from tests.support import kraft
from tests.support.fixtures import Cluster
from tests.support.waiting import wait_until


def replicas(cluster: Cluster, topic: str) -> tuple[int, list[int], list[int]]:
    """(leader, replicas, in-sync replicas) of partition 0, by a fresh client."""
    a = kraft.admin(cluster.conn)  # must outlive the future
    [p] = a.describe_topics(TopicCollection([topic]), request_timeout=5)[topic].result(10).partitions
    return p.leader.id, [r.id for r in p.replicas], [r.id for r in p.isr]


def delete(topic: str, before: int) -> ActionRecord:
    return ActionRecord(
        id=f"del-{before}",
        action="delete_records",
        topic=topic,
        partition=0,
        reason="consumed_retention",
        dry_run=False,
        decided_at=0,
        status="pending",
        before_offset=before,
    )


def test_a_delete_whose_answer_times_out_on_a_stopped_follower_is_audited_as_the_broker_did_it(
    kafka3, rclient: redis.Redis
) -> None:
    cluster = Cluster(kafka3.bootstrap, replication=3)
    topic = cluster.name("orders")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 1000)
    leader, nodes, _ = wait_until(
        f"{topic}[0] with all three replicas in sync",
        lambda: replicas(cluster, topic),
        lambda r: len(r[2]) == 3,
        tolerate=kraft.not_yet,
    )
    follower = kafka3.node(next(n for n in nodes if n != leader))
    sink = KafkaAdminSink(KafkaConnection(kafka3.bootstrap), RedisState(rclient), timeout_s=2.0)
    try:
        assert follower.proc is not None
        os.kill(follower.proc.pid, signal.SIGSTOP)  # alive to the others, answering nothing: a stalled follower
        try:
            done = sink.execute(delete(topic, 500))
        finally:
            os.kill(follower.proc.pid, signal.SIGCONT)
        # the leader moved its log start; the answer waited for the follower longer than the request's 2 s
        assert cluster.watermarks(topic)[0] == 500
        assert done.status == "sent", done
        assert done.detail["low_watermark"] == 500 and "timed out" in done.detail["why"], done.detail
        wait_until(
            "the follower back in sync", lambda: replicas(cluster, topic), lambda r: len(r[2]) == 3, 60,
            tolerate=kraft.not_yet,
        )  # fmt: skip
        # the same decision again (a retry after a crash): nothing more is deleted
        again = sink.execute(delete(topic, 500))
        assert (again.status, again.detail.get("why")) == ("sent", "already below log start"), again
        assert cluster.watermarks(topic)[0] == 500
    finally:
        sink.close()
