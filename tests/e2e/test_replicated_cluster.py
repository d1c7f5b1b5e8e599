"""compactd on a replicated cluster: three Apache Kafka nodes (KRaft, each broker and controller), replication factor 3,
min.insync.replicas 2, the groups in Kafka's own `__consumer_offsets` (replicated too, its coordinators on all three
nodes). What a single node cannot show: a node killed with -9 moves the leadership of the partitions it led (and of
the group coordinators and the controller quorum) to the other two while the job runs.

Ground truth is the cluster's low watermark of every partition, sampled all along: it never passes the group's
committed offset, and it moves again after the kill without the node coming back."""

from __future__ import annotations

import collections
import threading
import time

import pytest
from confluent_kafka import Consumer, TopicCollection, TopicPartition

from compactd.app.application import Application
from tests.support import kraft
from tests.support.events import old_segments
from tests.support.fixtures import Cluster
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.spark
H = 3_600_000
PARTITIONS = 3
RESUME_S = 60  # the bound stated in docs/safety.md: a delete due on a partition whose leader died goes within it


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """`group` commits `offsets` (partition -> offset) as a classic group's member does, through its coordinator;
    the broker writes them to `__consumer_offsets`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def leaders(cluster: Cluster, topic: str) -> dict[int, int]:
    """partition -> the node leading it now, asked by a fresh client (one that knew the dead node may wait on it)."""
    a = kraft.admin(cluster.conn)  # must outlive the future
    d = a.describe_topics(TopicCollection([topic]), request_timeout=5)[topic].result(10)
    return {p.id: (p.leader.id if p.leader is not None else -1) for p in d.partitions}


def unanswered(exc: Exception) -> bool:
    return isinstance(exc, TimeoutError) or kraft.not_yet(exc)


def test_the_node_leading_most_partitions_killed_under_a_running_job(spark, kafka3, job_settings) -> None:
    cluster = Cluster(kafka3.bootstrap, replication=3)
    topic = cluster.name("orders")
    cluster.create(topic, PARTITIONS, {"cleanup.policy": "delete"})
    for p in range(PARTITIONS):
        cluster.fill(topic, 4000, partition=p)
    group = cluster.name("billing")
    settings = job_settings(
        bootstrap_servers=kafka3.bootstrap,
        offsets_source="consumer_offsets",
        trigger_interval_ms=500,
        thresholds={
            "global": {"dry.run": False, "action.retry.ms": 1000},
            f"topic:{topic}": {"consumed.retention.ms": H},
        },
    )
    t = settings.topics
    cluster.create(t.segments)
    now = int(time.time() * 1000)
    for p in range(PARTITIONS):
        cluster.send(t.segments, old_segments(topic, [1000, 2000, 3000, 4000], now, partition=p))
    commit(kafka3.bootstrap, group, topic, dict.fromkeys(range(PARTITIONS), 1500))
    held = {p: [1500] for p in range(PARTITIONS)}  # what the group committed, in order
    lows: dict[int, list[int]] = collections.defaultdict(list)

    def low(p: int) -> int:
        lw = cluster.watermarks(topic, p)[0]
        lows[p].append(lw)
        return lw

    def all_at(offset: int) -> bool:
        return all(low(p) == offset for p in range(PARTITIONS))

    stop = threading.Event()
    failed: list[BaseException] = []

    def run(job: Application) -> None:
        try:
            job.run(stop=stop)
        except BaseException as exc:
            failed.append(exc)

    with Application(settings, spark=spark) as job:
        runner = threading.Thread(target=run, args=(job,))
        runner.start()
        try:
            wait_for("every partition's first delete", lambda: all_at(1000), 120)
            # the node that leads most partitions, Kafka's own included (the group coordinators and the share and
            # transaction state): as in the run the issue reports
            led = collections.Counter(
                p.leader
                for md in [kraft.admin(cluster.conn).list_topics(timeout=30)]
                for tm in md.topics.values()
                for p in tm.partitions.values()
            )
            victim = kafka3.node(led.most_common(1)[0][0])
            before = leaders(cluster, topic)
            victim.kill()  # kill -9: leadership of what it led moves to the other two
            killed = time.monotonic()
            wait_until(
                f"the partitions node {victim.node_id} led led by another node",
                lambda: leaders(cluster, topic),
                lambda now: all(leader not in (-1, victim.node_id) for leader in now.values()),
                60,
                tolerate=unanswered,
            )
            commit(kafka3.bootstrap, group, topic, dict.fromkeys(range(PARTITIONS), 2500))
            for p in held:
                held[p].append(2500)
            wait_for("every partition's delete after the kill, the node still down", lambda: all_at(2000), RESUME_S)
            resumed = time.monotonic() - killed
            assert runner.is_alive() and not failed, failed
            victim.start()  # same log dir and ports: it catches up as a follower
            commit(kafka3.bootstrap, group, topic, dict.fromkeys(range(PARTITIONS), 3500))
            for p in held:
                held[p].append(3500)
            wait_for("every partition's delete after the restart", lambda: all_at(3000), RESUME_S)
            cluster_settled = [low(p) for p in range(PARTITIONS)]
            assert cluster_settled == [3000] * PARTITIONS
            assert runner.is_alive() and not failed, failed
        finally:
            stop.set()
            runner.join(120)
    assert not failed, failed
    # never past the group: each partition's low watermark only ever reached segment ends at or below its commit
    for p, seen in lows.items():
        assert set(seen) <= {0, 1000, 2000, 3000}, (p, seen)
        assert max(seen) <= max(held[p]), (p, seen)
    # the same topic ID throughout: leadership moving reset nothing
    assert job.metrics.registry.get_sample_value("compactd_topic_resets_total") in (None, 0)
    print(f"node {victim.node_id} (leader of {sorted(p for p, n in before.items() if n == victim.node_id)}) killed; "
          f"deletes resumed {resumed:.1f} s later")  # fmt: skip
