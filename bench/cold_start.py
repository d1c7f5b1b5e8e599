"""Cold start: how soon `compactd run` (continuous, as deployed) completes its first micro-batch, Spark included.

Starts its own Redis and Apache Kafka broker. Each round uses fresh compactd topics, Redis prefix and checkpoint:

0. once: a clean start with an empty cache directory (XDG_CACHE_HOME), as on a machine that never ran compactd:
   Spark's JVM starts without its class-data archive and writes it as it stops;
1. clean start: a few segment events wait on an empty checkpoint; the job starts;
2. restart after a clean stop: SIGTERM (the job stops gracefully), a few more events, the job starts again;
3. restart after a crash: the job is running; `--crash-events` segment events and `--config-events` config events are
   written, and while Spark runs the batch that reads them (its offset log written, its commit not) the job's
   process group gets SIGKILL; the job starts again at once (the first batch replays the crashed one).

Per start it reads, from the job's log, the first `batch N:` line: start → first batch (process start to that line's
timestamp) and that batch's Spark seconds; after every stop, which processes the job started were still alive.
Prints one JSON object: per scenario min / median / max over `--rounds` and every round's figures.
Usage: python bench/cold_start.py [--rounds 3] [--records 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml
from confluent_kafka import Producer

from compactd.kafka.admin import ensure_topics
from compactd.local.broker import kafka_broker
from compactd.local.servers import redis_server
from compactd.settings import Settings, TopicNames

DAY = 86_400_000
BATCH_LINE = re.compile(r"compactd\.job: batch (\d+): (\d+) records .*; spark ([\d.]+)s, merge\+decide\+act ([\d.]+)s")


def _stat(pid: int) -> tuple[int, int, bool] | None:
    """(parent, start time, zombie) from /proc; None once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19]), fields[0] == b"Z"


def descendants(root: int) -> dict[int, int]:
    """pid → start time of `root` and everything below it."""
    stats = {int(d): s for d in os.listdir("/proc") if d.isdigit() and (s := _stat(int(d))) is not None}
    found = {root: stats[root][1]} if root in stats else {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start, _) in stats.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def alive(procs: dict[int, int]) -> int:
    return sum(1 for pid, start in procs.items() if (s := _stat(pid)) is not None and s[1] == start and not s[2])


class Job:
    """`compactd run` in a session of its own, as a supervisor starts it."""

    def __init__(self, config: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compactd", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(log, "w"),  # noqa: SIM115 - the child holds it
            start_new_session=True,
            env=env,
        )
        self.tree: dict[int, int] = {}

    def first_batch(self, timeout_s: float = 300) -> dict:
        """Waits for the first `batch N:` line: seconds from the process start to it, and the batch's figures."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                m = BATCH_LINE.search(line)
                if m:
                    at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    self.tree = descendants(self.proc.pid)
                    return {
                        "start_to_first_batch_s": round(at - self.started, 2),
                        "batch": int(m.group(1)),
                        "records": int(m.group(2)),
                        "spark_s": float(m.group(3)),
                        "act_s": float(m.group(4)),
                    }
            if self.proc.poll() is not None:
                raise SystemExit(f"the job exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        raise SystemExit(f"no batch within {timeout_s:.0f} s: {self.log.read_text()[-2000:]}")

    def stop(self, sig: int) -> dict:
        """SIGTERM: the driver (systemd's KillMode=mixed). SIGKILL: the whole process group (a crash)."""
        self.tree = self.tree or descendants(self.proc.pid)
        began = time.time()
        if sig == signal.SIGKILL:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        rc = self.proc.wait(180)
        took = time.time() - began
        time.sleep(2.0)
        return {"rc": rc, "stop_s": round(took, 2), "alive_2s_after_exit": alive(self.tree)}


def segment_events(topic: str, n: int, offset: int = 0) -> list[dict]:
    now = int(time.time() * 1000)
    return [
        {
            "type": "segment_rolled",
            "topic": topic,
            "partition": i % 50,
            "base_offset": offset + i * 10,
            "end_offset": offset + (i + 1) * 10,
            "first_batch_max_ts": now - 60_000,
            "size_bytes": 1 << 20,
            "ts": now,
        }
        for i in range(n)
    ]


def produce(settings: Settings, topic: str, events: list[dict], key: str = "k") -> None:
    p = Producer(settings.kafka_connection().client("producer", {"linger.ms": 5}))
    for ev in events:
        p.produce(topic, key=key.encode(), value=json.dumps(ev).encode())
    p.flush(30)


def config_events(n: int) -> list[dict]:
    now = int(time.time() * 1000)
    return [
        {"type": "config", "scope": "global", "set": {"max.compaction.lag.ms": DAY + v}, "version": v, "ts": now}
        for v in range(1, n + 1)
    ]


def batch_in_flight(spark_checkpoint: Path) -> bool:
    """Spark logged a batch's offsets and has not committed it: the batch is running."""

    def ids(sub: str) -> set[int]:
        folder = spark_checkpoint / sub
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()

    planned, done = ids("offsets"), ids("commits")
    return bool(planned) and max(planned) not in done


def job_settings(prefix: str, work: Path, broker: str, redis_url: str) -> tuple[Settings, Path]:
    """Settings with compactd topics, Redis prefix and checkpoint of their own; the topics exist; the config file."""
    settings = Settings(
        offsets_source="commits",
        bootstrap_servers=broker,
        redis_url=redis_url,
        redis_prefix=prefix,
        checkpoint_dir=str(work / f"ckpt-{prefix}"),
        trigger_interval_ms=1000,
        topics=TopicNames(**{k: f"{prefix}.{k}" for k in ("segments", "commits", "config", "actions", "dlq")}),
        thresholds={"global": {"max.compaction.lag.ms": DAY}},
    )
    config = work / f"compactd-{prefix}.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    ensure_topics(settings.kafka_connection(), settings.own_topics(), configs=settings.own_topic_configs())
    return settings, config


def first_start(work: Path, broker: str, redis_url: str, args: argparse.Namespace) -> dict:
    """A clean start on a machine that never ran compactd: an empty cache directory, so Spark's JVM starts without
    its class-data archive and writes one as it stops (kept apart: later starts use the user's cache)."""
    settings, config = job_settings("first", work, broker, redis_url)
    produce(settings, settings.topics.segments, segment_events("first-data", args.records))
    job = Job(config, work / "first.log", env={**os.environ, "XDG_CACHE_HOME": str(work / "empty-cache")})
    return {"start": job.first_batch(), "stop": job.stop(signal.SIGTERM)}


def one_round(n: int, work: Path, broker: str, redis_url: str, args: argparse.Namespace) -> dict:
    prefix = f"r{n}"
    settings, config = job_settings(prefix, work, broker, redis_url)
    spark_ckpt = Path(settings.checkpoint_dir) / "spark"
    out: dict = {}

    produce(settings, settings.topics.segments, segment_events(f"{prefix}-data", args.records))
    job = Job(config, work / f"{n}-clean.log")
    out["clean_start"] = job.first_batch()
    out["clean_stop"] = job.stop(signal.SIGTERM)

    produce(settings, settings.topics.segments, segment_events(f"{prefix}-data", args.records, 10_000))
    job = Job(config, work / f"{n}-restart.log")
    out["restart_after_clean_stop"] = job.first_batch()

    # the crash: a batch with many events and config events waiting, killed while Spark runs it
    produce(settings, settings.topics.config, config_events(args.config_events), key="global")
    produce(settings, settings.topics.segments, segment_events(f"{prefix}-data", args.crash_events, 20_000))
    deadline, inside = time.time() + 60, False
    while time.time() < deadline and not (inside := batch_in_flight(spark_ckpt)):
        time.sleep(0.005)
    out["crash"] = {"inside_batch": inside, **job.stop(signal.SIGKILL)}
    job = Job(config, work / f"{n}-crash.log")
    out["restart_after_kill9"] = job.first_batch()
    out["final_stop"] = job.stop(signal.SIGTERM)
    return out


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": round(statistics.median(values), 2), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=5, help="events waiting before each start")
    ap.add_argument("--crash-events", type=int, default=20_000, help="segment events in the batch the crash hits")
    ap.add_argument("--config-events", type=int, default=50, help="config events waiting at the crash")
    ap.add_argument("--no-empty-cache-start", dest="empty_cache_start", action="store_false", help="skip step 0")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compactd-cold-"))
    redis_svc, broker = redis_server(work / "redis"), kafka_broker(work / "broker")
    try:
        broker_at, redis_at = f"127.0.0.1:{broker.port}", f"redis://127.0.0.1:{redis_svc.port}/0"
        first = first_start(work, broker_at, redis_at, args) if args.empty_cache_start else None
        print(json.dumps({"first_start_empty_cache": first}), file=sys.stderr, flush=True)
        rounds = []
        for n in range(args.rounds):
            rounds.append(one_round(n, work, broker_at, redis_at, args))
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    finally:
        broker.stop()
        redis_svc.stop()
        shutil.rmtree(work, ignore_errors=True)  # the empty cache's class-data archive alone is ~150 MB
    summary: dict = {"benchmark": "cold_start", "rounds": args.rounds, "records": args.records}
    for scenario in ("clean_start", "restart_after_clean_stop", "restart_after_kill9"):
        summary[scenario] = {
            "start_to_first_batch_s": spread([r[scenario]["start_to_first_batch_s"] for r in rounds]),
            "first_batch_spark_s": spread([r[scenario]["spark_s"] for r in rounds]),
        }
    if first is not None:
        summary["first_start_empty_cache"] = {
            "start_to_first_batch_s": first["start"]["start_to_first_batch_s"],
            "first_batch_spark_s": first["start"]["spark_s"],
            "stop_s": first["stop"]["stop_s"],
        }
    summary["first_batch_records"] = {
        s: sorted({r[s]["records"] for r in rounds}) for s in ("clean_start", "restart_after_clean_stop")
    }
    summary["crash_inside_batch"] = [r["crash"]["inside_batch"] for r in rounds]
    stops = [r[k] for r in rounds for k in ("clean_stop", "crash", "final_stop")] + ([first["stop"]] if first else [])
    summary["processes_alive_2s_after_a_stop"] = max(s["alive_2s_after_exit"] for s in stops)
    summary["load_average_1m"] = round(os.getloadavg()[0], 2)
    summary["rounds_detail"] = rounds
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
