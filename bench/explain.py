"""How long `compactd explain TOPIC` takes on one topic of `--partitions` partitions (default 100,000).

Starts its own redis-server, merges `--segments` segments per partition and `--groups` groups' offsets (one of them
lagging) through the job's merge script, queues some live action records, then times, `--repeat` times each (the
machine is shared: every figure is reported with all its runs and their median):
  - the command as people run it (`print_explain` to a buffer, default --limit 20, text and --json), with what it
    prints and its peak memory;
  - the ranking alone (a few numbers per partition read from Redis, ordered over numpy arrays);
  - `explain TOPIC/PARTITION` for a partition with a compaction in the outbox (it reads the in-flight count), and
    that count alone;
then, once, every partition explained (`--limit 0`): the Redis reads and the pure explanations, then their JSON and
text renderings. Prints one JSON object.
Usage: python bench/explain.py [--partitions N] [--groups G] [--segments S] [--repeat R]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from compactd.app.explain_cli import LIMIT, explain, print_explain, rank, read_target
from compactd.explain.text import format_text
from compactd.local.servers import redis_server
from compactd.model import ActionRecord, Segment
from compactd.settings import Settings
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, Any]:
    """Seconds of each run of `fn`, and their median."""
    runs = []
    for _ in range(repeat):
        t0 = time.monotonic()
        fn()
        runs.append(round(time.monotonic() - t0, 3))
    return {"median": round(statistics.median(runs), 3), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--segments", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
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

        # the command first, so max RSS after it is what the default command needs
        printed: dict[str, tuple[str, str]] = {}  # stdout, stderr

        def command(name: str, target: str, **kw: Any) -> Callable[[], None]:
            def run() -> None:
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    print_explain(settings, target, **kw)
                printed[name] = out.getvalue(), err.getvalue()

            return run

        cli = {
            "text": timed(command("text", topic), args.repeat),
            "json": timed(command("json", topic, as_json=True), args.repeat),
            "partition_text": timed(command("partition", f"{topic}/{n // 2}"), args.repeat),
        }
        command_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        rank_s = timed(lambda: rank(state, read_target(state, settings, topic), now), args.repeat)
        one_s = timed(lambda: explain(state, settings, f"{topic}/{n // 2}", now), args.repeat)
        in_flight_s = timed(state.compactions_in_flight, args.repeat)

        t0 = time.monotonic()
        out = explain(state, settings, topic, now, limit=0)
        explain_all_s = time.monotonic() - t0
        t0 = time.monotonic()
        json_bytes = sum(len(json.dumps(e)) + 1 for e in out)
        json_s = time.monotonic() - t0
        t0 = time.monotonic()
        text_bytes = sum(len(format_text(e)) + 2 for e in out)
        text_s = time.monotonic() - t0
        print(
            json.dumps(
                {
                    "benchmark": "explain",
                    "partitions": n,
                    "groups": args.groups,
                    "segments_per_partition": args.segments,
                    "live_records": len(recs),
                    "repeat": args.repeat,
                    "state_build_seconds": round(build_s, 1),
                    "default_limit": LIMIT,
                    "command_seconds": cli,
                    "default_output": {
                        "text_bytes": len(printed["text"][0]),
                        "text_last_line": printed["text"][0].rstrip("\n").rsplit("\n", 1)[-1],
                        "json_lines": printed["json"][0].count("\n"),
                        "json_stderr": printed["json"][1].strip(),
                    },
                    "rank_seconds": rank_s,
                    "explain_partition_seconds": one_s,
                    "in_flight_count_seconds": in_flight_s,
                    "all_partitions": {
                        "explain_seconds": round(explain_all_s, 2),
                        "json_seconds": round(json_s, 2),
                        "json_bytes": json_bytes,
                        "text_seconds": round(text_s, 2),
                        "text_bytes": text_bytes,
                    },
                    "worst": out[0]["partition"],
                    "max_rss_mb": {"after_building_state": build_rss_mb, "after_the_commands": command_rss_mb},
                }
            )
        )
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
