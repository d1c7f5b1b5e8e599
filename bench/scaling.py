"""Scaling curve: the throughput benchmark at 1k, 10k, 100k and 1M data partitions (mixed segment and commit events).

Each size runs `bench/throughput.py` in its own process (own Redis, broker and Spark session), its 8 rounds;
reported per size: events/s of the warm (last) round, its micro-batch time in Spark (and the first round's: the
JVM's first batch), then the merge and the decisions with their actions
(what a batch's decisions wait for after the Spark part), and the partitions tracked. By default every partition a
segment event names is overdue for compaction (a decision each: the storm after an outage); `--nothing-due` puts the
thresholds far away (the data path alone). Prints one JSON object.
Usage: python bench/scaling.py [--sizes 1000,10000,100000,1000000] [--events N] [--nothing-due] [--slices N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--nothing-due", action="store_true", help="thresholds far away: no decisions")
    ap.add_argument("--slices", type=int, default=0, help="evaluation_slices: per-topic work in N Spark tasks")
    args = ap.parse_args()
    here = Path(__file__).parent
    curve = []
    for size in (int(s) for s in args.sizes.split(",")):
        topics = max(1, size // 1000)
        out = subprocess.run(
            [sys.executable, str(here / "throughput.py"), "--events", str(args.events), "--topics", str(topics),
             "--partitions", str(size // topics), "--segment-share", "0.3",
             *(["--nothing-due"] if args.nothing_due else []), "--slices", str(args.slices)],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        run = json.loads(out.strip().splitlines()[-1])
        warm = run["rounds"][-1]
        first_spark = run["rounds"][0]["stages_seconds"]["spark_batches"]
        stages = warm["stages_seconds"]
        curve.append(
            {
                "partitions": size,
                "partitions_tracked": run["data_partitions"],
                "events_per_second": warm["events_per_second"],
                "spark_batch_seconds": stages["spark_batches"],
                # the first round's: the JVM's first large batch at this size (issue 65: within 2 x of the warm one)
                "spark_batch_seconds_first_round": first_spark,
                "first_to_warm_spark": round(first_spark / max(stages["spark_batches"], 1e-9), 2),
                "merge_seconds": stages["merge"],
                "decide_and_act_seconds": stages["decide_and_act"],
                "run_once_seconds": warm["run_once_seconds"],
                **({"slice_tasks": run["slice_tasks"]} if args.slices else {}),
            }
        )
        print(json.dumps(curve[-1]), file=sys.stderr, flush=True)
    first = curve[0]["events_per_second"]
    for row in curve:
        row["ratio_to_smallest"] = round(first / row["events_per_second"], 2)
    name = "scaling_curve_nothing_due" if args.nothing_due else "scaling_curve"
    out = {"benchmark": name, "events": args.events, "slices": args.slices, "curve": curve, "target_ratio": 2}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
