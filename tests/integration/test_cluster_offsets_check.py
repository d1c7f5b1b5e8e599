"""The last guard before a consumed-retention delete: the committed offsets real Kafka groups hold in the cluster.

Real broker, real Kafka groups committing through a consumer, real Redis: a group compactd's state never saw
still stops a delete past its offset, and a cluster that cannot be asked means no delete now, a retry later.
"""

from __future__ import annotations

import time

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.kafka.config import KafkaConnection
from compactd.kafka.groups import ClusterGroupOffsets
from compactd.model import Segment
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000


def kafka_commit(bootstrap: str, group: str, topic: str, offset: int, partition: int = 0) -> None:
    """A real consumer group commits, the way an application does; compactd's state hears nothing of it."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
    finally:
        c.close()


def three_segments_and_g1(topic: str, g1: str, now: int) -> BatchChanges:
    """The issue's case: segments [0,1000) [1000,2000) [2000,3000), old; the state knows only g1, at 2500."""
    c = BatchChanges()
    for i in range(3):
        c.topic(topic).segments.append((0, Segment(i * 1000, (i + 1) * 1000, now - 5 * H, 1, now - 5 * H)))
    c.topic(topic).offsets.append((g1, 0, 2500))
    return c


def controller(cluster, rclient: redis.Redis, topic: str, actions: str, clock: list[int], offsets) -> Controller:
    conn = KafkaConnection(cluster.bootstrap)
    state = RedisState(rclient)
    layers = {"global": {"dry.run": False}, f"topic:{topic}": {"consumed.retention.ms": H}}
    sink = KafkaAdminSink(conn, state)
    return Controller(
        state,
        layers,
        sink,
        AuditLog(conn, actions),
        Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
        cluster_offsets=offsets.check,
    )


def g2_behind(cluster) -> tuple[str, str, str, str]:
    """A topic of 3,000 records, g1 committed at 2500, g2 at 1100; (topic, actions topic, g1, g2)."""
    topic, actions = cluster.name("clicks"), cluster.name("actions")
    g1, g2 = cluster.name("g1"), cluster.name("g2")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.create(actions)
    cluster.fill(topic, 3000)
    kafka_commit(cluster.bootstrap, g1, topic, 2500)
    kafka_commit(cluster.bootstrap, g2, topic, 1100)
    return topic, actions, g1, g2


@pytest.mark.versions
def test_a_kafka_group_compactd_never_saw_stops_a_delete_past_its_offset(cluster, rclient) -> None:
    topic, actions, g1, g2 = g2_behind(cluster)  # g2 never reaches compactd's state
    clock = [int(time.time() * 1000)]
    offsets = ClusterGroupOffsets(KafkaConnection(cluster.bootstrap), ttl_s=0)
    ctl = controller(cluster, rclient, topic, actions, clock, offsets)

    ctl.on_batch("s", 0, three_segments_and_g1(topic, g1, clock[0]))

    [rec] = cluster.read_all(actions)
    assert (rec["status"], rec["before_offset"]) == ("skipped", 2000)
    assert rec["detail"]["why"] == f"past group {g2}'s committed offset 1100 in the cluster"
    assert cluster.watermarks(topic) == (0, 3000)

    # g2 reads on and commits past the segment: the next decision goes out
    kafka_commit(cluster.bootstrap, g2, topic, 2100)
    clock[0] += ctl.thresholds(topic, 0).action_retry_ms + 1
    ctl.evaluate([(topic, 0)], "test")
    assert [(a["status"], a["before_offset"]) for a in cluster.read_all(actions)] == [
        ("skipped", 2000),
        ("sent", 2000),
    ]
    assert cluster.watermarks(topic) == (2000, 3000)


def test_a_cached_answer_that_holds_a_delete_is_read_again_before_the_delete_is_skipped(cluster, rclient) -> None:
    topic, actions, g1, g2 = g2_behind(cluster)
    clock = [int(time.time() * 1000)]
    offsets = ClusterGroupOffsets(KafkaConnection(cluster.bootstrap), ttl_s=3600, monotonic=lambda: 0.0)
    assert offsets.check(topic).committed[g2] == {0: 1100}  # cached for an hour
    kafka_commit(cluster.bootstrap, g2, topic, 2100)  # the state hears of it before the cache expires
    ctl = controller(cluster, rclient, topic, actions, clock, offsets)

    ctl.on_batch("s", 0, three_segments_and_g1(topic, g1, clock[0]))

    assert [(a["status"], a["before_offset"]) for a in cluster.read_all(actions)] == [("sent", 2000)]
    assert cluster.watermarks(topic) == (2000, 3000)


def test_a_cluster_that_cannot_be_asked_means_no_delete_now_and_a_retry_later(cluster, rclient) -> None:
    topic, actions, g1 = cluster.name("clicks"), cluster.name("actions"), cluster.name("g1")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.create(actions)
    cluster.fill(topic, 3000)
    clock = [int(time.time() * 1000)]
    dead = ClusterGroupOffsets(KafkaConnection("127.0.0.1:1"), ttl_s=0, timeout_s=1.0)
    ctl = controller(cluster, rclient, topic, actions, clock, dead)

    ctl.on_batch("s", 0, three_segments_and_g1(topic, g1, clock[0]))

    [rec] = cluster.read_all(actions)
    assert rec["status"] == "failed" and "group offsets" in rec["detail"]["error"]
    assert rec["detail"]["retry_at"] > clock[0]
    assert cluster.watermarks(topic) == (0, 3000)
    [waiting] = RedisState(rclient).outbox()  # still in the outbox, due again at its retry time
    assert waiting.before_offset == 2000 and waiting.status == "pending"


def alter_offsets(bootstrap: str, offsets: dict[str, tuple[str, int]]) -> None:
    """Groups with committed offsets, set through the Admin API (thousands in well under a second)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = [
        fut
        for g, (topic, off) in offsets.items()
        for fut in admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g, [TopicPartition(topic, 0, off)])]
        ).values()
    ]
    for fut in futures:
        fut.result(30)


def test_2000_groups_cost_one_request_each_per_ttl_whatever_the_topics_and_deletes(cluster) -> None:
    """Every listed group is read again once its answer is older than the ttl (a group read for one topic may have
    committed on another since: issue 64), and that one round answers every topic's check within the ttl; a fresh
    read (a cached answer held a delete) asks again only the groups that may hold the topic."""
    a, b = cluster.name("a"), cluster.name("b")
    for t in (a, b):
        cluster.create(t, 1)
    on_a = {cluster.name(f"ga{i}"): (a, 10 + i) for i in range(10)}
    on_b = {cluster.name(f"gb{i}"): (b, 5) for i in range(1990)}
    alter_offsets(cluster.bootstrap, {**on_a, **on_b})
    clock = [0.0]
    mine = lambda groups: {g for g in groups if g.startswith(cluster.prefix)}  # noqa: E731 (other tests' groups)
    offsets = ClusterGroupOffsets(
        KafkaConnection(cluster.bootstrap), ttl_s=5.0, monotonic=lambda: clock[0], holders=lambda t: ()
    )
    first = offsets.check(a)
    assert mine(first.committed) == set(on_a) and first.committed[cluster.name("ga3")] == {0: 13}
    assert offsets.lists == 1 and offsets.fetches >= 2000  # every group once
    listed = offsets.fetches
    offsets.check(a)
    offsets.check(b)
    assert (offsets.lists, offsets.fetches) == (1, listed)  # within the ttl: nothing asked again, for any topic

    clock[0] += 5.0
    again = offsets.check(a)
    # every listed group once more, not only the 10 on `a` (an earlier test's group may have gone since)
    assert offsets.fetches - listed >= 2000
    assert mine(again.committed) == set(on_a)
    round_two = offsets.fetches
    assert mine(offsets.check(b).committed) == set(on_b) and offsets.fetches == round_two  # the same round's answer
    offsets.check(a, fresh=True)
    assert offsets.fetches - round_two == len(again.committed) >= 10  # fresh: only the groups on `a`
    new = cluster.name("g-new")
    alter_offsets(cluster.bootstrap, {new: (a, 1)})
    clock[0] += 5.0
    assert offsets.check(a).committed[new] == {0: 1}  # a group first listed now is read, and holds `a`


def test_a_counted_group_the_cluster_does_not_list(cluster, rclient) -> None:
    """`ghost` is known to compactd (its commits topic) but not to the cluster (no Describe ACL, or gone): reported;
    with cluster_check: strict it holds the delete."""
    topic, actions = cluster.name("ghosted"), cluster.name("actions")
    g1, ghost = cluster.name("g1"), cluster.name("ghost")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.create(actions)
    cluster.fill(topic, 3000)
    kafka_commit(cluster.bootstrap, g1, topic, 2500)
    clock = [int(time.time() * 1000)]
    state = RedisState(rclient)
    offsets = ClusterGroupOffsets(KafkaConnection(cluster.bootstrap), ttl_s=0, holders=state.groups)
    ctl = controller(cluster, rclient, topic, actions, clock, offsets)
    ctl.strict_groups = True
    c = three_segments_and_g1(topic, g1, clock[0])
    c.topic(topic).offsets.append((ghost, 0, 2600))
    ctl.on_batch("s", 0, c)
    [rec] = cluster.read_all(actions)
    assert (rec["status"], rec["before_offset"]) == ("skipped", 2000)
    assert rec["detail"]["why"].startswith(f"group {ghost} counts on {topic} but the cluster does not list it")
    assert ctl.metrics.registry.get_sample_value("compactd_groups_unlisted", {"topic": topic}) == 1
    assert state.unlisted(topic)["groups"] == [ghost]

    ctl.strict_groups = False  # reported, not blocking: the state's own minimum (2500) allows the delete
    clock[0] += ctl.thresholds(topic, 0).action_retry_ms + 1
    ctl.evaluate([(topic, 0)], "test")
    assert [(a["status"], a["before_offset"]) for a in cluster.read_all(actions)][1:] == [("sent", 2000)]
    assert cluster.watermarks(topic) == (2000, 3000)


def test_a_group_read_once_for_another_topic_is_asked_again_about_this_one(cluster, rclient) -> None:
    """Issue 64, item 1 (reproduced as a user would): group G is read once while its commits are on U only; it then
    commits 50 on T, in Kafka only (an assign() committer, Empty, never in compactd's state); a delete on T to 2000
    becomes due past the ttl. Every listed group's commits on T must be no older than the ttl at the send, whatever
    links the group to T. Before the fix: audited `sent`, the broker's log start 2000, G's records 50-1999 deleted."""
    u, t, actions = cluster.name("u"), cluster.name("t"), cluster.name("actions")
    g, h = cluster.name("G"), cluster.name("H")
    for topic in (u, t):
        cluster.create(topic, 1, {"cleanup.policy": "delete"})
        cluster.fill(topic, 3000)
    cluster.create(actions)
    kafka_commit(cluster.bootstrap, g, u, 100)
    clock = [int(time.time() * 1000)]
    mono = [0.0]
    state = RedisState(rclient)
    offsets = ClusterGroupOffsets(
        KafkaConnection(cluster.bootstrap), ttl_s=5.0, monotonic=lambda: mono[0], holders=state.groups
    )
    assert offsets.check(u).committed[g] == {0: 100}  # G read once, for U: its last fetch shows U only
    kafka_commit(cluster.bootstrap, g, t, 50)  # Kafka only: compactd's state never hears of it
    mono[0] += 6.0  # past the ttl
    ctl = controller(cluster, rclient, t, actions, clock, offsets)

    ctl.on_batch("s", 0, three_segments_and_g1(t, h, clock[0]))  # the state knows only H, at 2500

    [rec] = cluster.read_all(actions)
    assert (rec["status"], rec["before_offset"]) == ("skipped", 2000), rec
    assert rec["detail"]["why"] == f"past group {g}'s committed offset 50 in the cluster"
    assert cluster.watermarks(t) == (0, 3000)


def test_a_topic_recreated_while_the_slow_checks_run_is_not_deleted_from(cluster, rclient) -> None:
    """Issue 64, item 2: the topic-ID check runs first, then the group check (a coordinator child's start, two 10 s
    timeouts), then the sink sends by name. The topic deleted and created again in that window has lost its groups'
    offsets, so the group check holds nothing; the delete must not reach the new log. Before the fix: audited
    `sent`, the new topic's log start 2000 (2,000 of its new records deleted)."""
    from compactd.kafka.topics import ClusterTopics

    topic, actions, g1 = cluster.name("raced"), cluster.name("actions"), cluster.name("g1")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.create(actions)
    cluster.fill(topic, 3000)
    kafka_commit(cluster.bootstrap, g1, topic, 2500)
    offsets = ClusterGroupOffsets(KafkaConnection(cluster.bootstrap), ttl_s=0)
    raced: list[str] = []

    def check_while_recreated(t: str, fresh: bool):
        if not raced:  # the window: the topic check passed, the group check is asked
            raced.append(t)
            cluster.recreate(t, 1, {"cleanup.policy": "delete"})
            cluster.fill(t, 3000)  # the new log is long enough that no watermark gives it away
        return offsets.check(t, fresh)

    clock = [int(time.time() * 1000)]
    conn = KafkaConnection(cluster.bootstrap)
    state = RedisState(rclient)
    ctl = Controller(
        state,
        {"global": {"dry.run": False}, f"topic:{topic}": {"consumed.retention.ms": H}},
        KafkaAdminSink(conn, state),
        AuditLog(conn, actions),
        Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
        cluster_offsets=check_while_recreated,
        topics=ClusterTopics(conn),
    )

    ctl.on_batch("s", 0, three_segments_and_g1(topic, g1, clock[0]))

    assert raced == [topic]
    [rec] = cluster.read_all(actions)
    assert (rec["status"], rec["before_offset"]) == ("skipped", 2000), rec
    assert rec["detail"]["why"].startswith("stale state"), rec["detail"]
    assert cluster.watermarks(topic) == (0, 3000)  # the new log untouched
