"""Real consumer groups for the tests: a member that subscribes, reads and commits, as an application does."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.kraft import not_yet, unanswered
from tests.support.waiting import wait_until


def newest_protocol() -> str:
    """The newest consumer-group protocol of the broker under test (the version matrix: COMPACTD_KAFKA_VERSION):
    KIP-848's `consumer` from Kafka 4.0 on, `classic` before (3.9's KIP-848 was a preview, off unless the broker is
    told)."""
    from compactd.local.broker import kafka_line

    return "consumer" if kafka_line().release >= (4, 0) else "classic"


def writes_topic_ids() -> bool:
    """Whether the broker under test writes commits as OffsetCommitValue v4, with the topic's ID (Kafka 4.x), or as
    v3 without it (2.8 to 3.9)."""
    from compactd.local.broker import kafka_line

    return kafka_line().release >= (4, 0)


def consume_and_commit(
    bootstrap: str, group: str, topic: str, upto: int, protocol: str = "classic", extra: dict | None = None
) -> None:
    """A member of `group` (`protocol`: "classic", or "consumer" for KIP-848) subscribes to `topic` (one partition),
    reads up to `upto` from where the group stands and commits that position, then leaves. `extra`: more client
    settings (a SASL broker's credentials)."""
    c = Consumer(
        {
            **(extra or {}),
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": protocol,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([topic])
        position, deadline = -1, time.monotonic() + 60
        while position + 1 < upto:
            assert time.monotonic() < deadline, f"{group} did not read {topic} up to {upto}"
            for m in c.consume(100, timeout=0.5):
                if m.error() is None and m.offset() < upto:
                    position = max(position, m.offset())
        c.commit(offsets=[TopicPartition(topic, 0, upto)], asynchronous=False)
    finally:
        c.close()


def share_acknowledge(bootstrap: str, group: str, topic: str, upto: int, extra: dict | None = None) -> None:
    """A member of share group `group` (KIP-932) reads `topic` (one partition) from where the group stands and
    acknowledges the records below `upto` (one partition delivers in offset order: done at `upto - 1`); those it
    received above are released, as a worker that stops mid-way does. Returns once the broker has accepted the
    acknowledgements."""
    from confluent_kafka import AcknowledgeType, ShareConsumer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from compactd.kafka.config import KafkaConnection
    from tests.support import kraft

    conf = {**(extra or {}), "bootstrap.servers": bootstrap}
    admin = AdminClient(conf)
    earliest = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[earliest])
    admin.incremental_alter_configs([resource])[resource].result(30)
    conn = KafkaConnection(bootstrap, {k: v for k, v in conf.items() if k != "bootstrap.servers"})
    # a member that joins before the broker shows the setting starts at the log end
    kraft.until_config(
        conn, ResourceType.GROUP, group, "share.auto.offset.reset", lambda e: e.value == "earliest", "earliest"
    )
    c = ShareConsumer({**conf, "group.id": group, "share.acknowledgement.mode": "explicit"})
    try:
        c.subscribe([topic])
        acked: set[int] = set()
        deadline = time.monotonic() + 60
        while upto - 1 not in acked:
            assert time.monotonic() < deadline, f"share group {group} did not receive {topic} up to {upto}"
            for m in c.poll(0.5):
                if m.error() is not None:
                    continue
                if m.offset() < upto:
                    c.acknowledge(m)
                    acked.add(m.offset())
                else:
                    c.acknowledge(m, AcknowledgeType.RELEASE)
            c.commit_sync(30)
    finally:
        c.close()


def streams_read(bootstrap: str, application_id: str, topic: str, upto: int) -> None:
    """A Kafka Streams application (tests/support/jvm/StreamsReader.java, the Kafka jars of the project's Maven
    cache) in a streams group (KIP-1071) named `application_id`: reads `topic` from its start, commits, and stops
    once it has read `upto` records (max.poll.records = upto, so it reads no further)."""
    from compactd.local.broker import kafka_jars

    source = Path(__file__).parent / "jvm" / "StreamsReader.java"
    java = shutil.which("java") or "java"
    argv = [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{kafka_jars()}/*", str(source),
            bootstrap, application_id, topic, str(upto)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the Streams application failed: {(proc.stdout + proc.stderr)[-800:]}"


@contextlib.contextmanager
def streams_assigned(bootstrap: str, application_id: str, topic: str) -> Iterator[None]:
    """A Kafka Streams application (tests/support/jvm/StreamsAssigned.java) in streams group `application_id`,
    assigned `topic` and reading it from its start, with nothing committed, for the duration of the block."""
    from compactd.local.broker import kafka_jars

    source = Path(__file__).parent / "jvm" / "StreamsAssigned.java"
    java = shutil.which("java") or "java"
    argv = [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{kafka_jars()}/*", str(source),
            bootstrap, application_id, topic]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "assigned", "the Streams app never ran"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def commit(
    bootstrap: str, group: str, topic: str, offsets: dict[int, int], epochs: dict[int, int] | None = None
) -> None:
    """`group` commits `offsets` (partition -> offset; `epochs`: partition -> the leader epoch of the last record read,
    KIP-320) as a member outside a generation does (a consumer that assigns its partitions), through the group's
    coordinator; the broker writes them to `__consumer_offsets`, and the commit is read back from it.

    Sent by the Admin API (the same OffsetCommit, generation -1), from a child process: librdkafka 2.16 aborts the
    process whose coordinator request's send fails while the coordinator moves (librdkafka#4605, SIGABRT), which
    took down pytest workers in the 3-node tests. A child that dies of a signal is started again (up to 3 times)."""
    request = json.dumps({"bootstrap": bootstrap, "group": group, "topic": topic, "offsets": offsets,
                          "epochs": epochs or {}})  # fmt: skip
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.groups", request], capture_output=True, text=True, timeout=150
        )
        if done.returncode >= 0:
            break
    assert done.returncode == 0, f"{group}'s commit failed ({done.returncode}): {done.stderr.strip()[-600:]}"


def _commit_here(bootstrap: str, group: str, topic: str, offsets: dict[int, int], epochs: dict[int, int]) -> None:
    """The child's part of `commit`."""
    from confluent_kafka import KafkaException

    a = AdminClient({"bootstrap.servers": bootstrap})
    at = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p, o, leader_epoch=epochs.get(p, -1)) for p, o in offsets.items()]
    )

    def once() -> None:
        for tp in a.alter_consumer_group_offsets([at])[group].result(10).topic_partitions:
            if tp.error is not None:
                raise KafkaException(tp.error)  # a partition the broker refused: its error is in the answer

    # a coordinator still loading its `__consumer_offsets` partition (a node just started) or just moved answers
    # with a retriable error, and one on a node just killed does not answer in the 10 s (the client tries the dead
    # node until it learns the new coordinator): committed again until the broker takes it
    wait_until(f"{group}'s commit taken", once, lambda _: True, 60, tolerate=unanswered)
    held = wait_until(
        f"{group}'s commit read back",
        lambda: a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30),
        tolerate=not_yet,
    ).topic_partitions
    got = {tp.partition: (tp.offset, tp.leader_epoch if tp.leader_epoch is not None else -1) for tp in held
           if tp.topic == topic}  # fmt: skip
    want = {p: (o, epochs.get(p, -1)) for p, o in offsets.items()}
    assert {p: got.get(p) for p in want} == want, f"{group} holds {got}, committed {want}"  # the epoch went too


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    _commit_here(
        job["bootstrap"], job["group"], job["topic"],
        {int(p): o for p, o in job["offsets"].items()}, {int(p): e for p, e in job["epochs"].items()},
    )  # fmt: skip
