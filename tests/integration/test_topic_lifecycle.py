"""Topics deleted and created again, and deleted for good, under a running controller: real broker, real Redis.

Ground truth is the broker's watermarks: a re-created topic must lose none of its new records to the old topic's
state (before: it lost all of them when a delete past the log end was clamped to it).
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from compactd.codec.offsets import OffsetValue, encode_offset_key, encode_offset_value
from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.kafka.config import KafkaConnection
from compactd.kafka.topics import ClusterTopics, TopicsNow
from compactd.local.broker import kafka_broker
from compactd.model import Segment
from compactd.policy.identity import LogFacts, topic_id_bytes
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.sinks.nudge_ledger import LifecycleRecords, NudgeLedger
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from compactd.streaming.aggregate import collect_changes, keyed
from compactd.streaming.decode import DECODED_SCHEMA, Decoder, reduce_table
from tests.support.fixtures import Cluster

H = 3_600_000
M = 60_000
T0 = 1_800_000_000_000


def controller(
    cluster, rclient, clock: list[int], topic: str, rules: dict, topics=None, records=None
) -> tuple[Controller, str]:
    actions = cluster.name("actions")
    cluster.create(actions, exist_ok=True)
    state = RedisState(rclient)
    conn = KafkaConnection(cluster.bootstrap)
    ctl = Controller(
        state,
        {"global": {"dry.run": False}, f"topic:{topic}": rules},
        KafkaAdminSink(conn, state),
        AuditLog(conn, actions),
        Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
        topics=topics or ClusterTopics(conn),
        records=records,
    )
    return ctl, actions


def batch(topic: str, segs: list[Segment], log_start: int | None = None, offsets=()) -> BatchChanges:
    c = BatchChanges()
    c.topic(topic).segments.extend((0, s) for s in segs)
    if log_start is not None:
        c.topic(topic).log_start.append((0, log_start))
    c.topic(topic).offsets.extend(offsets)
    return c


def recreate(cluster, topic: str, records: int) -> None:
    """Re-create `topic` with `records` new ones, all of them on the new log before the test goes on: a later read
    of fewer is compactd's doing, never a write that landed in the old incarnation."""
    cluster.recreate(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, records)
    assert cluster.watermarks(topic) == (0, records), f"the new {topic} does not hold the {records} records written"


class WithoutIds(ClusterTopics):
    """The broker's answers with the topic IDs left out, as a cluster that reports none (before Kafka 2.8, or a
    Kafka-protocol server with all-zero IDs) answers: only the log itself can tell a re-created topic."""

    def describe(self, topics) -> TopicsNow:
        now = super().describe(topics)
        return TopicsNow(dict.fromkeys(now.ids, ""), now.missing, now.unknown)

    def facts(self, topic: str, partition: int) -> LogFacts | None:
        f = super().facts(topic, partition)
        return None if f is None else LogFacts(None, f.low, f.high)


@pytest.mark.versions
@pytest.mark.parametrize("ids", ["topic_ids", "no_ids"])
def test_recreated_topic_keeps_its_new_records(cluster, rclient, ids: str) -> None:
    topic = cluster.name("orders")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 3000)
    clock = [T0]
    topics = WithoutIds(KafkaConnection(cluster.bootstrap)) if ids == "no_ids" else None
    ctl, actions = controller(cluster, rclient, clock, topic, {"forced.retention.ms": H}, topics)
    closed = T0 - 10 * M  # due in 50 minutes
    ctl.on_batch("s", 0, batch(topic, [Segment(b, b + 1000, closed, 100, closed) for b in (0, 1000, 2000)]))
    assert cluster.read_all(actions) == []
    recreate(cluster, topic, 2000)  # the new topic has only its active segment

    clock[0] += H  # the OLD segments fall due
    ctl.tick()
    assert cluster.watermarks(topic) == (0, 2000)  # not one new record deleted
    [skipped] = cluster.read_all(actions)
    assert (skipped["status"], skipped["before_offset"]) == ("skipped", 3000)
    assert skipped["detail"]["why"].startswith("stale state: ")
    assert ctl.state.partitions(topic) == [] and ctl.state.records([(topic, 0)])[(topic, 0)] == []
    # Kafka's new topic ID gives it away; without IDs, the new log's end (2000) below the offsets held (3000)
    assert ("topic ID" if ids == "topic_ids" else "2000") in ctl.state.reset_cause(topic)["why"]
    assert ctl.metrics.registry.get_sample_value("compactd_topic_resets_total") == 1
    ctl.tick()  # nothing left to send, nothing decided from the old segments
    assert len(cluster.read_all(actions)) == 1

    # the new topic's own segments: the one past forced retention is deleted, nothing beyond it
    now = clock[0]
    ctl.on_batch(
        "s", 1, batch(topic, [Segment(0, 1000, now - 2 * H, 100, now - 2 * H), Segment(1000, 1500, now, 100, now)])
    )
    sent = cluster.read_all(actions)[-1]
    assert (sent["status"], sent["before_offset"], sent["reason"]) == ("sent", 1000, "forced_retention")
    assert cluster.watermarks(topic) == (1000, 2000)


@pytest.mark.parametrize("ids", ["topic_ids", "no_ids"])
def test_recreated_topic_after_the_old_log_start_advanced(cluster, rclient, ids: str) -> None:
    """The old log had been trimmed to 2000; the new one holds 2600 records, so the old segment's delete (to 2500)
    is inside the new log's end: the new topic ID gives it away, and without IDs only the log start going backwards
    (2000 held, 0 now) does."""
    topic = cluster.name("trimmed")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 3000)
    for fut in cluster.admin.delete_records([TopicPartition(topic, 0, 2000)]).values():
        fut.result(30)
    clock = [T0]
    topics = WithoutIds(KafkaConnection(cluster.bootstrap)) if ids == "no_ids" else None
    ctl, actions = controller(cluster, rclient, clock, topic, {"forced.retention.ms": H}, topics)
    closed = T0 - 10 * M
    old = [Segment(2000, 2500, closed, 100, closed)]  # the old log's active segment held 2500..3000
    ctl.on_batch("s", 0, batch(topic, old, log_start=2000))
    recreate(cluster, topic, 2600)

    clock[0] += H
    ctl.tick()
    assert cluster.watermarks(topic) == (0, 2600)
    [skipped] = cluster.read_all(actions)
    assert (skipped["status"], skipped["before_offset"]) == ("skipped", 2500)
    assert ("topic ID" if ids == "topic_ids" else "below the log start 2000") in skipped["detail"]["why"]
    assert ctl.state.partitions(topic) == []


def test_groups_lose_their_old_positions_on_a_reset(cluster, rclient) -> None:
    """The offsets groups committed on the old log say nothing of the new one: after a reset the group still counts
    but has no position, so consumed retention deletes nothing until it commits on the new log."""
    topic = cluster.name("consumed")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 3000)
    clock = [T0]
    ctl, actions = controller(cluster, rclient, clock, topic, {"consumed.retention.ms": H})
    closed = T0 - 10 * M
    segs = [Segment(b, b + 1000, closed, 100, closed) for b in (0, 1000, 2000)]
    ctl.on_batch("s", 0, batch(topic, segs, offsets=[("billing", 0, 3000)]))
    recreate(cluster, topic, 2000)
    clock[0] += H
    ctl.tick()
    assert cluster.watermarks(topic) == (0, 2000)
    assert cluster.read_all(actions)[0]["status"] == "skipped"
    assert ctl.state.group_offsets(topic) == {}  # billing's 3000 was the old log's

    now = clock[0]
    ctl.on_batch("s", 1, batch(topic, [Segment(0, 1000, now - 2 * H, 100, now - 2 * H)]))
    assert len(cluster.read_all(actions)) == 1  # billing counts, with no position on the new log: nothing deleted
    ctl.on_batch("s", 2, batch(topic, [], offsets=[("billing", 0, 1500)]))
    sent = cluster.read_all(actions)[-1]
    assert (sent["status"], sent["before_offset"], sent["reason"]) == ("sent", 1000, "consumed_retention")
    assert cluster.watermarks(topic) == (1000, 2000)


def test_a_deleted_topic_is_forgotten(cluster, rclient) -> None:
    topic, kept = cluster.name("gone"), cluster.name("kept")
    for t in (topic, kept):
        cluster.create(t, 2, {"cleanup.policy": "delete"})
    clock = [T0]
    ctl, _ = controller(cluster, rclient, clock, topic, {"forced.retention.ms": H})
    for i, t in enumerate((topic, kept)):
        ctl.on_batch("s", i, batch(t, [Segment(0, 10, T0, 1, T0)]))
    assert ctl.metrics.partitions.describe() is not None and (topic, 0) in ctl.metrics.partitions
    cluster.delete(topic)
    ctl.sweep_topics()  # missing once: may be a re-creation under way
    assert ctl.state.partitions(topic) == [0]
    ctl.sweep_topics()
    assert topic not in ctl.state.topics() and ctl.state.partitions(topic) == []
    assert (topic, 0) not in ctl.metrics.partitions and (kept, 0) in ctl.metrics.partitions
    assert ctl.state.partitions(kept) == [0]
    assert ctl.metrics.registry.get_sample_value("compactd_topics_forgotten_total") == 1
    assert not rclient.keys(f"cd:{{{topic}}}:*")


def test_a_state_missing_segment_events_deletes_up_to_the_gap_then_all_after_the_full_scan(cluster, rclient) -> None:
    """A rebuild from a segments topic that lost the event of [1000,2000): the known due segments on either side do
    not make the unknown middle due. The agent's next full scan re-announces it, and the delete goes on."""
    topic = cluster.name("gappy")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 3500)
    clock = [T0]
    ctl, actions = controller(cluster, rclient, clock, topic, {"forced.retention.ms": H})
    old = T0 - 2 * H
    known = [Segment(0, 1000, old, 100, old), Segment(2000, 3000, old, 100, old)]
    ctl.on_batch("s", 0, batch(topic, known))
    assert cluster.watermarks(topic) == (1000, 3500)  # [0,1000) only: nothing past the gap
    [first] = cluster.read_all(actions)
    assert (first["status"], first["before_offset"]) == ("sent", 1000)

    ctl.on_batch("s", 1, batch(topic, [Segment(1000, 2000, old, 100, old)]))  # the full scan
    assert cluster.watermarks(topic) == (3000, 3500)
    assert cluster.read_all(actions)[-1]["before_offset"] == 3000


def test_a_rebuild_binds_its_state_to_the_topic_ids_on_the_ledger(cluster, rclient) -> None:
    """Re-created, then Redis lost before any check saw it: the new log ends where the old segments end, so its
    watermarks contradict nothing; the topic ID the ledger recorded does (the lifecycle property found the delete)."""
    topic = cluster.name("unseen")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 3000)
    conn, clock = KafkaConnection(cluster.bootstrap), [T0]
    first_id = ClusterTopics(conn).describe([topic]).ids[topic]
    ledger = NudgeLedger(conn, cluster.name("nudges"))
    ledger.start()
    records = LifecycleRecords(ledger, lambda: {})
    old = batch(topic, [Segment(b, b + 1000, T0, 100, T0) for b in (0, 1000, 2000)])  # due in an hour

    def job() -> Controller:
        return controller(cluster, rclient, clock, topic, {"forced.retention.ms": H}, ClusterTopics(conn), records)[0]

    job().on_batch("s", 0, old)
    assert ledger.load_ids() == {topic: first_id} and first_id.strip("A=")  # Kafka's real ID, not all-zero
    recreate(cluster, topic, 3000)
    second_id = ClusterTopics(conn).describe([topic]).ids[topic]
    assert second_id != first_id
    rclient.flushall()
    ctl = job()
    ctl.lifecycle.restore(ledger.load_ids())  # what the application's rebuild does before it reads the sources
    ctl.on_batch("rebuilt", 0, old)
    clock[0] += 2 * H
    ctl.tick()
    assert cluster.watermarks(topic) == (0, 3000)
    assert ctl.metrics.registry.get_sample_value("compactd_topic_resets_total") == 1
    assert ledger.load_ids() == {topic: second_id}  # the reset bound the state to the topic as it is now
    cluster.delete(topic)
    ctl.sweep_topics()
    ctl.sweep_topics()
    assert ledger.load_ids() == {}  # forgotten: a topic created later under the name binds afresh
    ledger.close()


@pytest.mark.versions
def test_a_commit_naming_the_old_incarnations_topic_id_never_counts_for_the_new_topic(cluster, rclient) -> None:
    """OffsetCommitValue v4 names the topic ID a commit was made on. The topic is deleted and created again (Kafka
    gives it a new ID) and its state bound to the new one; a commit of the old incarnation, with a far higher offset
    (as a rebuild replaying `__consumer_offsets` would read it), is decoded, reduced and merged like any record: it
    never becomes a position on the new log, while a commit naming the new ID, or none, counts."""
    topic = cluster.name("reborn")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    conn = KafkaConnection(cluster.bootstrap)
    old_id = ClusterTopics(conn).describe([topic]).ids[topic]
    recreate(cluster, topic, 10)
    new_id = ClusterTopics(conn).describe([topic]).ids[topic]
    assert old_id != new_id
    state = RedisState(rclient)
    state.set_topic_ids({topic: new_id})  # what the lifecycle binds at the topic's first merge
    decoder = Decoder("segments", "commits")
    now = T0

    def merged(batch_id: int, *commits: tuple[str, int, str | None]) -> dict[str, int]:
        rows = [
            {
                **decoder.binary_row(
                    encode_offset_key(group, topic, 0),
                    encode_offset_value(OffsetValue(4, offset, "", now, leader_epoch=0, topic_id=uuid_of(tid))),
                ),
                "src_topic": "__consumer_offsets",
                "src_partition": 0,
                "src_offset": batch_id * 10 + i,
                "n": 1,
            }
            for i, (group, offset, tid) in enumerate(commits)
        ]
        changes = collect_changes(keyed(reduce_table(pa.Table.from_pylist(rows, schema=DECODED_SCHEMA)))).changes
        state.merge("s", batch_id, changes, lambda g, t: True)
        return {g: off for (g, p), off in state.group_offsets(topic).items() if p == 0}

    assert merged(0, ("ghost", 5_000, old_id)) == {}  # the old log's position: not a position on this one
    assert merged(1, ("billing", 7, new_id), ("legacy", 3, None)) == {"billing": 7, "legacy": 3}
    assert state.view(topic, 0).min_committed == 3


def uuid_of(topic_id: str | None) -> str | None:
    """The UUID string compactd's codec gives a v4 commit's topic ID, from the base64 the Admin API prints."""
    raw = topic_id_bytes(topic_id)
    return None if raw is None else str(uuid.UUID(bytes=raw))


@pytest.mark.versions
def test_an_open_transaction_is_not_a_recreated_topic(cluster, rclient) -> None:
    """A transaction left open across a segment roll (Flink or Streams exactly-once, a hanging transaction) holds the
    last stable offset below segment ends compactd knows. The log ends at its high watermark, not at the LSO: the
    topic is not reset, and the consumed-retention delete below the group goes."""
    topic = cluster.name("tx")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 3000)
    tx = cluster.open_transaction(topic, 210)  # written, never committed: the LSO stays at 3000, the HW is 3210
    clock = [T0]
    ctl, actions = controller(cluster, rclient, clock, topic, {"consumed.retention.ms": H})
    closed = T0 - 2 * H
    segs = [Segment(b, e, closed, 100, closed) for b, e in ((0, 1000), (1000, 2000), (2000, 3000), (3000, 3210))]
    ctl.on_batch("s", 0, batch(topic, segs, offsets=[("g1", 0, 2000)]))
    sent = cluster.read_all(actions)[-1]
    assert (sent["status"], sent["before_offset"]) == ("sent", 2000), sent
    assert cluster.watermarks(topic) == (2000, 3210)
    assert ctl.state.partitions(topic) == [0] and ctl.metrics.registry.get_sample_value(
        "compactd_topic_resets_total"
    ) in (None, 0)
    tx.abort_transaction(30)


def test_a_delete_behind_two_thousand_held_compactions_still_goes(rclient, tmp_path) -> None:
    """2,000 partitions of a compacted topic overdue at once (a global max.compaction.lag.ms just turned on), the
    cleaner slow to answer: `compaction.max.concurrent` (10) holds all but ten, and they keep their place at the
    head of the outbox. A consumed-retention delete decided later on another topic still goes in the next round
    (it was never read: the rounds read the 1,000 oldest records). A broker of its own: 2,000 partitions."""
    broker = kafka_broker(tmp_path / "broker")
    try:
        cluster = Cluster(broker.bootstrap)
        big, orders = cluster.name("big"), cluster.name("orders")
        cluster.create(big, 2000, {"cleanup.policy": "compact"})
        cluster.create(orders, 1, {"cleanup.policy": "delete"})
        cluster.fill(orders, 3000)
        clock = [T0]
        state = RedisState(rclient)
        actions = cluster.name("actions")
        cluster.create(actions)
        conn = KafkaConnection(cluster.bootstrap)
        ctl = Controller(
            state,
            {
                "global": {"dry.run": False, "max.compaction.lag.ms": H},
                f"topic:{orders}": {"consumed.retention.ms": H},
            },
            KafkaAdminSink(conn, state),
            AuditLog(conn, actions),
            Metrics(CollectorRegistry()),
            clock=lambda: clock[0],
            topics=ClusterTopics(conn),
        )
        overdue = BatchChanges()
        for p in range(2000):
            overdue.topic(big).segments.append((p, Segment(0, 10, T0 - 2 * H, 1, T0 - 2 * H)))
        ctl.on_batch("s", 0, overdue)
        assert state.compactions_in_flight() == 10 and state.outbox_depth() == 1990
        clock[0] += 1000
        closed = T0 - 2 * H
        ctl.on_batch("s", 1, batch(orders, [Segment(0, 1000, closed, 1, closed)], offsets=[("g", 0, 2000)]))
        assert cluster.watermarks(orders) == (1000, 3000)
        clock[0] += 1000
        ctl.tick()
        assert state.compactions_in_flight() == 10  # the cap still holds the compactions
    finally:
        broker.stop()
