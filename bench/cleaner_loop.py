"""KIP-354 closed by Apache Kafka's own cleaner, timed: from the moment a partition's dirty records are due (their
segment's first-batch max timestamp + compactd's max.compaction.lag.ms) to the nudge, to Kafka's clean (the broker's
cleaner-offset-checkpoint), to the nudge put back. Also the broker's own start: seconds to ready and RSS.

Starts its own Redis and Apache Kafka broker (the test launcher, compactd.local.broker), the segment agent on the
broker's log dir and the continuous job (local Spark). ROUNDS compacted topics, one after the other, each set up as
in tests/e2e/test_kafka_cleaner.py: a clean head of 400 keys (Kafka cleans it by itself: nothing is clean yet), then
20 overwritten keys in a closed segment, too few for min.cleanable.dirty.ratio 0.5: Kafka alone never cleans them.
Timings come from the broker: its topic config (DescribeConfigs, polled every 50 ms) and its checkpoint file.

Prints one JSON object. Usage: python bench/cleaner_loop.py [--rounds N] [--lag-ms MS]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from latency import summary  # p50/p99/max, as the latency bench reports them (bench/ is on the path)

from compactd.agent.agent import KafkaPublisher, SegmentAgent, run_agent
from compactd.agent.logdir import read_checkpoint, scan_log_dir
from compactd.daemon.application import Application
from compactd.local.broker import kafka_broker, kafka_version
from compactd.local.servers import redis_server
from compactd.settings import Settings, TopicNames

ROLL_MS = 1_000


def wait(what: str, check, timeout_s: float, every_s: float = 0.05) -> float:
    """Poll `check` until true; the epoch ms it first was."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(every_s)
    return time.time() * 1000


def nudge_value(admin: AdminClient, topic: str) -> str | None:
    res = ConfigResource("TOPIC", topic)
    entry = admin.describe_configs([res])[res].result(30)["max.compaction.lag.ms"]
    return None if entry.is_default else entry.value


def prepare(admin: AdminClient, producer: Producer, log_dir: Path, topic: str) -> tuple[int, int]:
    """A topic whose dirty part Kafka alone never cleans; returns (its checkpoint now, the dirty segment's first
    batch max timestamp)."""
    cfg = {"cleanup.policy": "compact", "segment.ms": str(ROLL_MS), "min.cleanable.dirty.ratio": "0.5"}
    admin.create_topics([NewTopic(topic, 1, 1, config=cfg)])[topic].result(30)

    def roll(records: list[tuple[bytes, bytes]]) -> None:
        for key, value in records:
            producer.produce(topic, key=key, value=value)
        producer.flush(30)
        time.sleep(ROLL_MS / 1000 + 0.3)

    def checkpoint() -> int:
        return read_checkpoint(log_dir / "cleaner-offset-checkpoint").get((topic, 0), -1)

    roll([(b"key-%03d" % k, b"v0") for k in range(400)])
    roll([(b"head-roller", b"x")])
    wait("Kafka's own first clean", lambda: checkpoint() >= 400, 60)
    roll([(b"key-%03d" % k, b"v1") for k in range(20)])
    roll([(b"tail-roller", b"x")])
    ckpt = checkpoint()
    dirty = [s for s in scan_log_dir(log_dir) if s.topic == topic and s.base_offset >= ckpt and not s.active]
    return ckpt, min(s.first_batch_max_ts or 0 for s in dirty)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lag-ms", type=int, default=8_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compactd-bench-cleaner-"))
    started = time.monotonic()
    broker = kafka_broker(work / "broker")
    start_s = time.monotonic() - started
    time.sleep(2)
    rss_mb = broker.rss_bytes() / 2**20
    redis = redis_server(work / "redis")
    rows: list[dict] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
        topics = [f"gdpr-{i}" for i in range(args.rounds)]
        settings = Settings(
            bootstrap_servers=broker.bootstrap,
            redis_url=f"redis://127.0.0.1:{redis.port}/0",
            checkpoint_dir=str(work / "checkpoint"),
            trigger_interval_ms=500,
            offsets_source="commits",
            topics=TopicNames(),
            thresholds={
                "global": {"dry.run": False},
                **{f"topic:{t}": {"max.compaction.lag.ms": args.lag_ms} for t in topics},
            },
        )
        admin.create_topics([NewTopic(settings.topics.segments, 1, 1)])[settings.topics.segments].result(30)
        stop = threading.Event()
        publisher = KafkaPublisher(settings.kafka_connection(), settings.topics.segments)
        agent = threading.Thread(
            target=run_agent, args=(SegmentAgent([broker.log_dir]), publisher, 0.5, stop), daemon=True
        )
        with Application(settings) as job:
            runner = threading.Thread(target=job.run, kwargs={"stop": stop})
            agent.start()
            runner.start()
            try:
                for topic in topics:
                    ckpt, first_ts = prepare(admin, producer, broker.log_dir, topic)
                    due = first_ts + args.lag_ms
                    nudged = wait("the nudge", lambda t=topic: nudge_value(admin, t) == "1", 120)
                    cleaned = wait(
                        "Kafka's clean",
                        lambda t=topic, c=ckpt: (
                            read_checkpoint(broker.log_dir / "cleaner-offset-checkpoint").get((t, 0), -1) > c
                        ),
                        60,
                        0.02,
                    )
                    restored = wait("the nudge put back", lambda t=topic: nudge_value(admin, t) is None, 60)
                    rows.append(
                        {
                            "due_to_nudge": nudged - due,
                            "due_to_clean": cleaned - due,
                            "nudge_to_back": restored - nudged,
                        }
                    )
                    print(f"bench: {topic}: {rows[-1]}", file=sys.stderr)
            finally:
                stop.set()
                runner.join(120)
        publisher.close()
    finally:
        broker.stop()
        redis.stop()
    print(
        json.dumps(
            {
                "bench": "cleaner_loop",
                "kafka": kafka_version(),
                "broker_start_to_ready_s": round(start_s, 2),
                "broker_rss_mb": round(rss_mb),
                "lag_ms": args.lag_ms,
                "trigger_ms": 500,
                "agent_scan_s": 0.5,
                "log_cleaner_backoff_ms": 1000,
                "due_to_nudge_ms": summary([r["due_to_nudge"] for r in rows]),
                "due_to_cleaned_ms": summary([r["due_to_clean"] for r in rows]),
                "nudge_to_put_back_ms": summary([r["nudge_to_back"] for r in rows]),
                "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
            }
        )
    )


if __name__ == "__main__":
    main()
