"""Redis footprint of compactd's state: bytes per partition (with its segments) and per (group, partition) offset.

Starts its own redis-server and merges the state of `--partitions` partitions (spread over topics of 1,000
partitions), `--segments` segments each, then `--groups` consumer groups' offsets on all of them, through the same
merge script the job uses, one batch per topic. Reports Redis' `used_memory` growth for each step, the key count,
and the merge rate. Prints one JSON object. Usage: python bench/state_footprint.py [--partitions N] [--groups G]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import redis

from compactd.local.servers import redis_server
from compactd.model import Segment
from compactd.state.changes import BatchChanges
from compactd.state.keys import REDIS_CONFIG
from compactd.state.redis_store import RedisState


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def breakdown(r: redis.Redis) -> dict[str, dict[str, int]]:
    """Bytes and keys by kind of key (the part after the topic's hash tag, without the partition): where it goes."""
    out: dict[str, dict[str, int]] = {}
    keys = list(r.scan_iter(count=10_000))
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("MEMORY", "USAGE", k, "SAMPLES", "0")
    for k, size in zip(keys, pipe.execute(), strict=True):
        name = k.decode()
        kind = name.split("}:", 1)[1].split(":", 1)[0] if "}:" in name else name.split(":")[2]
        slot = out.setdefault(kind, {"keys": 0, "bytes": 0})
        slot["keys"] += 1
        slot["bytes"] += int(size or 0)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--segments", type=int, default=5)
    ap.add_argument("--per-topic", type=int, default=1_000)
    ap.add_argument(
        "--redis-defaults", action="store_true", help="Redis' default encodings instead of compactd's REDIS_CONFIG"
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compactd-footprint-"))
    defaults = ("--hash-max-listpack-value", "64", "--set-max-intset-entries", "512")
    svc = redis_server(work / "redis", extra=defaults if args.redis_defaults else ())
    try:
        client = redis.Redis(port=svc.port)
        state = RedisState(client, prefix="cd:bench")
        topics = [f"topic-{i}" for i in range((args.partitions + args.per_topic - 1) // args.per_topic)]
        parts = {t: range(min(args.per_topic, args.partitions - i * args.per_topic)) for i, t in enumerate(topics)}
        now = int(time.time() * 1000)
        batch = 0
        base = used_memory(client)

        def merge_all(build: object) -> tuple[int, float]:
            nonlocal batch
            updates, t0 = 0, time.monotonic()
            for topic in topics:
                changes = BatchChanges()
                updates += build(changes.topic(topic), parts[topic])  # type: ignore[operator]
                state.merge("bench", batch, changes, lambda _g, _t: True)
                batch += 1
            return updates, time.monotonic() - t0

        def segments(tc: object, ps: range) -> int:
            for p in ps:
                for s in range(args.segments):  # one segment rolled an hour, 1 MiB and 1,000 records each
                    closed = now - (args.segments - s) * 3_600_000 + p
                    seg = Segment(s * 1000, (s + 1) * 1000, closed - 3_599_000, 1 << 20, closed)
                    tc.segments.append((p, seg))  # type: ignore[attr-defined]
            return len(ps) * args.segments

        seg_updates, seg_s = merge_all(segments)
        after_segments = used_memory(client)

        def offsets(tc: object, ps: range) -> int:
            for g in range(args.groups):
                for p in ps:
                    tc.offsets.append((f"group-{g}", p, 2_500 + g))  # type: ignore[attr-defined]
            return len(ps) * args.groups

        off_updates, off_s = merge_all(offsets)
        after_offsets = used_memory(client)
        n = args.partitions
        per_partition = (after_segments - base) / n
        per_group_partition = (after_offsets - after_segments) / (n * args.groups)
        print(
            json.dumps(
                {
                    "benchmark": "state_footprint",
                    "partitions": n,
                    "groups": args.groups,
                    "segments_per_partition": args.segments,
                    "redis_config": "defaults" if args.redis_defaults else REDIS_CONFIG,
                    "keys": client.dbsize(),
                    "used_memory_bytes": after_offsets - base,
                    "bytes_per_partition_with_segments": round(per_partition),
                    "bytes_per_group_partition": round(per_group_partition),
                    "targets": {"bytes_per_partition_with_segments": 150, "bytes_per_group_partition": 40},
                    "by_key_kind": breakdown(client),
                    "merge_updates_per_second": {
                        "segments": round(seg_updates / seg_s),
                        "offsets": round(off_updates / off_s),
                    },
                }
            )
        )
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
