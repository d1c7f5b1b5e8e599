"""The driver's share of one micro-batch that touches every partition with nothing due.

A real redis-server, the real controller and state, no Spark: a first batch writes one closed segment and two groups'
offsets per partition (`--groups`: that many), the second moves every offset (every partition touched, nothing due:
retention and lag far away). Reports the second batch's seconds, µs per partition, how much of it reading the state
and the merge took, and the Redis server's own CPU time in it (`INFO cpu`) beside the rest (Python, mostly).
Prints one JSON object. Usage: python bench/driver_batch.py [--partitions 100000] [--groups 2] [--slices N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from state_footprint import breakdown  # bench/ is the script's directory: first on sys.path

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.local.servers import redis_server
from compactd.model import Segment
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

PER_TOPIC = 1000


def batch(partitions: int, i: int, now: int, groups: int = 2) -> BatchChanges:
    changes = BatchChanges()
    for t in range(max(1, partitions // PER_TOPIC)):
        tc = changes.topic(f"topic{t}")
        for p in range(min(partitions, PER_TOPIC)):
            if i == 0:
                tc.segments.append((p, Segment(0, 100, now - 1000, 1000, now - 500)))
            for group in (f"g{g + 1}" for g in range(groups)):
                tc.offsets.append((group, p, 10 + i))
    return changes


def redis_cpu(state: RedisState) -> float:
    """Seconds of CPU the Redis server has used (user + system)."""
    info = state.r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=2, help="groups committing on every partition in each batch")
    ap.add_argument("--slices", type=int, default=0, help="merge and plan in N slices of topics (control/slices.py)")
    args = ap.parse_args()
    svc = redis_server(Path(tempfile.mkdtemp(prefix="compactd-bench-")))
    try:
        state = RedisState.from_url(f"redis://127.0.0.1:{svc.port}/0", "cd:default")
        state.start()
        layers = {"global": {"consumed.retention.ms": 10**9, "max.compaction.lag.ms": 10**9}}
        ctl = Controller(state, layers, RecordingSink(), None, Metrics(CollectorRegistry()), slices=args.slices)
        now = int(time.time() * 1000)
        base = int(state.r.info("memory")["used_memory"])
        ctl.on_batch("bench", 0, batch(args.partitions, 0, now, args.groups))
        spent = {"read_state": 0.0, "merge": 0.0}
        # the reads: the controller's (pipelined per chunk, beside its planning) and the slices' (one topic each)
        chunks, numbers, merge = state.read_chunks, state.partition_numbers, state.merge

        def timed(name: str, fn: Any) -> Any:
            def run(*a: Any, **k: Any) -> Any:
                t0 = time.monotonic()
                try:
                    return fn(*a, **k)
                finally:
                    spent[name] += time.monotonic() - t0

            return run

        state.read_chunks = timed("read_state", chunks)  # type: ignore[method-assign]
        state.partition_numbers = timed("read_state", numbers)  # type: ignore[method-assign]
        state.merge = timed("merge", merge)  # type: ignore[method-assign]
        changes = batch(args.partitions, 1, now, args.groups)
        cpu0 = redis_cpu(state)
        t0 = time.monotonic()
        ctl.on_batch("bench", 1, changes)
        seconds = time.monotonic() - t0
        redis_s = redis_cpu(state) - cpu0
        held = int(state.r.info("memory")["used_memory"]) - base
        out = {
            "benchmark": "driver_batch",
            "partitions": args.partitions,
            "groups": args.groups,
            "slices": args.slices,
            "seconds": round(seconds, 2),
            "us_per_partition": round(seconds / args.partitions * 1e6, 1),
            "read_state_seconds": round(spent["read_state"], 2),
            "merge_seconds": round(spent["merge"], 2),
            "rest_seconds": round(seconds - spent["read_state"] - spent["merge"], 2),
            # what Redis itself spent (INFO cpu): the per-partition cost a Redis shard carries, for sizing
            "redis_cpu_us_per_partition": round(redis_s / args.partitions * 1e6, 1),
            "python_us_per_partition": round((seconds - redis_s) / args.partitions * 1e6, 1),
            "target_us_per_partition": 30,
            # what the state holds after the two batches, a partition with its one segment and its groups' offsets
            # (Redis' used_memory growth, with compactd's REDIS_CONFIG on the server), and by kind of key
            "redis_bytes_per_partition": round(held / args.partitions),
            "target_redis_bytes_per_partition": 230,
            "redis_by_key_kind": breakdown(state.r),
        }
        print(json.dumps(out), flush=True)
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
