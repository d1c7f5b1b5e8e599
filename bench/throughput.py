"""Throughput of `run --once` on pre-filled topics: events/s from Kafka through Spark, Redis merge and decisions.

Starts its own Redis and noida-db broker, fills the segments and commits topics (spread over partitions: the test
broker answers a fetch with a partition's whole backlog), then times the job. Prints one JSON object.
Usage: python bench/throughput.py [--events N] [--partitions P] [--topics T]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compactd.app.application import Application
from compactd.app.settings import Settings
from compactd.demo.embedded import kafka_broker, redis_server
from compactd.kafka.config import KafkaConnection
from compactd.keys import partition_key
from compactd.streaming.session import spark_session


def fill(
    bootstrap: str, events: int, data_topics: int, partitions: int, source_partitions: int, segment_share: float = 0.3
) -> None:
    conn = KafkaConnection(bootstrap)
    admin = AdminClient(conn.client("admin"))
    existing = admin.list_topics(timeout=10).topics
    wanted = [t for t in ("compactd.segments", "compactd.commits") if t not in existing]
    for fut in admin.create_topics([NewTopic(t, source_partitions, 1) for t in wanted]).values() if wanted else []:
        fut.result(30)
    p = Producer(
        conn.client(
            "producer", {"linger.ms": 20, "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000}
        )
    )
    rnd = random.Random(7)
    now = int(time.time() * 1000)
    next_base: dict[tuple[str, int], int] = {}
    groups = [f"group-{i}" for i in range(20)]
    for i in range(events):
        topic = f"data-{rnd.randrange(data_topics)}"
        part = rnd.randrange(partitions)
        if (i % 100) < segment_share * 100:
            base = next_base.get((topic, part), 0)
            next_base[(topic, part)] = base + 1000
            ev = {
                "type": "segment_rolled",
                "topic": topic,
                "partition": part,
                "base_offset": base,
                "end_offset": base + 1000,
                "first_batch_max_ts": now - 7_200_000 + i,
                "size_bytes": 1 << 20,
                "ts": now - 3_600_000 + i,
            }
            p.produce(
                "compactd.segments",
                key=partition_key(topic, part).encode(),
                value=json.dumps(ev).encode(),
                partition=i % source_partitions,
            )
        else:
            g = rnd.choice(groups)
            ev = {"type": "offset_commit", "group": g, "topic": topic, "partition": part, "offset": i, "ts": now}
            p.produce(
                "compactd.commits", key=g.encode(), value=json.dumps(ev).encode(), partition=hash(g) % source_partitions
            )
        if i % 50_000 == 0:
            p.flush()
    p.flush()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("compactd").setLevel(logging.INFO)  # per-batch phase timings on stderr
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=50)
    ap.add_argument("--source-partitions", type=int, default=8)
    ap.add_argument("--max-rows-per-trigger", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=2, help="fill + run --once again in the same Spark session")
    ap.add_argument("--segment-share", type=float, default=0.3, help="share of segment events; the rest are commits")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compactd-bench-"))
    redis_svc, broker = redis_server(work / "redis"), kafka_broker(work / "broker")
    try:
        bootstrap = f"127.0.0.1:{broker.port}"
        t0 = time.monotonic()
        spark = spark_session()
        spark_start_s = time.monotonic() - t0
        settings = Settings(
            bootstrap_servers=bootstrap,
            redis_url=f"redis://127.0.0.1:{redis_svc.port}/0",
            checkpoint_dir=str(work / "ckpt"),
            max_rows_per_trigger=args.max_rows_per_trigger,
            thresholds={
                "global": {"max.compaction.lag.ms": 3_600_000, "consumed.retention.ms": 600_000},
                f"topic:{'data-0'}": {"forced.retention.ms": 1_800_000},
            },
            kafka={"receive.message.max.bytes": "1000000000"},
        )
        rounds = []
        for _ in range(args.rounds):  # the first round pays Spark's and the Python workers' cold start
            t0 = time.monotonic()
            fill(bootstrap, args.events, args.topics, args.partitions, args.source_partitions, args.segment_share)
            fill_s = time.monotonic() - t0
            with Application(settings, spark=spark) as app:
                t0 = time.monotonic()
                app.run(once=True)
                run_s = time.monotonic() - t0
            rounds.append(
                {
                    "fill_seconds": round(fill_s, 2),
                    "run_once_seconds": round(run_s, 2),
                    "events_per_second": round(args.events / run_s),
                    "micro_batches": app.summary.batches,
                }
            )
        tracked = len(settings.redis_state().all_partitions())
        print(
            json.dumps(
                {
                    "benchmark": "run_once_throughput",
                    "events": args.events,
                    "data_partitions": tracked,
                    "source_partitions": args.source_partitions,
                    "segment_share": args.segment_share,
                    "spark_start_seconds": round(spark_start_s, 2),
                    "events_per_second": rounds[-1]["events_per_second"],
                    "rounds": rounds,
                }
            )
        )
    finally:
        broker.stop()
        redis_svc.stop()


if __name__ == "__main__":
    main()
