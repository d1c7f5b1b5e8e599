"""Real clients of a compacted view, each reading `<topic>.compacted` as its users read a compacted topic (each key's
last record wins, a null value deletes the key): a Kafka Streams application's KTable and GlobalKTable
(tests/support/jvm/ViewTable.java, Streams' defaults: read_uncommitted), kcat (Debian's, librdkafka's defaults),
and Spark's plain Kafka source. Each returns the table it ended with, {key: value}."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

HERE = Path(__file__).parent


def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    from compactd.kafka.admin import admin_client, list_end_offsets
    from compactd.kafka.config import KafkaConnection

    return list_end_offsets(admin_client(KafkaConnection(bootstrap)), [topic], "high").get(topic, {})


def streams_table(bootstrap: str, topic: str, kind: str, timeout_s: float = 90.0) -> dict[bytes, bytes]:
    """A fresh Kafka Streams application (its own application id) materializing `topic` as a KTable (`kind`
    "ktable") or a GlobalKTable ("global"), read once it has read the whole topic: a GlobalKTable restores to the
    topic's end before it runs; a KTable's application has committed the topic's end offsets."""
    from compactd.local.broker import kafka_jars

    app = f"view-{kind}-{uuid.uuid4().hex[:8]}"
    argv = [shutil.which("java") or "java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{kafka_jars()}/*",
            str(HERE / "jvm" / "ViewTable.java"), bootstrap, app, topic, kind]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        first = proc.stdout.readline().strip()
        assert first == "running", f"the Streams application never ran: {first!r}"
        if kind == "ktable":
            _wait_committed(bootstrap, app, topic, timeout_s)
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, "the Streams application printed no table"
        return {bytes.fromhex(k): bytes.fromhex(v) for k, v in json.loads(line).items()}
    finally:
        proc.stdin.close()
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_committed(bootstrap: str, group: str, topic: str, timeout_s: float) -> None:
    """Until `group` has committed the end offset of every partition of `topic` that has records to read."""
    ends = _ends(bootstrap, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while True:
        req = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, int(p)) for p in ends])]
        got = admin.list_consumer_group_offsets(req)[group].result(10)
        committed = {tp.partition: tp.offset for tp in got.topic_partitions}
        if all(committed.get(int(p), -1) >= end or end == 0 for p, end in ends.items()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the KTable's application read {committed} of {ends} in {timeout_s:.0f}s")
        time.sleep(0.2)


def last_record_wins(records: list[tuple[bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    """Records in log order → the table a compacted topic's reader ends with."""
    out: dict[bytes, bytes] = {}
    for key, value in records:
        if key is None:
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def kcat_table(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """`kcat -C` from each partition's start to its end (`-e`), each record as its key's and value's lengths and
    bytes (a null value: length -1), then last record wins, partition by partition."""
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat not found (make system-deps installs it)"
    fmt = "%p %K %S\n%k%s\n"
    proc = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", fmt],
                          capture_output=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-500:]
    data, at = proc.stdout, 0
    by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    while at < len(data):
        nl = data.index(b"\n", at)
        p, klen, vlen = (int(x) for x in data[at:nl].split())
        at = nl + 1
        key = None if klen < 0 else data[at : at + klen]
        at += max(klen, 0)
        value = None if vlen < 0 else data[at : at + vlen]
        at += max(vlen, 0) + 1  # the record's closing newline
        by_partition.setdefault(p, []).append((key, value))
    out: dict[bytes, bytes] = {}
    for records in by_partition.values():
        out.update(last_record_wins(records))
    return out


def console_table(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """Kafka's console consumer (`kafka-tools`, from the jars) from the beginning until a second without records,
    each record as partition, key and value (a null prints as `null`: the tests' values never are that word)."""
    from compactd.local.broker import kafka_jars

    argv = [shutil.which("java") or "java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{kafka_jars()}/*",
            "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap, "--topic", topic,
            "--from-beginning", "--timeout-ms", "5000", "--formatter-property", "print.partition=true",
            "--formatter-property", "print.key=true", "--formatter-property", "key.separator=\t"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, timeout=120)
    assert b"Processed a total of" in proc.stderr, proc.stderr.decode(errors="replace")[-500:]
    by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for line in proc.stdout.splitlines():
        if not line.startswith(b"Partition:"):  # its log lines (the timeout that ends it) share stdout
            continue
        part, key, value = line.split(b"\t", 2)
        p = int(part.removeprefix(b"Partition:"))
        by_partition.setdefault(p, []).append((None if key == b"null" else key, None if value == b"null" else value))
    out: dict[bytes, bytes] = {}
    for records in by_partition.values():
        out.update(last_record_wins(records))
    return out


def spark_table(spark: Any, bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """Spark's plain Kafka source (a batch read from the start to the end), each key's last record by partition and
    offset."""
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("endingOffsets", "latest").load()
            .select("partition", "offset", "key", "value").toArrow().to_pylist())  # fmt: skip
    by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for r in sorted(rows, key=lambda r: (r["partition"], r["offset"])):
        by_partition.setdefault(r["partition"], []).append((r["key"], r["value"]))
    out: dict[bytes, bytes] = {}
    for records in by_partition.values():
        out.update(last_record_wins(records))
    return out
