"""How long `compactd explain TOPIC` takes on one topic of `--partitions` partitions (default 100,000).

Starts its own redis-server, merges `--segments` segments per partition and `--groups` groups' offsets (one of them
lagging) through the job's merge script, queues some live action records, then times `explain` (Redis reads and the
pure explanation, sorted worst first), the JSON and text rendering, `explain TOPIC/PARTITION`, and the command's own
path (`print_explain`, to /dev/null) with its peak memory. Prints one JSON object.
Usage: python bench/explain.py [--partitions N] [--groups G] [--segments S]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import redis

from compactd.app.explain import explain, format_text, print_explain
from compactd.app.settings import Settings
from compactd.demo.embedded import redis_server
from compactd.model import ActionRecord, Segment
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--segments", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compactd-explain-"))
    svc = redis_server(work / "redis")
    try:
        client = redis.Redis(port=svc.port)
        settings = Settings(
            redis_url=f"redis://127.0.0.1:{svc.port}/0",
            thresholds={"global": {"max.compaction.lag.ms": H, "consumed.retention.ms": H, "dry.run": False}},
        )
        state = RedisState(client, prefix=settings.key_prefix)
        now = int(time.time() * 1000)
        topic, n = "big", args.partitions
        t0 = time.monotonic()
        for batch, start in enumerate(range(0, n, 5_000)):
            changes = BatchChanges()
            tc = changes.topic(topic)
            for p in range(start, min(start + 5_000, n)):
                for s in range(args.segments):
                    closed = now - (args.segments - s) * H + p % 1000
                    tc.segments.append((p, Segment(s * 1000, (s + 1) * 1000, closed - 60_000, 1 << 20, closed)))
                tc.compacted.append((p, 1000 * (p % args.segments)))
                for g in range(args.groups):
                    tc.offsets.append((f"group-{g}", p, 3_500 + 100 * g - (p % 7) * 500 * (g == 0)))
            tc.commit_ts = {f"group-{g}": now - g * 60_000 for g in range(args.groups)}
            state.merge("bench", batch, changes, lambda _g, _t: True)
        recs = [
            ActionRecord(f"r{p}", "compact", topic, p, "max_compaction_lag", False, now - 1000, "pending", delay_ms=1)
            for p in range(0, n, 10)
        ]
        state.enqueue(*recs)
        build_s = time.monotonic() - t0
        build_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

        # the command first (it keeps only each partition's rendered text), so max RSS here is what it needs
        cli: dict[str, float] = {}
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            for name, kw in (("json", {"as_json": True}), ("text", {}), ("text_limit_10", {"limit": 10})):
                t0 = time.monotonic()
                print_explain(settings, topic, **kw)  # type: ignore[arg-type]
                cli[name] = round(time.monotonic() - t0, 2)
        command_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

        t0 = time.monotonic()
        out = explain(state, settings, topic, now)
        explain_s = time.monotonic() - t0
        t0 = time.monotonic()
        json_bytes = sum(len(json.dumps(e)) + 1 for e in out)
        json_s = time.monotonic() - t0
        t0 = time.monotonic()
        text_bytes = sum(len(format_text(e)) + 2 for e in out)
        text_s = time.monotonic() - t0
        t0 = time.monotonic()
        explain(state, settings, f"{topic}/{n // 2}", now)
        one_s = time.monotonic() - t0
        print(
            json.dumps(
                {
                    "benchmark": "explain",
                    "partitions": n,
                    "groups": args.groups,
                    "segments_per_partition": args.segments,
                    "live_records": len(recs),
                    "state_build_seconds": round(build_s, 1),
                    "explain_topic_seconds": round(explain_s, 2),
                    "json_seconds": round(json_s, 2),
                    "json_bytes": json_bytes,
                    "text_seconds": round(text_s, 2),
                    "text_bytes": text_bytes,
                    "explain_partition_seconds": round(one_s, 3),
                    "command_seconds": cli,
                    "worst": out[0]["partition"],
                    "max_rss_mb": {"after_building_state": build_rss_mb, "after_the_command": command_rss_mb},
                }
            )
        )
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
