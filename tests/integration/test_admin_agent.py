"""`compactd agent --admin` against the real broker: real consumer groups commit, the agent sees only what any client
may ask (ListGroups, OffsetFetch, ListOffsets), and publishes the job's events. Ground truth is the broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from confluent_kafka import Producer, TopicPartition

from compactd.agent.admin_agent import AdminAgent
from compactd.agent.admin_poll import AdminPoll
from compactd.kafka.config import KafkaConnection
from compactd.kafka.reader import read_to_end
from tests.integration.test_cluster_offsets_check import kafka_commit as commit


def produce(bootstrap: str, topic: str, n: int, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=b"v", partition=partition)
    p.flush(10)


@pytest.mark.versions
def test_polls_turn_the_clusters_answers_into_the_jobs_events(cluster) -> None:
    topic = cluster.name("orders")
    cluster.create(topic, 2)
    produce(cluster.bootstrap, topic, 100, 0)
    fast, slow, other = cluster.name("billing"), cluster.name("analytics"), cluster.name("console-x")
    commit(cluster.bootstrap, fast, topic, 100)
    commit(cluster.bootstrap, slow, topic, 40)
    commit(cluster.bootstrap, other, topic, 10)
    clock = [1_000_000]
    mine = cluster.prefix  # other tests' groups and topics share the broker: look at this test's only
    poll = AdminPoll(slice_ms=60_000, group_grace_ms=30_000, counts=lambda g: g.startswith(mine) and "console" not in g)
    agent = AdminAgent(KafkaConnection(cluster.bootstrap), poll, clock=lambda: clock[0])

    segments, commits, stats = agent.scan()
    assert sorted((e["group"], e["partition"], e["offset"]) for e in commits if e["topic"] == topic) == [
        (slow, 0, 40),
        (fast, 0, 100),
    ]  # console-x filtered out before anything was fetched
    assert other not in poll.committed
    ours = [e for e in segments if e["topic"] == topic]
    assert sorted((e["type"], e["partition"], e.get("end_offset")) for e in ours) == [
        ("log_start", 0, None),
        ("log_start", 1, None),
        ("segment_rolled", 0, 100),  # the log as the broker holds it: one slice; partition 1 is empty
    ]
    assert stats.groups >= 2 and stats.partitions >= 2 and stats.calls >= 5

    clock[0] += 10_000
    commit(cluster.bootstrap, slow, topic, 70)
    produce(cluster.bootstrap, topic, 30, 1)
    segments, commits, _ = agent.scan()
    assert [(e["type"], e["group"], e["offset"]) for e in commits if e.get("topic") == topic] == [
        ("offset_commit", slow, 70)
    ]
    assert [e for e in segments if e["topic"] == topic] == []  # partition 1's slice is open: written since 10 s

    clock[0] += 10_000
    cluster.admin.delete_records([TopicPartition(topic, 0, 40)])[TopicPartition(topic, 0, 40)].result(10)
    segments, _, _ = agent.scan()
    ours = sorted((e["type"], e["partition"], e.get("base_offset"), e.get("log_start_offset")) for e in segments
                  if e["topic"] == topic)  # fmt: skip
    assert ours == [("log_start", 0, None, 40), ("segment_rolled", 1, 0, None)]  # partition 1 went quiet: closed

    for fut in cluster.admin.delete_consumer_groups([slow]).values():
        fut.result(10)
    clock[0] += 10_000
    assert [e for e in agent.scan()[1] if e.get("group") == slow] == []  # within the grace
    clock[0] += 30_000
    gone = [e for e in agent.scan()[1] if e.get("group") == slow]
    assert [e["type"] for e in gone] == ["group_delete"]


def test_the_cli_publishes_a_poll_to_the_jobs_topics(cluster, tmp_path) -> None:
    topic = cluster.name("clicks")
    cluster.create(topic, 1)
    produce(cluster.bootstrap, topic, 20)
    group = cluster.name("reader")
    commit(cluster.bootstrap, group, topic, 15)
    segs, commits = cluster.name("segments"), cluster.name("commits")
    cluster.create(segs, 1)
    cluster.create(commits, 1)
    name = cluster.name("cluster")  # this test's marks: other tests share the broker and the agent topic

    def agent_once(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "compactd", "agent", "--admin", "--once", "--bootstrap-servers", cluster.bootstrap,
             "--segments-topic", segs, "--commits-topic", commits, *flags],
            capture_output=True, text=True, timeout=60, env={**os.environ, "COMPACTD_CLUSTER": name},
        )  # fmt: skip

    out = agent_once()
    assert out.returncode == 0, out.stderr[-2000:]
    assert "cleaner cannot be seen from a client" in out.stderr and "admin poll:" in out.stderr
    conn = KafkaConnection(cluster.bootstrap)
    got = {k.decode(): json.loads(v) for k, v in read_to_end(conn, commits, 10)}
    assert got[f"{group}/{topic}/0"]["offset"] == 15
    seg = [json.loads(v) for k, v in read_to_end(conn, segs, 10) if k.decode() == f"{topic}/0"]
    assert {e["type"] for e in seg} == {"segment_rolled", "log_start"}
    marks = [json.loads(v) for k, v in read_to_end(conn, "compactd.agent", 10) if k.decode() == f"admin/{name}"]
    assert [(m["type"], m["poll"], m["cleaner_visible"]) for m in marks] == [("admin_poll", 1, False)]
    assert marks[0]["groups"] >= 1 and marks[0]["partitions"] >= 1  # written after the poll's events were flushed

    # the group is deleted while no agent runs; the next agent (a new process) resumes from what was published
    for fut in cluster.admin.delete_consumer_groups([group]).values():
        fut.result(10)
    out = agent_once("--group-grace-ms", "0")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "groups as earlier runs published them" in out.stderr
    got = {k.decode(): json.loads(v) for k, v in read_to_end(conn, commits, 10)}
    assert got[group] == {"type": "group_delete", "group": group, "ts": got[group]["ts"]}
