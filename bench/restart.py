"""Restart at scale: how soon a job killed with `kill -9` while tracking N partitions decides again.

Starts its own Redis and Apache Kafka broker, fills the segment and commit topics for N partitions (5 segments each, 10
groups), runs `compactd run` (continuous, as deployed) until Redis tracks all of them, kills it with SIGKILL, writes
one overdue segment event and restarts the job. Reports, from the restarted process's start: the first completed
micro-batch (its log line) and its Spark seconds, and the decision about the overdue partition (its `decided_at` on
the actions topic, read once the batch is logged; it must come from that first batch: a restart must not re-scan
Redis before deciding). Prints one JSON object.
Usage: python bench/restart.py [--partitions N] [--topics T]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compactd.kafka.config import KafkaConnection
from compactd.keys import partition_key
from compactd.local.broker import kafka_broker
from compactd.local.servers import redis_server
from compactd.settings import Settings

DAY = 86_400_000
GROUPS = 10
SEGMENTS = 5


def fill(conn: KafkaConnection, topics: int, per_topic: int) -> int:
    admin = AdminClient(conn.client("admin"))
    for fut in admin.create_topics(
        [NewTopic(t, 8, 1) for t in ("compactd.segments", "compactd.commits", "compactd.actions")]
    ).values():
        fut.result(30)
    p = Producer(conn.client("producer", {"linger.ms": 20, "queue.buffering.max.messages": 1_000_000}))
    now, events = int(time.time() * 1000), 0
    for t in range(topics):
        topic = f"data-{t}"
        for part in range(per_topic):
            key = partition_key(topic, part).encode()
            for s in range(SEGMENTS):  # recent segments: nothing overdue, nothing to decide
                ev = {
                    "type": "segment_rolled",
                    "topic": topic,
                    "partition": part,
                    "base_offset": s * 1000,
                    "end_offset": (s + 1) * 1000,
                    "first_batch_max_ts": now - 60_000,
                    "size_bytes": 1 << 20,
                    "ts": now,
                }
                p.produce("compactd.segments", key=key, value=json.dumps(ev).encode())
            for g in range(GROUPS):
                ev = {
                    "type": "offset_commit",
                    "group": f"g{g}",
                    "topic": topic,
                    "partition": part,
                    "offset": 10,
                    "ts": now,
                }
                p.produce("compactd.commits", key=f"g{g}".encode(), value=json.dumps(ev).encode())
            events += SEGMENTS + GROUPS
        p.flush()
    return events


def overdue_segment(conn: KafkaConnection) -> None:
    now = int(time.time() * 1000)
    ev = {
        "type": "segment_rolled",
        "topic": "data-0",
        "partition": 0,
        "base_offset": SEGMENTS * 1000,
        "end_offset": (SEGMENTS + 1) * 1000,
        "first_batch_max_ts": now - 2 * DAY,
        "size_bytes": 1 << 20,
        "ts": now,
    }
    p = Producer(conn.client("producer"))
    p.produce("compactd.segments", key=partition_key("data-0", 0).encode(), value=json.dumps(ev).encode())
    p.flush()


class Job:
    """`compactd run` as a process of its own, in a session of its own (its Spark JVM is a child in another)."""

    def __init__(self, config: Path, log: Path) -> None:
        self.log = log
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compactd", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(log, "w"),  # noqa: SIM115 - the child holds it
            start_new_session=True,
        )

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def first_batch(self, timeout_s: float = 60) -> tuple[float, float | None] | None:
        """When the first completed micro-batch was logged, and its Spark seconds. The line comes at the end of the
        batch, after its actions reached the actions topic: a caller that saw the decision waits for it here (it
        printed null when it did not)."""
        deadline = time.time() + timeout_s
        while True:
            for line in self.lines():
                if re.search(r"compactd\.\S+: (batch \d+:|idle:)", line):
                    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                    spark = re.search(r"; spark ([\d.]+)s", line)
                    return stamp.timestamp(), float(spark.group(1)) if spark else None
            if time.time() >= deadline or self.proc.poll() is not None:
                return None
            time.sleep(0.1)

    def kill(self, sig: int) -> None:
        """SIGKILL: the driver's process group, as a crash would (Spark's JVM, in a session of its own, exits as its
        stdin closes). SIGTERM: the driver only, as systemd (KillMode=mixed) and Kubernetes do; the JVM stops first."""
        if sig == signal.SIGKILL:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        self.proc.wait(150)


def first_action_for(conn: KafkaConnection, topic: str, partition: int, deadline: float) -> tuple[float, dict] | None:
    c = Consumer(conn.client("consumer", {"group.id": f"bench-{time.time()}", "auto.offset.reset": "earliest"}))
    c.subscribe(["compactd.actions"])
    try:
        while time.time() < deadline:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            rec = json.loads(msg.value())
            if (rec.get("topic"), rec.get("partition")) == (topic, partition):
                return time.time(), rec
    finally:
        c.close()
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--trigger-ms", type=int, default=1000)
    args = ap.parse_args()
    per_topic = args.partitions // args.topics
    work = Path(tempfile.mkdtemp(prefix="compactd-restart-"))
    redis_svc, broker = redis_server(work / "redis"), kafka_broker(work / "broker")
    job: Job | None = None
    try:
        settings = Settings(
            offsets_source="commits",
            bootstrap_servers=f"127.0.0.1:{broker.port}",
            redis_url=f"redis://127.0.0.1:{redis_svc.port}/0",
            checkpoint_dir=str(work / "ckpt"),
            trigger_interval_ms=args.trigger_ms,
            thresholds={"global": {"max.compaction.lag.ms": DAY}},
            kafka={"receive.message.max.bytes": "1000000000"},
        )
        config = work / "compactd.yaml"
        config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
        conn = settings.kafka_connection()
        t0 = time.monotonic()
        events = fill(conn, args.topics, per_topic)
        fill_s = time.monotonic() - t0

        job = Job(config, work / "first.log")
        state = settings.redis_state()
        t0 = time.monotonic()
        while len(state.all_partitions()) < args.topics * per_topic or not all(
            state.view(f"data-{args.topics - 1}", per_topic - 1).segments[i : i + 1] for i in range(SEGMENTS)
        ):
            if job.proc.poll() is not None:
                raise SystemExit(f"the job exited: {job.lines()[-3:]}")
            time.sleep(1)
        load_s = time.monotonic() - t0
        time.sleep(3 * args.trigger_ms / 1000)  # a few idle triggers: the kill lands between or inside batches
        job.kill(signal.SIGKILL)
        tracked = len(state.all_partitions())
        redis_keys, redis_bytes = state.size()

        overdue_segment(conn)
        job = Job(config, work / "restart.log")
        # nothing reads the broker while the job restarts: a consumer polling it would take CPU from the restart it
        # measures on this 2-core machine
        batch, restarted = job.first_batch(timeout_s=300), job.started
        first_batch, first_spark = batch if batch else (None, None)
        found = first_action_for(conn, "data-0", 0, time.time() + 60)
        job.kill(signal.SIGTERM)
        job = None
        if found is None:
            raise SystemExit("no decision within 300 s of the restart")
        _, record = found
        action_at = record["decided_at"] / 1000
        print(
            json.dumps(
                {
                    "benchmark": "restart_at_scale",
                    "partitions_tracked": tracked,
                    "groups": GROUPS,
                    "events": events,
                    "fill_seconds": round(fill_s, 1),
                    "first_run_load_seconds": round(load_s, 1),
                    "trigger_interval_ms": args.trigger_ms,
                    "restart_to_first_batch_seconds": round(first_batch - restarted, 2) if first_batch else None,
                    "restart_to_decision_seconds": round(action_at - restarted, 2),
                    "decision_after_first_batch_seconds": round(action_at - first_batch, 2) if first_batch else None,
                    "first_batch_spark_seconds": first_spark,
                    "decision": {k: record.get(k) for k in ("action", "reason", "status", "topic", "partition")},
                    "redis_keys": redis_keys,
                    "redis_used_memory_bytes": redis_bytes,
                }
            )
        )
    finally:
        if job is not None:
            job.kill(signal.SIGKILL)
        broker.stop()
        redis_svc.stop()
        shutil.rmtree(work, ignore_errors=True)  # the broker's data: about 100 MB a run


if __name__ == "__main__":
    main()
