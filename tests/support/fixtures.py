"""Shared fixtures: a real Redis server, a real Apache Kafka broker (one per pytest worker), a real local Spark."""

from __future__ import annotations

import gc
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, ResourceType

from compactd.kafka.config import KafkaConnection
from compactd.keys import partition_key
from compactd.local.broker import KafkaBroker, KafkaCluster, kafka_broker
from compactd.local.servers import Service, redis_server
from tests.support import kraft
from tests.support.waiting import wait_until


@pytest.fixture(scope="session")
def redis_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = redis_server(tmp_path_factory.mktemp("redis"))
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """This worker's Apache Kafka, shared by its tests; a test that stops or breaks a broker starts its own."""
    svc = kafka_broker(tmp_path_factory.mktemp("broker"))
    yield svc
    # Destroy the tests' Kafka clients first: alive past the broker, they log connection errors after
    # pytest's summary line.
    gc.collect()
    time.sleep(0.5)
    svc.stop()


@pytest.fixture(scope="module")
def kafka3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes, replication factor 3 and min ISR 2, where replication is what a test proves: shared
    by a module's tests, killed after its last (three idle JVMs cost a tenth of a core). Killed, not stopped: its
    files are thrown away, and a controlled shutdown of all three took the whole 30 s before the kill in a
    clean-clone `make test` (tests/e2e/test_graceful_stop.py proves compactd's own stop)."""
    nodes = KafkaCluster(tmp_path_factory.mktemp("kafka3"), nodes=3)
    yield nodes
    gc.collect()
    nodes.kill()


@pytest.fixture(scope="session")
def broker(kafka: KafkaBroker) -> str:
    return kafka.bootstrap


@pytest.fixture
def redis_url(redis_service: Service) -> str:
    """A fresh logical view of the server: every test gets an empty database."""
    url = f"redis://127.0.0.1:{redis_service.port}/0"
    client = redis.Redis.from_url(url)
    client.flushall()
    client.script_flush()  # every test proves the scripts load themselves
    return url


@pytest.fixture
def rclient(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def dump_redis(r: redis.Redis, pattern: str = "*") -> dict:
    """Every key matching `pattern` with its contents, comparable across runs."""
    out: dict = {}
    for key in sorted(r.keys(pattern)):
        kind = r.type(key)
        if kind == b"hash":
            out[key] = r.hgetall(key)
        elif kind == b"set":
            out[key] = r.smembers(key)
        elif kind == b"zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = r.get(key)
    return out


@pytest.fixture(scope="session")
def spark():
    from compactd.streaming.session import spark_session, stop_spark

    session = spark_session("local[2]")
    yield session
    stop_spark(session)  # the session, its JVM and Python workers


class Cluster:
    """Test helper around the broker: topics, JSON events, reading topics back."""

    def __init__(self, bootstrap: str, extra: dict[str, str] | None = None, replication: int = 1) -> None:
        """`extra`: librdkafka settings of every client (a SASL broker's credentials). `replication`: the
        replication factor of the topics `create` makes (3 on a KafkaCluster)."""
        self.bootstrap = bootstrap
        self.replication = replication
        self.conn = KafkaConnection(bootstrap, dict(extra or {}))
        self.admin = AdminClient(self.conn.client("admin"))
        self.producer = Producer(self.conn.client("producer", {"linger.ms": 1, "acks": "all"}))
        self.prefix = f"t{uuid.uuid4().hex[:8]}"

    def name(self, base: str) -> str:
        return f"{self.prefix}.{base}"

    def create(
        self, topic: str, partitions: int = 1, config: dict[str, str] | None = None, exist_ok: bool = False
    ) -> None:
        """Create `topic` and return once the broker shows it (kraft.until_visible): KRaft's metadata reaches the
        broker's cache a moment after CreateTopics answers."""
        want: int | None = partitions
        new = NewTopic(topic, partitions, self.replication, config=config or {})
        for fut in self.admin.create_topics([new]).values():
            try:
                fut.result(30)
            except KafkaException as exc:
                if not (exist_ok and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
                    raise
                want = None  # theirs, whatever it is
        kraft.until_visible(self.conn, topic, want)

    def delete(self, topic: str) -> None:
        """Delete `topic` and return once Metadata no longer lists it."""
        for fut in self.admin.delete_topics([topic]).values():
            fut.result(30)
        kraft.until_gone(self.conn, topic)

    def recreate(self, topic: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        """Delete `topic` and create it again: a new, empty log under the same name. Returns once the new incarnation
        is what the broker serves (kraft.until_recreated): records written before that may land in the old log.

        The helper's producer is made anew first: the old one refreshes the metadata of every topic it wrote to
        (every 10 s, compactd's client default), and the broker's `auto.create.topics.enable` answered such a
        refresh of the deleted topic by creating it again, before this call could (TOPIC_ALREADY_EXISTS; or
        "Unknown topic" from its cache right after: two clean-clone runs of test_lifecycle failed so)."""
        old = kraft.look(self.conn, topic).id
        self.flush()
        self.producer = Producer(self.conn.client("producer", {"linger.ms": 1, "acks": "all"}))
        self.delete(topic)
        new = NewTopic(topic, partitions, self.replication, config=config or {})

        def create() -> bool:
            """A broker in ZooKeeper mode (the version matrix) deletes a topic after Metadata stopped listing it, and
            refuses the name meanwhile (TOPIC_ALREADY_EXISTS: "marked for deletion" on 3.x, "already exists" on
            2.8): asked again until it takes it."""
            try:
                for fut in self.admin.create_topics([new]).values():
                    fut.result(30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
                return False
            return True

        wait_until(f"topic {topic} created again", create, lambda done: done, kraft.WITHIN_S)
        kraft.until_recreated(self.conn, topic, old, partitions)

    def grow(self, topic: str, partitions: int) -> None:
        """Add partitions to `topic` up to `partitions`; returns once every one is led and readable (a producer
        made before that may not know the new ones: librdkafka fails a record for them with "Unknown partition").
        The helper's admin client is made again: its cache holds the topic's old partition count, and librdkafka
        answers a DeleteRecords on a new partition from it ("No leaders found", without asking the cluster) until
        the entry ages out (`metadata.max.age.ms`): one generated history of the compaction property failed so."""
        for fut in self.admin.create_partitions([NewPartitions(topic, partitions)]).values():
            fut.result(30)
        kraft.until_visible(self.conn, topic, partitions)
        self.admin = AdminClient(self.conn.client("admin"))

    def alter(self, topic: str, changes: dict[str, str | None]) -> None:
        """Set (a value) or delete (None) configs of `topic`; returns once DescribeConfigs shows them."""
        kraft.alter(self.conn, ResourceType.TOPIC, topic, changes)

    def send(self, topic: str, events: list[dict], key: str | bytes | None = None) -> None:
        for ev in events:
            k = key if key is not None else event_key(ev)
            self.send_raw(topic, json.dumps(ev).encode(), k.encode() if isinstance(k, str) else k)
        self.flush()

    def send_raw(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int = 0) -> None:
        self.producer.produce(topic, value=value, key=key, partition=partition)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0

    def fill(self, topic: str, n: int, partition: int = 0) -> None:
        for i in range(n):
            self.producer.produce(topic, value=b"x", key=b"k%d" % i, partition=partition)
        self.flush()

    def open_transaction(self, topic: str, n: int, value: bytes = b"open") -> Producer:
        """`n` records written to partition 0 of `topic` in a transaction left open (the last stable offset stays
        below them); the caller commits or aborts it through the producer returned."""
        tx = Producer(self.conn.client("producer", {"transactional.id": f"{topic}-tx"}))
        tx.init_transactions(30)
        tx.begin_transaction()
        for _ in range(n):
            tx.produce(topic, value=value, partition=0)
        tx.flush(30)
        return tx

    def read_all(self, topic: str, timeout: float = 10.0) -> list[dict]:
        c = Consumer(
            self.conn.client("consumer", forced={"group.id": f"read-{uuid.uuid4()}", "auto.offset.reset": "earliest"})
        )
        md = c.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in md.partitions]
        ends = {
            p.partition: wait_until(
                f"{topic}[{p.partition}]'s watermarks",
                lambda p=p: c.get_watermark_offsets(p, timeout=10),
                tolerate=kraft.not_yet,
            )[1]
            for p in parts
        }
        c.assign(parts)
        out: list[dict] = []
        seen = {p: 0 for p in ends}
        deadline = time.monotonic() + timeout
        while any(seen[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is None:
                    out.append(json.loads(m.value()))
                    seen[m.partition()] = m.offset() + 1
        c.close()
        return out

    def stable_end(self, topic: str, partition: int = 0) -> int:
        """The last stable offset: where a read_committed reader's log ends (an open transaction's first record)."""
        c = Consumer(self.conn.client("consumer", forced={"group.id": "wm", "isolation.level": "read_committed"}))
        try:
            return wait_until(
                f"{topic}[{partition}]'s last stable offset",
                lambda: c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[1],
                tolerate=kraft.not_yet,
            )
        finally:
            c.close()

    def watermarks(self, topic: str, partition: int = 0) -> tuple[int, int]:
        """(log start, log end): the high watermark, not the last stable offset a read_committed client gets."""
        c = Consumer(self.conn.client("consumer", forced={"group.id": "wm", "isolation.level": "read_uncommitted"}))
        try:
            # asked again while the partition has no leader (yet): a restarted broker, or a topic the job under
            # test just created, leads its partitions a moment after it first answers
            return wait_until(
                f"{topic}[{partition}]'s watermarks",
                lambda: c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False),
                tolerate=kraft.not_yet,
            )
        finally:
            c.close()


def event_key(ev: dict) -> str:
    """The contract's key: `<group>/<topic>/<partition>` for a group's offset events (the commits topic is compacted
    by it), the group for a group's deletion, `<topic>/<partition>` for segment events."""
    if "group" in ev:
        return f"{ev['group']}/{partition_key(str(ev['topic']), ev['partition'])}" if "topic" in ev else ev["group"]
    return partition_key(str(ev.get("topic")), ev.get("partition", -1))


@pytest.fixture
def cluster(broker: str) -> Cluster:
    return Cluster(broker)


@pytest.fixture
def job_settings(cluster: Cluster, redis_url: str, tmp_path: Path):
    """Settings for one isolated job: its own compactd topics, Redis prefix and checkpoint."""
    from compactd.settings import Settings, TopicNames

    def make(**overrides):
        names = {
            k: cluster.name(k)
            for k in ("segments", "commits", "config", "actions", "dlq", "compactions", "nudges", "agent")
        }
        base = dict(
            bootstrap_servers=cluster.bootstrap,
            redis_url=redis_url,
            checkpoint_dir=str(tmp_path / "ckpt"),
            trigger_interval_ms=500,
            topics=TopicNames(**names),
            offsets_source="commits",  # the tests' groups commit through compactd's JSON commits topic
        )
        base.update(overrides)
        return Settings(**base)

    return make
