"""The version matrix: the suite's `versions` tests (`pytest -m versions`: the core loop through the agent and
`__consumer_offsets`, classic groups, Kafka's cleaner answering a nudge, topics deleted and created again, the
deleteRecords rules, transactions, the compaction service's view and its plain readers, `doctor`'s ACL answers, a
broker killed with -9) on each Apache Kafka line and mode the test broker runs (local/broker.py `KafkaLine`), one
after another, each with its own brokers.

Writes `tests/versions.json` (each line's counts, its failures by name and its time) and renders the README's table
from it between markers, so the README says what the last matrix run proved and nothing more.

Usage: python tests/matrix.py [--only 3.9.1:zk ...] [--workers N] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tests" / "versions.json"
README = ROOT / "README.md"
START, END = "<!-- versions:start -->", "<!-- versions:end -->"


def matrix() -> list[tuple[str, str]]:
    """(version, mode): the default line (4.x, KRaft only), then each older line in KRaft and ZooKeeper mode (2.8 in
    ZooKeeper mode only: its KRaft was an early access)."""
    from compactd.local.broker import OLDER_LINES, kafka_version

    rows = [(kafka_version(), "kraft")]
    for line in OLDER_LINES.values():
        rows += [(line.version, mode) for mode in ("kraft", "zk") if mode == "zk" or line.release >= (3, 0)]
    return rows


def run(version: str, mode: str, workers: int) -> dict:
    """The `versions` tests on one line and mode, in a pytest of their own; its junit report counted."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "COMPACTD_KAFKA_VERSION": version, "COMPACTD_KAFKA_MODE": mode}
        argv = [sys.executable, "-m", "pytest", "-q", "-m", "versions", "-n", str(workers), "--dist", "worksteal",
                f"--junitxml={report}", "-p", "no:cacheprovider"]  # fmt: skip
        t0 = time.monotonic()
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        if not report.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise SystemExit(f"pytest on Apache Kafka {version} ({mode}) wrote no report: {' / '.join(tail)}")
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        assert suite is not None
        failed, skipped, why = [], [], {}
        for case in suite.iter("testcase"):
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                failed.append(name)
                why[name] = (bad.get("message") or "").strip().splitlines()[0][:300] if bad.get("message") else ""
            elif (skip := case.find("skipped")) is not None:
                skipped.append(f"{name}: {skip.get('message', '')}")
        total = int(suite.get("tests", 0))
        return {
            "kafka": version,
            "mode": mode,
            "passed": total - len(failed) - len(skipped),
            "failed": failed,
            "why": why,  # each failure's first line (the CI log shows it; the table names the test)
            "skipped": skipped,
            "seconds": round(seconds),
            "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        }


# What each line lacks that the tests meet, and how they read it there (the same tests: they ask the line)
LACKS = {
    (4,): "",
    (3, 9): "KIP-848 groups (a preview, off): the groups are classic; commit values v3, without the topic's ID; no "
    "share or streams groups, no `__share_group_state`",
    (3, 6): "as 3.9; `log.initial.task.delay.ms` (retention and checkpoints start 30 s after the broker)",
    (2, 8): "as 3.6; KIP-937's timestamp bounds (a view gets `message.timestamp.difference.max.ms`); no KRaft mode",
}


def lacks(version: str) -> str:
    major, minor = (int(x) for x in version.split(".")[:2])
    return LACKS.get((major, minor), LACKS.get((major,), "")) or "nothing the tests use"


def table(rows: list[dict]) -> str:
    """The README's table: a row per line and mode, from the last matrix run."""
    out = ["| Apache Kafka | mode | `versions` tests passed | failed | skipped | time | run | what the line lacks |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        mode = "KRaft" if r["mode"] == "kraft" else "ZooKeeper"
        skipped = "; ".join(s.split(": ", 1)[-1] for s in r["skipped"]) or "none"
        failed = ", ".join(f"`{f}`" for f in r["failed"]) or "none"
        out.append(f"| {r['kafka']} | {mode} | {r['passed']} | {failed} | {skipped} | {r['seconds']} s | {r['when']} "
                   f"| {lacks(r['kafka'])} |")  # fmt: skip
    return "\n".join(out)


def write_readme(rows: list[dict]) -> None:
    text = README.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {START} ... {END} markers")
    README.write_text(pattern.sub(lambda _m: f"{START}\n{table(rows)}\n{END}", text))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None, help="VERSION:MODE pairs (default: the whole matrix)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="update tests/versions.json and the README's table")
    args = ap.parse_args()
    wanted = [tuple(p.split(":")) for p in args.only] if args.only else matrix()
    old = {(r["kafka"], r["mode"]): r for r in json.loads(RESULTS.read_text())} if RESULTS.exists() else {}
    failed = False
    for version, mode in wanted:
        row = run(version, mode, args.workers)
        print(json.dumps(row), flush=True)
        old[(version, mode)] = row
        failed |= bool(row["failed"])
    if args.write:
        rows = [old[k] for k in matrix() if k in old]
        RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
        write_readme(rows)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
