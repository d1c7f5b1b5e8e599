"""The last record below a group's commit, read from a compacted log by Kafka's own cleaner (kafka/topics.py
`last_record_below`): the evidence the check before a consumed-retention delete judges a commit made under an
earlier leader epoch by (control/dispatch.py `_commits_outlived`). Real broker, real cleaner.

Issue 64, item 3: the search looked back only 64 offsets. On a `compact,delete` topic the record below a commit may be
far back; finding none was taken as no evidence, and a commit made before an unclean election counted.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

from compactd.kafka.config import KafkaConnection
from compactd.kafka.topics import ClusterTopics
from tests.support.waiting import wait_until


def first_offset_from(bootstrap: str, topic: str, start: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "first-offset", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, start)])
        msgs = c.consume(1, timeout=5.0)
        return msgs[0].offset() if msgs and msgs[0].error() is None else -1
    finally:
        c.close()


def test_the_last_record_below_a_commit_is_found_however_far_the_cleaner_left_it(cluster) -> None:
    topic = cluster.name("compacted")
    cluster.create(
        topic,
        1,
        {"cleanup.policy": "compact,delete", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
         "retention.ms": "-1"},
    )  # fmt: skip
    for i in range(10):  # k0..k9 at offsets 0-9: each its key's only record, kept by the cleaner
        cluster.send_raw(topic, b"v", f"k{i}".encode())
    for _ in range(290):  # x at 10-299: all but the last removed once x at 300 is cleaned past them
        cluster.send_raw(topic, b"v", b"x")
    cluster.flush()
    for key in (b"x", b"y", b"z"):  # each rolls the segment before it (segment.ms): x at 300 and y leave the active
        time.sleep(0.3)
        cluster.send_raw(topic, b"v", key)
        cluster.flush()
    wait_until("the cleaner removed x at 10-299", lambda: first_offset_from(cluster.bootstrap, topic, 10),
               lambda first: first >= 300, 90)  # fmt: skip

    topics = ClusterTopics(KafkaConnection(cluster.bootstrap))
    try:
        # before: None (nothing in the 64 offsets below 250), taken as no evidence
        assert topics.last_record_below(topic, 0, 250) == (9, 0)
        assert topics.last_record_below(topic, 0, 301) == (300, 0)  # the quick path: the record right below
        assert topics.last_record_below(topic, 0, 10) == (9, 0)
        assert topics.last_record_below(topic, 0, 0) is None  # nothing below offset 0
    finally:
        topics.close()
