"""The log-dir agent reports a partition from its leader's log only (a follower's cleaner never answers a nudge the
leader did not take), against a real broker's live log dir: its `meta.properties`, its cleaner checkpoint, and the
cluster's metadata for who leads. One broker leads everything here: the follower is this broker seen as another id."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from compactd.agent.agent import SegmentAgent
from compactd.agent.leaders import Leaders, node_id
from compactd.agent.logdir import read_checkpoint
from compactd.app.cli import main
from compactd.kafka.config import KafkaConnection
from tests.support.waiting import wait_for


def cleaned_both(kafka, topic: str) -> bool:
    ckpt = read_checkpoint(kafka.log_dir / "cleaner-offset-checkpoint")
    return all(ckpt.get((topic, p), -1) > 0 for p in (0, 1))


def test_only_the_partitions_this_broker_leads_are_published(kafka, cluster) -> None:
    topic = cluster.name("replicated")
    cluster.create(topic, 2, {"cleanup.policy": "compact", "segment.ms": "1000"})
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 1})
    for batch in range(2):  # two segments a partition, the first closed: Kafka cleans it by itself
        for p in (0, 1):
            for k in range(20):
                producer.produce(topic, key=b"k%d" % k, value=b"v%d" % batch, partition=p)
        producer.flush(30)
        time.sleep(1.3)
    wait_for("Kafka's cleaner on both partitions", lambda: cleaned_both(kafka, topic), 60)

    me = node_id(kafka.log_dir)
    assert me == 1  # the broker's node.id, read from the log dir it writes
    conn = KafkaConnection(kafka.bootstrap)
    assert {(topic, 0), (topic, 1)} <= (Leaders(conn, me)() or set())
    assert not {(topic, 0), (topic, 1)} & (Leaders(conn, me + 1)() or set())  # as another broker: a follower

    def kinds(events: list[dict]) -> set[tuple[str, int]]:
        return {(e["type"], e["partition"]) for e in events if e["topic"] == topic}

    everything = kinds(SegmentAgent([kafka.log_dir]).scan())  # no leader rule: every partition on disk
    assert {("segment_rolled", 0), ("segment_rolled", 1), ("compacted", 0), ("compacted", 1)} <= everything
    leading_one = kinds(SegmentAgent([kafka.log_dir], leads=lambda: {(topic, 0)}).scan())
    assert leading_one == {e for e in everything if e[1] == 0}
    assert kinds(SegmentAgent([kafka.log_dir], leads=Leaders(conn, me + 1)).scan()) == set()  # a follower: nothing
    assert SegmentAgent([kafka.log_dir], leads=lambda: None).scan() == []  # leaders unknown: nothing this scan


def test_the_agent_command_reads_its_broker_id_and_publishes_what_it_leads(kafka, cluster) -> None:
    topic, segments = cluster.name("led"), cluster.name("segments")
    cluster.create(topic, 1, {"cleanup.policy": "compact", "segment.ms": "1000"})
    cluster.create(segments)
    cluster.fill(topic, 10)
    time.sleep(1.3)
    cluster.fill(topic, 1)  # closes the first segment
    flags = ["--log-dir", str(kafka.log_dir), "--bootstrap-servers", kafka.bootstrap, "--segments-topic", segments]
    assert main(["agent", *flags, "--once"]) == 0
    events = [e for e in cluster.read_all(segments) if e["topic"] == topic]
    assert [(e["type"], e["partition"], e["base_offset"]) for e in events if e["type"] == "segment_rolled"] == [
        ("segment_rolled", 0, 0)
    ]
