"""Tiered storage (KIP-405): consumed retention deletes what every reader has read from the remote tier too.

The broker runs Kafka's own LocalTieredStorage (kafka-storage's test-fixtures jar; local/broker.py `tiered_settings`):
closed segments are copied to a directory standing for the object store, and the local tier keeps only the tail
(`local.retention.ms`). The topic's log start stays where it was, in the remote tier: the remote retention most teams
set "in case" is what every group has long read. Ground truth is the broker: its log start (ListOffsets earliest),
its log dir (the local tier) and the remote directory (what the remote tier holds).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from compactd.agent.agent import KafkaPublisher, SegmentAgent
from compactd.agent.leaders import node_id
from compactd.app.explain_cli import explain
from compactd.daemon.application import Application
from compactd.explain.text import format_text
from compactd.local.broker import kafka_broker, tiered_settings
from tests.support.compaction import Event, produce
from tests.support.fixtures import Cluster
from tests.support.groups import consume_and_commit
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark
BIG = b"x" * 100_000  # nine records a 1 MiB segment (Kafka's smallest segment.bytes)
RECORDS, READ = 61, 35


def local_bases(broker, topic: str) -> list[int]:
    return sorted(int(f.stem) for f in (broker.log_dir / f"{topic}-0").glob("*.log"))


def remote_bases(remote: Path, topic: str) -> list[int]:
    """The base offsets of the segments LocalTieredStorage holds for `topic`-0 (`<base>-<segment id>.log` files under
    `<topic>-0-<topic id>`)."""
    return sorted(
        int(f.name.split("-", 1)[0])
        for d in remote.rglob(f"{topic}-0-*")
        if re.fullmatch(rf"{re.escape(topic)}-0-[\w-]{{22}}", d.name)
        for f in d.glob("*.log")
    )


def test_consumed_retention_deletes_the_remote_segments_every_reader_read(spark, job_settings, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    broker = kafka_broker(tmp_path / "broker", extra=tiered_settings(remote))
    try:
        cluster = Cluster(broker.bootstrap)
        topic = cluster.name("clicks")
        config = {"remote.storage.enable": "true", "local.retention.ms": "3600000", "segment.bytes": str(1 << 20)}
        cluster.create(topic, 1, config)
        now = int(time.time() * 1000)
        produce(cluster, topic, [Event(0, b"k%d" % i, BIG, now + i) for i in range(RECORDS)], partitions=1)
        *closed, active = local_bases(broker, topic)
        wait_for("every closed segment copied to the remote tier", lambda: remote_bases(remote, topic) == closed, 60,
                 last=lambda: remote_bases(remote, topic))  # fmt: skip
        # consumed retention deletes to the last segment end at or below the reader, never past it
        due = max(end for end in [*closed[1:], active] if end <= READ)

        # the agent reads the log dir while the segments are still local too, as it does while they roll
        s = job_settings(
            bootstrap_servers=broker.bootstrap,
            offsets_source="consumer_offsets",
            thresholds={"global": {"dry.run": False}, f"topic:{topic}": {"consumed.retention.ms": 1}},
        )
        cluster.create(s.topics.segments)
        publisher = KafkaPublisher(cluster.conn, s.topics.segments)
        agent = SegmentAgent([broker.log_dir], node=node_id(broker.log_dir))
        events = agent.scan()
        publisher.publish(events)
        assert sorted(e["base_offset"] for e in events if e.get("topic") == topic and e["type"] == "segment_rolled") \
            == closed  # fmt: skip

        # the local tier trimmed: every segment the agent saw lives only in the remote tier now (the active one is
        # rolled and tiered too once it is past local.retention.ms)
        cluster.alter(topic, {"local.retention.ms": "1000"})
        wait_for("the local tier trimmed past the closed segments", lambda: min(local_bases(broker, topic)) >= active,
                 60, last=lambda: (local_bases(broker, topic), remote_bases(remote, topic)))  # fmt: skip
        tiered = remote_bases(remote, topic)
        assert cluster.watermarks(topic) == (0, RECORDS) and tiered[: len(closed)] == closed
        # the agent scans the trimmed log dir: the log start is still 0 (log-start-offset-checkpoint: the remote
        # tier's), not the local tier's first segment; its replica reports where the local tier starts now
        try:
            later = [e for e in agent.scan() if e.get("topic") == topic]
            publisher.publish(later)
        finally:
            publisher.close()
        assert not [e for e in later if e["type"] == "log_start"], later
        [local] = [e["local_log_start"] for e in later if e["type"] == "replica_log"]
        assert local == min(local_bases(broker, topic)) >= active

        consume_and_commit(broker.bootstrap, cluster.name("billing"), topic, READ)  # the only reader
        with Application(s, spark=spark) as job:
            job.run(once=True)

        assert cluster.watermarks(topic) == (due, RECORDS)
        kept = [b for b in tiered if b >= due]  # and any segment tiered since

        def remote_from_due() -> bool:
            held = remote_bases(remote, topic)
            return held[: len(kept)] == kept

        wait_for(f"the remote segments below {due} deleted (of {tiered})", remote_from_due, 60,
                 last=lambda: remote_bases(remote, topic))  # fmt: skip
        deletes = [a for a in cluster.read_all(s.topics.actions) if a["action"] == "delete_records"]
        assert [(a["before_offset"], a["reason"], a["status"]) for a in deletes] == [
            (due, "consumed_retention", "sent")
        ]
        # explain, as the state stood at that run: the log start the agent published (0: the remote tier's) up to the
        # local tier's first offset, the data is in the remote tier only (the delete's new log start reaches the state
        # with the agent's next scan)
        [said] = explain(s.redis_state(), s, f"{topic}/0", int(time.time() * 1000))
        me = node_id(broker.log_dir)
        assert said["log_start"] == 0
        assert said["tiers"] == {
            "log_start": 0,
            "local_log_start": {me: local},
            "remote_only": {"from": 0, "to": local},
        }
        line = f"  tiers     offsets 0-{local - 1} in the remote tier only; local logs from {local} (replica {me})"
        assert line in format_text(said).splitlines(), format_text(said)
        print(f"\n{line}")
    finally:
        broker.stop()
