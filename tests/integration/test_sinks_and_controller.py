"""Sinks and the controller against the real broker and real Redis (no Spark: batches are built by hand)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ResourceType
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.kafka.config import KafkaConnection
from compactd.model import ActionRecord, Segment
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support import kraft

H = 3_600_000
T0 = 1_800_000_000_000


def topic_config(bootstrap: str, topic: str, key: str, want: tuple[str, bool] | None = None) -> tuple[str, bool]:
    """(value, is it the broker's default) of a topic config as the broker describes it. `want`: asked again until
    the answer is that (kraft.until_config): a KRaft broker answers DescribeConfigs from its metadata cache, which
    takes the change a moment after IncrementalAlterConfigs has answered."""
    conn = KafkaConnection(bootstrap)
    if want is None:
        entry = kraft.configs(conn, ResourceType.TOPIC, topic)[key]
    else:
        entry = kraft.until_config(
            conn, ResourceType.TOPIC, topic, key, lambda e: (e.value, e.is_default) == want, f"(value, default) {want}"
        )
    return entry.value, entry.is_default


def delete(topic: str, before: int, partition: int = 0) -> ActionRecord:
    return ActionRecord(
        "d", "delete_records", topic, partition, "forced_retention", False, T0, "pending", before_offset=before
    )


@pytest.mark.versions
def test_delete_records_guards(cluster, rclient) -> None:
    topic, compacted, both = cluster.name("d"), cluster.name("c"), cluster.name("cd")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.create(compacted, 1, {"cleanup.policy": "compact"})
    cluster.create(both, 1, {"cleanup.policy": "compact,delete"})
    cluster.fill(topic, 100)
    cluster.fill(compacted, 10)
    cluster.fill(both, 10)
    sink = KafkaAdminSink(KafkaConnection(cluster.bootstrap), RedisState(rclient))
    assert sink.execute(delete("__consumer_offsets", 1)).detail["why"] == "internal topic"
    # Kafka refuses DeleteRecords on a topic whose cleanup.policy lacks delete (KIP-107: POLICY_VIOLATION) ...
    [answer] = cluster.admin.delete_records([TopicPartition(compacted, 0, 5)]).values()
    with pytest.raises(KafkaException) as kafka_says:
        answer.result(30)
    assert kafka_says.value.args[0].code() == KafkaError.POLICY_VIOLATION
    # ... and compactd never sends one: it reads the topic's policy first
    refused = sink.execute(delete(compacted, 5))
    assert (refused.status, refused.detail["why"]) == ("skipped", "cleanup.policy=compact has no delete")
    assert cluster.watermarks(compacted) == (0, 10)
    assert sink.execute(delete(both, 4)).status == "sent" and cluster.watermarks(both) == (4, 10)
    assert sink.execute(delete(topic, 40)).status == "sent"
    assert cluster.watermarks(topic) == (40, 100)
    again = sink.execute(delete(topic, 40))  # idempotent: already below the log start
    assert again.status == "sent" and cluster.watermarks(topic) == (40, 100)
    # past the log end: stale state (a re-created topic), never clamped and sent
    beyond = sink.execute(delete(topic, 101))
    assert (beyond.status, beyond.detail["high_watermark"]) == ("skipped", 100)
    assert beyond.detail["why"] == "stale state: a delete to offset 101 is past the log end 100"
    assert cluster.watermarks(topic) == (40, 100)


def test_compaction_nudge_skips_topics_without_compact(cluster, rclient) -> None:
    topic = cluster.name("plain")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    sink = KafkaAdminSink(KafkaConnection(cluster.bootstrap), RedisState(rclient))
    rec = ActionRecord("c", "compact", topic, 0, "max_compaction_lag", False, T0, "pending", earliest_ts=1)
    done = sink.execute(rec)
    assert (done.status, done.detail["why"]) == ("skipped", "cleanup.policy=delete has no compact")
    assert topic_config(cluster.bootstrap, topic, "max.compaction.lag.ms")[1]  # still the default


def make_controller(cluster, rclient, clock: list[int], thresholds: dict) -> tuple[Controller, str]:
    actions = cluster.name("actions")
    cluster.create(actions)
    state = RedisState(rclient)
    ctl = Controller(
        state,
        thresholds,
        KafkaAdminSink(KafkaConnection(cluster.bootstrap), state),
        AuditLog(KafkaConnection(cluster.bootstrap), actions),
        Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
    )
    return ctl, actions


def segment_batch(topic: str, *segs: Segment) -> BatchChanges:
    c = BatchChanges()
    c.topic(topic).segments.extend((0, s) for s in segs)
    return c


@pytest.mark.versions
def test_compaction_nudge_retry_and_restore(cluster, rclient) -> None:
    topic = cluster.name("gdpr")
    cluster.create(topic, 1, {"cleanup.policy": "compact", "max.compaction.lag.ms": "86400000"})
    clock = [T0]
    ctl, actions = make_controller(
        cluster,
        rclient,
        clock,
        {
            "global": {"dry.run": False, "action.retry.ms": 60_000},
            f"topic:{topic}": {"max.compaction.lag.ms": H},
        },
    )
    ctl.on_batch(
        "s", 0, segment_batch(topic, Segment(0, 100, T0 - 2 * H, 1, T0 - 2 * H), Segment(100, 200, T0 - 10, 1, T0 - 10))
    )
    assert topic_config(cluster.bootstrap, topic, "max.compaction.lag.ms", want=("1", False)) == ("1", False)
    delay = ctl.metrics.registry.get_sample_value
    assert delay("compactd_max_compaction_delay_seconds") == H / 1000  # 2h old, 1h allowed
    assert delay("compactd_compaction_delay_seconds", {"topic": topic, "partition": "0"}) == H / 1000
    # ticks before the retry interval decide nothing new
    clock[0] += 59_999
    ctl.tick()
    ctl.evaluate_all()
    assert len(cluster.read_all(actions)) == 1
    clock[0] += 1
    ctl.tick()
    got = cluster.read_all(actions)
    assert [(a["action"], a["status"], a["attempts"]) for a in got] == [("compact", "sent", 1), ("compact", "sent", 2)]
    assert got[0]["detail"]["previous"] == "86400000" and got[1]["detail"]["previous"] == "86400000"
    # the cleaner answers: the partition is compacted past the overdue segment → config restored
    c = BatchChanges()
    c.topic(topic).compacted.append((0, 100))
    ctl.on_batch("s", 1, c)
    assert topic_config(cluster.bootstrap, topic, "max.compaction.lag.ms", want=("86400000", False)) == (
        "86400000",
        False,
    )
    assert ctl.state.records([(topic, 0)])[(topic, 0)] == [] and ctl.state.nudged(topic) == {}
    # the oldest dirty segment now is 10 ms old: nothing overdue anywhere
    assert delay("compactd_max_compaction_delay_seconds") == 0
    assert delay("compactd_compaction_delay_seconds", {"topic": topic, "partition": "0"}) is None  # left the top-N
    assert ctl.state.last_actions()[f"{topic}/-1"].detail["restored"] == {"max.compaction.lag.ms": "86400000"}


def test_dry_run_records_but_sends_nothing(cluster, rclient) -> None:
    topic = cluster.name("dry")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 300)
    clock = [T0]
    ctl, actions = make_controller(cluster, rclient, clock, {f"topic:{topic}": {"forced.retention.ms": H}})
    ctl.on_batch("s", 0, segment_batch(topic, Segment(0, 100, 0, 1, T0 - 2 * H), Segment(100, 200, 0, 1, T0)))
    got = cluster.read_all(actions)
    assert [(a["action"], a["before_offset"], a["status"], a["dry_run"]) for a in got] == [
        ("delete_records", 100, "dry_run", True)
    ]
    assert cluster.watermarks(topic) == (0, 300)


def test_group_delete_lets_consumed_retention_advance(cluster, rclient) -> None:
    topic = cluster.name("cr")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 300)
    clock = [T0]
    ctl, actions = make_controller(
        cluster, rclient, clock, {"global": {"dry.run": False}, f"topic:{topic}": {"consumed.retention.ms": H}}
    )
    c = segment_batch(topic, Segment(0, 100, 0, 1, T0 - 2 * H), Segment(100, 200, 0, 1, T0 - 2 * H))
    c.topic(topic).offsets += [("fast", 0, 250), ("stuck", 0, 50)]
    ctl.on_batch("s", 0, c)
    assert cluster.read_all(actions) == []  # "stuck" holds everything back
    d = BatchChanges()
    d.group_deletes = ["stuck"]
    ctl.on_batch("s", 1, d)
    got = cluster.read_all(actions)
    assert [(a["before_offset"], a["reason"], a["status"]) for a in got] == [(200, "consumed_retention", "sent")]
    assert cluster.watermarks(topic) == (200, 300)


def test_excluded_groups_do_not_hold_data_back(cluster, rclient) -> None:
    topic = cluster.name("ex")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 300)
    clock = [T0]
    ctl, actions = make_controller(
        cluster,
        rclient,
        clock,
        {
            "global": {"dry.run": False, "groups.exclude": ["console-consumer-.*"]},
            f"topic:{topic}": {"consumed.retention.ms": H},
        },
    )
    c = segment_batch(topic, Segment(0, 100, 0, 1, T0 - 2 * H), Segment(100, 200, 0, 1, T0 - 2 * H))
    c.topic(topic).offsets += [("billing", 0, 200), ("console-consumer-4711", 0, 3)]
    ctl.on_batch("s", 0, c)
    got = cluster.read_all(actions)
    assert [(a["before_offset"], a["reason"]) for a in got] == [(200, "consumed_retention")]
    assert ctl.state.group_offsets(topic)[("console-consumer-4711", 0)] == 3  # still tracked, just not counted
