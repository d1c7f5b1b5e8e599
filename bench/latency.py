"""Decision latency of the continuous job, and what a tiny micro-batch costs.

Starts its own Redis and Apache Kafka broker and `compactd run` (continuous, `--trigger-ms`, dry-run). Then, for
`--samples` partitions each:
- event-driven: a segment event that is already overdue is produced; latency = the action record's `decided_at`
  minus the produce time;
- deadline-driven: a segment event that becomes overdue 5 to 15 s later is produced; latency = `decided_at` minus the
  moment it became overdue.
Reports p50/p99/max of both, and the Spark seconds of the job's micro-batches of at most 10 records (from its log).
Prints one JSON object. Usage: python bench/latency.py [--samples N] [--trigger-ms MS]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from confluent_kafka import Consumer, Producer

from compactd.keys import partition_key
from compactd.local.broker import kafka_broker
from compactd.local.servers import redis_server
from compactd.settings import Settings

LAG_MS = 3_600_000


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99), "max": pct(values, 1.0)}


def segment(topic: str, first_ts: int) -> bytes:
    ev = {
        "type": "segment_rolled",
        "topic": topic,
        "partition": 0,
        "base_offset": 0,
        "end_offset": 100,
        "first_batch_max_ts": first_ts,
        "size_bytes": 1,
        "ts": int(time.time() * 1000),
    }
    return json.dumps(ev).encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--trigger-ms", type=int, default=1000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compactd-latency-"))
    redis_svc, broker = redis_server(work / "redis"), kafka_broker(work / "broker")
    job = None
    try:
        settings = Settings(
            offsets_source="commits",
            bootstrap_servers=f"127.0.0.1:{broker.port}",
            redis_url=f"redis://127.0.0.1:{redis_svc.port}/0",
            checkpoint_dir=str(work / "ckpt"),
            trigger_interval_ms=args.trigger_ms,
            thresholds={"global": {"max.compaction.lag.ms": LAG_MS, "actions.per.second": 1000}},
        )
        config = work / "compactd.yaml"
        config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
        conn = settings.kafka_connection()
        log = work / "job.log"
        job = subprocess.Popen(
            [sys.executable, "-m", "compactd", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(log, "w"),  # noqa: SIM115 - the child holds it
            start_new_session=True,
        )
        producer = Producer(conn.client("producer", {"linger.ms": 0}))
        # warm up: the first micro-batches pay Spark's and the Python workers' cold start
        producer.produce(settings.topics.segments, key=b"w", value=segment("warmup", int(time.time() * 1000)))
        producer.flush()
        deadline = time.time() + 180
        while "batch " not in log.read_text(errors="replace"):
            if job.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the job did not start: {log.read_text(errors='replace')[-500:]}")
            time.sleep(0.5)
        time.sleep(5)

        expected: dict[str, tuple[str, float]] = {}  # topic -> (kind, reference time in ms)
        decided: dict[str, int] = {}
        done = threading.Event()

        def read_actions() -> None:
            c = Consumer(conn.client("consumer", {"group.id": f"lat-{time.time()}", "auto.offset.reset": "earliest"}))
            c.subscribe([settings.topics.actions])
            while not done.is_set():
                msg = c.poll(0.2)
                if msg is not None and not msg.error():
                    rec = json.loads(msg.value())
                    decided.setdefault(rec["topic"], rec["decided_at"])
            c.close()

        reader = threading.Thread(target=read_actions, daemon=True)
        reader.start()
        for i in range(args.samples):
            now = int(time.time() * 1000)
            topic = f"event-{i}"
            expected[topic] = ("event", now)
            producer.produce(
                settings.topics.segments, key=partition_key(topic, 0).encode(), value=segment(topic, now - 2 * LAG_MS)
            )
            due_in = 5_000 + (i * 997) % 10_000
            topic = f"deadline-{i}"
            expected[topic] = ("deadline", now + due_in)
            first_ts = now + due_in - LAG_MS - 1  # overdue (strictly past the lag) at now + due_in
            producer.produce(
                settings.topics.segments, key=partition_key(topic, 0).encode(), value=segment(topic, first_ts)
            )
            producer.flush()
            time.sleep(1.5)
        wait_until = time.time() + 60
        while len([t for t in expected if t in decided]) < len(expected) and time.time() < wait_until:
            time.sleep(0.5)
        done.set()
        reader.join(5)

        lat: dict[str, list[float]] = {"event": [], "deadline": []}
        for topic, (kind, ref) in expected.items():
            if topic in decided:
                lat[kind].append((decided[topic] - ref) / 1000)
        small = [
            float(m.group(2))
            for m in re.finditer(r"batch \d+: (\d+) records .*?; spark ([\d.]+)s", log.read_text(errors="replace"))
            if int(m.group(1)) <= 10
        ]
        print(
            json.dumps(
                {
                    "benchmark": "decision_latency",
                    "trigger_interval_ms": args.trigger_ms,
                    "event_driven_seconds": summary(lat["event"]),
                    "deadline_driven_seconds": summary(lat["deadline"]),
                    "missing_decisions": len(expected) - sum(len(v) for v in lat.values()),
                    "tiny_batch_spark_seconds": summary(small),
                }
            )
        )
    finally:
        if job is not None and job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
        broker.stop()
        redis_svc.stop()


if __name__ == "__main__":
    main()
