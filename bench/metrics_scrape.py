"""Series count and scrape time of the driver's /metrics with many partitions tracked.

The real path: partitions are merged into a real Redis (an embedded redis-server) and evaluated by the real
controller, which hands each partition's stats to the metrics; then /metrics is rendered the way a scrape does.
Prints one JSON object. Usage: python bench/metrics_scrape.py [--partitions N] [--topics T] [--top-n N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry, generate_latest

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.local.servers import redis_server
from compactd.model import Segment
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--topics", type=int, default=50)
    ap.add_argument("--top-n", type=int, default=100)
    args = ap.parse_args()
    now = int(time.time() * 1000)
    with tempfile.TemporaryDirectory() as tmp:
        svc = redis_server(Path(tmp))
        try:
            client = redis.Redis(port=svc.port)
            metrics = Metrics(CollectorRegistry(), top_n=args.top_n)
            layers = {"global": {"max.compaction.lag.ms": H, "consumed.retention.ms": H, "forced.retention.ms": 6 * H}}
            ctl = Controller(RedisState(client), layers, RecordingSink(), None, metrics, clock=lambda: now)
            batch = BatchChanges()
            for i in range(args.partitions):
                topic, p = f"topic-{i % args.topics}", i // args.topics
                tc = batch.topic(topic)
                age = (1 + i % 9) * H
                tc.segments.append((p, Segment(0, 1000, now - age, 1 << 20, now - age)))
                tc.segments.append((p, Segment(1000, 2000, now - H // 4, 1 << 20, now - H // 4)))
                tc.offsets.append(("billing", p, 500 + i % 1500))
            started = time.perf_counter()
            ctl.on_batch("bench", 0, batch)
            evaluate_s = time.perf_counter() - started
            times, lines = [], []
            for _ in range(5):
                t = time.perf_counter()
                text = generate_latest(metrics.registry).decode()
                times.append(time.perf_counter() - t)
                lines = [ln for ln in text.splitlines() if ln.startswith("compactd_")]
            print(
                json.dumps(
                    {
                        "bench": "metrics_scrape",
                        "partitions": args.partitions,
                        "topics": args.topics,
                        "top_n": args.top_n,
                        "merge_and_evaluate_s": round(evaluate_s, 2),
                        "compactd_series": len(lines),
                        "per_partition_series": sum('partition="' in ln for ln in lines),
                        "scrape_ms_median": round(statistics.median(times) * 1000, 1),
                        "scrape_ms_max": round(max(times) * 1000, 1),
                        "scrape_bytes": len(text),
                    }
                )
            )
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
