"""Throughput of `run --once` on pre-filled topics: events/s from Kafka through Spark, Redis merge and decisions.

Starts its own Redis and Apache Kafka broker, fills the source topics — JSON segment and commit events, or (`--format
binary`) offset commits in `__consumer_offsets`' own binary format on a mirror topic — then times the job, round after
round in one Spark session: each round fills `--events` more records and runs `run --once` over them. The first
rounds pay the JVM's warm-up (its JIT compiles Spark's and Kafka's code for minutes, on the same two cores); the
steady state is the median of the last three rounds, which is what a continuously running job's JVM does. Each
round reports the JVM's CPU, and its JIT compiler's and garbage collector's share. Beside it, in the same run and
against the same broker, over the last round's records: a bare Python consumer reading them with `consume()` and
`json.loads` (or `struct` for binary), and the stages timed apart (Spark's reader: read only, + decode, + reduce and
collect; the job: Spark's batch time, merge, decide+act).
Prints one JSON object. Usage: python bench/throughput.py [--events N] [--format json|binary] [--rounds R]
[--segment-share S] [--nothing-due] [--slices N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import Histogram
from pyspark.sql import SparkSession

from compactd.codec.offsets import OffsetValue, encode_offset_key, encode_offset_value
from compactd.daemon.application import Application
from compactd.kafka.admin import admin_client, list_end_offsets
from compactd.kafka.config import KafkaConnection
from compactd.kafka.range_read import reader_conf
from compactd.keys import partition_key
from compactd.local.broker import kafka_broker
from compactd.local.servers import redis_server
from compactd.model import SourceOffsets
from compactd.settings import Settings
from compactd.streaming import columns
from compactd.streaming.connector import READ_DEFAULTS, SOURCE_READ_DEFAULTS
from compactd.streaming.decode import Decoder
from compactd.streaming.session import spark_session, stop_spark

MIRROR = "mirror.consumer_offsets"
TOPIC_IDS = {f"data-{i}": str(uuid.UUID(int=i + 1)) for i in range(1000)}


def fill(
    bootstrap: str,
    events: int,
    data_topics: int,
    partitions: int,
    source_partitions: int,
    segment_share: float = 0.3,
    binary: bool = False,
) -> None:
    conn = KafkaConnection(bootstrap)
    admin = AdminClient(conn.client("admin"))
    existing = admin.list_topics(timeout=10).topics
    wanted = [t for t in ("compactd.segments", "compactd.commits", MIRROR) if t not in existing]
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
        elif binary:  # what Kafka 4.x writes for a commit (key v1, value v4 with the topic ID), keyed by group
            g = rnd.choice(groups)
            value = encode_offset_value(OffsetValue(4, i, "", now, leader_epoch=5, topic_id=TOPIC_IDS[topic]))
            key = encode_offset_key(g, topic, part)
            p.produce(MIRROR, key=key, value=value, partition=groups.index(g) % source_partitions)
        else:
            g = rnd.choice(groups)
            ev = {"type": "offset_commit", "group": g, "topic": topic, "partition": part, "offset": i, "ts": now}
            p.produce(
                "compactd.commits",
                key=g.encode(),
                value=json.dumps(ev).encode(),
                partition=groups.index(g) % source_partitions,
            )
        if i % 50_000 == 0:
            p.flush()
    p.flush()


_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hqi")


def heap_after_gc(spark: SparkSession) -> int:
    """MiB of the driver JVM's heap in use right after a full collection."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    jvm.System.gc()
    return round(jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed() / 2**20)


def bare_consumer(bootstrap: str, topics: list[str], binary: bool, low: SourceOffsets) -> dict:
    """What one plain Python consumer does with the same records (from `low` to the end): consume() and parse,
    nothing else."""
    from confluent_kafka import Consumer, TopicPartition

    conn = KafkaConnection(bootstrap)
    ends = list_end_offsets(admin_client(conn), topics, "high")
    start = {t: {p: low.get(t, {}).get(p, 0) for p in parts} for t, parts in ends.items()}
    total = sum(ends[t][p] - start[t][p] for t in ends for p in ends[t])
    # tuned as the compaction service's reader is (short broker waits at a partition's end, deep prefetch)
    c = Consumer(reader_conf(conn, {"group.id": "bench-bare"}))
    c.assign([TopicPartition(t, int(p), start[t][p]) for t in ends for p in ends[t]])
    seen, parsed = 0, 0
    t0 = time.monotonic()
    while seen < total:
        for m in c.consume(10_000, timeout=1.0):
            if m.error() is not None:
                continue
            seen += 1
            if binary:
                key, value = m.key(), m.value()
                _, glen = _KEY.unpack_from(key)
                (tlen,) = struct.unpack_from(">h", key, 4 + glen)
                key[4 : 4 + glen].decode(), key[6 + glen : 6 + glen + tlen].decode()
                struct.unpack_from(">i", key, 6 + glen + tlen)
                _, _offset, _ = _VALUE.unpack_from(value)
                mlen = value[14] - 1  # v4: a one-byte compact length
                struct.unpack_from(">q", value, 15 + mlen)
                if value[23 + mlen]:  # the topic ID's tag
                    value[26 + mlen : 42 + mlen].hex()
            else:
                json.loads(m.value())
            parsed += 1
    seconds = time.monotonic() - t0
    c.close()
    return {"records": parsed, "seconds": round(seconds, 2), "records_per_second": round(parsed / seconds)}


def spark_stages(spark: SparkSession, bootstrap: str, topics: list[str], decoder: Decoder, low: SourceOffsets) -> dict:
    """Where a batch's Spark time goes, over the same records (from `low` on) read again as one batch (Spark's Kafka
    reader, the job's options), each stage run twice and the second timed: the read alone (a `noop` write), the read
    + decode (compactd's Java decoders, a row per record), and the read + decode + reduce + collect to the driver, the
    refused records decided there (what a micro-batch does before merging)."""
    starting = {t: {str(p): o for p, o in parts.items()} for t, parts in low.items()}
    reader = (
        spark.read.format("kafka")
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", json.dumps(starting) if starting else "earliest")
        .option("endingOffsets", "latest")
    )
    read = {**READ_DEFAULTS, **SOURCE_READ_DEFAULTS}
    for key, value in {"bootstrap.servers": bootstrap, "isolation.level": "read_committed", **read}.items():
        reader = reader.option(f"kafka.{key}", value)
    rows = reader.load()  # as the job reads them: the connector's rows, all their columns
    records = rows.count()
    fast = columns.FastPath(decoder)

    def timed(run: Callable[[], object]) -> float:
        run()
        t0 = time.monotonic()
        run()
        return time.monotonic() - t0

    read_s = timed(lambda: rows.write.format("noop").mode("overwrite").save())
    decode_s = timed(lambda: fast.decoded(rows).write.format("noop").mode("overwrite").save())
    reduce_s = timed(lambda: decoder.complete(fast.reduced(rows).toArrow()))
    return {
        "records": records,
        "read_seconds": round(read_s, 2),
        "read_decode_seconds": round(decode_s, 2),
        "read_decode_reduce_collect_seconds": round(reduce_s, 2),
        "read_per_second": round(records / read_s),
        "read_decode_reduce_collect_per_second": round(records / reduce_s),
    }


def jvm_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds of Spark's JVM so far: all of it, its JIT compiler threads, its garbage collector's (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"total": 0.0, "jit": 0.0, "gc": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        used = (int(fields[11]) + int(fields[12])) / tick
        out["total"] += used
        if "CompilerThre" in name:
            out["jit"] += used
        elif name.startswith(("GC Thread", "G1 ", "VM Thread")):
            out["gc"] += used
    return out


class ShareTasks(logging.Handler):
    """The driver's "per-topic work in N tasks" lines, as rows: worker, partitions merged, seconds."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.rows: list[dict] = []
        self.warm_from = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "per-topic work in" in message:
            for worker, merged, seconds in re.findall(r"(\S+) merged (\d+) in ([\d.]+)s", message):
                self.rows.append({"worker": worker, "merged": int(merged), "seconds": float(seconds)})


def histogram_sum(metric: Histogram) -> float:
    return next(s.value for m in metric.collect() for s in m.samples if s.name.endswith("_sum"))


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("compactd").setLevel(logging.INFO)  # per-batch phase timings on stderr
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=600_000)
    ap.add_argument("--format", choices=("json", "binary"), default="json")
    ap.add_argument("--topics", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=50)
    ap.add_argument("--source-partitions", type=int, default=16)
    ap.add_argument("--max-rows-per-trigger", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=8, help="fill + run --once again in the same Spark session (>= 3)")
    ap.add_argument(
        "--warmup-events",
        type=int,
        default=1,
        help="a run --once over this many events before the timed rounds: the first round is then the cold batch "
        "of a job already started (0: the first round pays the query's start too)",
    )
    ap.add_argument("--segment-share", type=float, default=0.0, help="share of segment events; the rest are commits")
    ap.add_argument("--slices", type=int, default=0, help="evaluation_slices: merge and plan in N Spark tasks")
    ap.add_argument(
        "--nothing-due", action="store_true", help="thresholds far away: no partition has a decision (the data path)"
    )
    args = ap.parse_args()
    binary = args.format == "binary"
    work = Path(tempfile.mkdtemp(prefix="compactd-bench-"))
    redis_svc, broker = redis_server(work / "redis"), kafka_broker(work / "broker")
    spark = None
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
            offsets_source="consumer_offsets" if binary else "commits",
            topics={"consumer_offsets": MIRROR},
            thresholds={"global": {"max.compaction.lag.ms": 30 * 86_400_000, "consumed.retention.ms": 30 * 86_400_000}}
            if args.nothing_due
            else {
                # every segment event's partition overdue for compaction, most past consumed retention: a decision each
                "global": {"max.compaction.lag.ms": 3_600_000, "consumed.retention.ms": 600_000},
                f"topic:{'data-0'}": {"forced.retention.ms": 1_800_000},
            },
            kafka={"receive.message.max.bytes": "1000000000"},
            evaluation_slices=args.slices,
        )
        tasks = ShareTasks()
        logging.getLogger("compactd").addHandler(tasks)
        source_topics = ["compactd.segments", MIRROR if binary else "compactd.commits"]
        jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[attr-defined]
        rounds = []
        low: dict[str, dict[str, int]] = {}
        if args.warmup_events > 0:
            shape = (args.topics, args.partitions, args.source_partitions, args.segment_share, binary)
            fill(bootstrap, args.warmup_events, *shape)
            with Application(settings, spark=spark) as app:
                app.run(once=True)
        for _ in range(args.rounds):
            tasks.warm_from = len(tasks.rows)
            shape = (args.topics, args.partitions, args.source_partitions, args.segment_share, binary)
            if rounds:
                low = list_end_offsets(admin_client(KafkaConnection(bootstrap)), source_topics, "high")
            t0 = time.monotonic()
            fill(bootstrap, args.events, *shape)
            fill_s = time.monotonic() - t0
            with Application(settings, spark=spark) as app:
                merge0 = histogram_sum(app.metrics.merge_seconds)
                handled0 = histogram_sum(app.metrics.batch_seconds)
                cpu0 = jvm_cpu(jvm)
                t0 = time.monotonic()
                app.run(once=True)
                run_s = time.monotonic() - t0
                cpu1 = jvm_cpu(jvm)
                progress = app.job.query.recentProgress if app.job and app.job.query else []
                merge_s = histogram_sum(app.metrics.merge_seconds) - merge0
                handled_s = histogram_sum(app.metrics.batch_seconds) - handled0
            add_batch_s = sum(p["durationMs"].get("addBatch", 0) for p in progress if p.get("numInputRows")) / 1000
            # what the round's batches cost a query that keeps running (the continuous job): Spark's triggers, each
            # its offsets, the batch (read, decode, merge, decide, act) and its commit; not the query's start and
            # stop, which `run --once` pays every round
            trigger_s = sum(p["durationMs"].get("triggerExecution", 0) for p in progress if p.get("numInputRows"))
            trigger_s /= 1000
            # Spark's own account of the batches (planning, offsets, the batch itself, checkpoint writes), summed
            durations: dict[str, int] = {}
            for p in progress:
                for key, ms in p.get("durationMs", {}).items():
                    durations[key] = durations.get(key, 0) + ms
            rounds.append(
                {
                    # the driver JVM's heap after a full collection, once the round's query stopped: what the JVM keeps
                    # between batches (`local[2]`: the executors' consumers and their fetched records are in it)
                    "heap_after_gc_mb": heap_after_gc(spark),
                    "fill_seconds": round(fill_s, 2),
                    "run_once_seconds": round(run_s, 2),
                    "events_per_second": round(args.events / run_s),
                    "running_query_events_per_second": round(args.events / trigger_s) if trigger_s else None,
                    "micro_batches": app.summary.batches,
                    # CPU-seconds Spark's JVM used during the run: all of it, its JIT compiler's, its collector's
                    "jvm_cpu_seconds": {k: round(cpu1[k] - cpu0[k], 2) for k in cpu1},
                    "spark_duration_ms": durations,
                    "stages_seconds": {
                        "spark_batches": round(add_batch_s - handled_s, 2),  # read, decode tasks, driver reduction
                        "merge": round(merge_s, 2),
                        "decide_and_act": round(handled_s - merge_s, 2),
                        "outside_batches": round(run_s - add_batch_s, 2),  # query start, planning, checkpoint, stop
                    },
                }
            )
        decoder = app.decoder
        bare = bare_consumer(bootstrap, source_topics, binary, low)
        stages = spark_stages(spark, bootstrap, source_topics, decoder, low)
        tracked = len(settings.redis_state().all_partitions())
        steady = statistics.median(r["events_per_second"] for r in rounds[-3:])
        cold = rounds[0]["events_per_second"]
        running = statistics.median(r["running_query_events_per_second"] or 0 for r in rounds[-3:])
        print(
            json.dumps(
                {
                    "benchmark": f"run_once_throughput_{args.format}",
                    "events": args.events,
                    "data_partitions": tracked,
                    "source_partitions": args.source_partitions,
                    "segment_share": args.segment_share,
                    "nothing_due": args.nothing_due,
                    "slices": args.slices,
                    # with --slices: each Spark task of the warm round's batches, its partitions and seconds
                    "slice_tasks": tasks.rows[tasks.warm_from :],
                    "spark_start_seconds": round(spark_start_s, 2),
                    # the steady state: the median of the last three rounds (the JIT's warm-up is in the first ones)
                    "events_per_second": round(steady),
                    "events_per_second_by_round": [r["events_per_second"] for r in rounds],
                    "bare_consumer": bare,
                    "ratio_to_bare_consumer": round(steady / bare["records_per_second"], 2),
                    # the same rounds' batches as a running query pays them (Spark's trigger time), steady state
                    "running_query_events_per_second": round(running),
                    "running_query_ratio_to_bare_consumer": round(running / bare["records_per_second"], 2),
                    # the first round: the JVM's first large batch, after a --warmup-events run (the query started)
                    "cold_events_per_second": cold,
                    "cold_ratio_to_bare_consumer": round(cold / bare["records_per_second"], 2),
                    "warmup_events": args.warmup_events,
                    "spark_stages": stages,
                    "rounds": rounds,
                }
            )
        )
    finally:
        if spark is not None:  # compactd's stop: the first JVM on a machine keeps its class-data archive
            stop_spark(spark)
        broker.stop()
        redis_svc.stop()


if __name__ == "__main__":
    main()
