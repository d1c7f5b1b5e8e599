"""The compaction service (`compactd.compaction`): full and incremental runs, and a large key space in 1 GiB.

Starts its own Redis and Apache Kafka broker. Part 1: fills a topic with RECORDS records over KEYS keys in PARTITIONS
partitions (values of VALUE_BYTES, timestamps = now: the broker's 7-day retention keeps them); first the yardstick,
Kafka's own LogCleaner on the same broker and the same records (`kafka_cleaner`, one and two cleaner threads: from
the topic turning cleanable to every partition's cleaner checkpoint at its active segment, with the broker's CPU and
the cleaner's own log); then, in Spark, times a full run
(generation 1), a bare reader over the same records in this process (`range_read.read_messages`, the reader the
shuffle path's Python tasks use, partitions in turn on one core; a run whose partitions fit a task reads
in the JVM instead), then appends APPEND_SHARE more records over the same keys and
times the incremental run (generation 2: the delta's winners appended to generation 1), then as many records again
and an incremental run that rewrites the view (generation 3: previous generation + delta, `compaction.view.dirty.ratio`
0). Part 2: fills another topic with BIG_KEYS
distinct keys and runs one compaction in a child process whose Spark driver (in local mode, also the executor) has
DRIVER_MEMORY of heap (SPARK_DRIVER_MEMORY, read by spark-submit: `spark_session` takes no extra options), sampling
the peak RSS of the driver's Python, the JVM and Spark's Python workers from /proc.

Sizes come from the environment: COMPACTD_BENCH_RECORDS, _KEYS, _PARTITIONS, _VALUE_BYTES, _APPEND_SHARE,
_BIG_KEYS, _BIG_PARTITIONS, _DRIVER_MEMORY. Prints one JSON object (figures and the issue's targets beside them);
progress goes to stderr. Usage: python bench/compaction.py
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compactd.compaction.service import Compactor
from compactd.kafka.config import KafkaConnection
from compactd.kafka.range_read import KafkaRange, read_messages, reader_conf
from compactd.local.broker import KAFKA_SCRIPT_HEAP, KAFKA_SCRIPT_JVM_OPTIONS, kafka_broker
from compactd.local.servers import redis_server
from compactd.settings import Settings

log = logging.getLogger("compactd.bench")
LAYERS = {"global": {"compaction.view.grace.ms": 0}}  # old generations go at once: the broker holds one copy
MB = 1 << 20


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(f"COMPACTD_BENCH_{name}", default))


def settings_for(bootstrap: str, redis_url: str) -> Settings:
    return Settings(bootstrap_servers=bootstrap, redis_url=redis_url, checkpoint_dir=tempfile.gettempdir())


def compactor(bootstrap: str, redis_url: str, spark: Any) -> Compactor:
    return Compactor(settings_for(bootstrap, redis_url), redis.Redis.from_url(redis_url), lambda: LAYERS, lambda: spark)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient(KafkaConnection(bootstrap).client("admin"))
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce(bootstrap: str, topic: str, keys: list[int], partitions: int, value_bytes: int, seq: int = 0) -> float:
    """Send one record per entry of `keys` (key index → key, partition = index mod partitions); seconds taken.
    Batched (linger, 1 MB batches), delivery reports for errors only: the loop costs what produce() costs."""
    errors: list[str] = []
    conf = KafkaConnection(bootstrap).client(
        "producer",
        {
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "delivery.report.only.error": True,
        },
        {"on_delivery": lambda err, _msg: errors.append(str(err))},
    )
    p = Producer(conf)
    pad = b"x" * max(0, value_bytes - 20)
    t0 = time.monotonic()
    for i, k in enumerate(keys):
        value = b"%s-%019d" % (pad, seq + i)
        while True:
            try:
                p.produce(topic, key=b"key-%09d" % k, value=value, partition=k % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    left = p.flush(300)
    if left or errors:
        raise RuntimeError(f"{topic}: {left} records undelivered, {len(errors)} refused {errors[:1]}")
    return time.monotonic() - t0


def bare_read(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[str, Any]:
    """The run's own reader with its own settings, over [0, end) of every partition, one after another, touching
    key and value: what one core reads without Spark, sorting, reducing or writing."""
    conf = reader_conf(KafkaConnection(bootstrap))
    seen, t0 = 0, time.monotonic()
    for p, end in sorted(ends.items()):
        for msgs in read_messages(conf, KafkaRange(topic, p, 0, end), 120_000):
            for m in msgs:
                m.key(), m.value()
            seen += len(msgs)
    seconds = time.monotonic() - t0
    return {
        "reader": "compactd.kafka.range_read.read_messages (reader_conf), partitions in turn, one core",
        "records": seen,
        "seconds": round(seconds, 2),
        "records_per_second": round(seen / seconds),
    }


# Kafka's own cleaner on the same records (the yardstick). The topic is filled under the delete policy (so the
# cleaner does not start while it fills), in 1 MiB segments (the topic minimum: most of the log leaves the active
# segment, which the cleaner never touches); then the policy turns to compact with a dirty ratio that makes it
# cleanable at once, and the clock runs until every partition's cleaner checkpoint reaches its active segment.
CLEANER_BACKOFF_MS = 100  # the broker's cleaner threads look for work this often (Kafka's default: 15 s)
_CLEANED = re.compile(r"cleaned log (\S+)-(\d+) \(dirty section = \[(\d+), (\d+)\]\)")
_PROCESSED = re.compile(r"([\d.]+) MB of log processed in ([\d.]+) seconds")


def active_bases(log_dir: Path, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's active segment base offset: the name of its newest `.log` file."""
    return {p: max(int(f.stem) for f in (log_dir / f"{topic}-{p}").glob("*.log")) for p in range(partitions)}


def cleaner_checkpoints(log_dir: Path, topic: str) -> dict[int, int]:
    """`<log.dir>/cleaner-offset-checkpoint` (version, count, then `topic partition offset` lines: each partition's
    first dirty offset), this topic's partitions."""
    path = log_dir / "cleaner-offset-checkpoint"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines()[2:]:
        parts = line.split()
        if len(parts) == 3 and parts[0] == topic:
            out[int(parts[1])] = int(parts[2])
    return out


def broker_cpu(pid: int) -> tuple[float, float]:
    """CPU-seconds of the broker process so far: all of it, its cleaner threads' (`kafka-log-cleaner-thread-N`)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = cleaner = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        used = (int(fields[11]) + int(fields[12])) / tick
        total += used
        if stat[stat.index("(") + 1 : stat.rindex(")")].startswith("kafka-log-clean"):
            cleaner += used
    return total, cleaner


def kafka_cleaner(
    broker: Any, bootstrap: str, keys: list[int], partitions: int, value_bytes: int, threads: int
) -> dict[str, Any]:
    """Kafka's LogCleaner with `threads` cleaner threads over the records `keys` describe (as `produce` sends them):
    seconds from the topic becoming cleanable to every partition's checkpoint at its active segment, the records
    that covers, the broker's CPU, and the cleaner's own account from its log (MB and seconds per cleaned log)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient(KafkaConnection(bootstrap).client("admin"))

    def alter(kind: ResourceType, name: str, configs: dict[str, str]) -> None:
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
        for fut in admin.incremental_alter_configs([ConfigResource(kind, name, incremental_configs=entries)]).values():
            fut.result(30)

    alter(ResourceType.BROKER, "1", {"log.cleaner.threads": str(threads)})  # dynamic: the cleaner restarts
    topic = f"bench.cleaner-{threads}"
    config = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", "segment.bytes": str(MB)}
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)
    produce(bootstrap, topic, keys, partitions, value_bytes)
    bases = active_bases(broker.log_dir, topic, partitions)
    log_mark = broker.log.stat().st_size
    pid = broker.proc.pid
    cpu0, t0 = broker_cpu(pid), time.monotonic()
    alter(ResourceType.TOPIC, topic, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                                      "min.compaction.lag.ms": "0"})  # fmt: skip
    while True:
        done = cleaner_checkpoints(broker.log_dir, topic)
        if all(done.get(p, -1) >= bases[p] for p in range(partitions)):
            break
        if time.monotonic() - t0 > 900:
            raise RuntimeError(f"{topic}: the cleaner did not reach the active segments in 900 s: {done} vs {bases}")
        time.sleep(0.02)
    seconds = time.monotonic() - t0
    cpu1 = broker_cpu(pid)
    with broker.log.open() as f:
        f.seek(log_mark)
        text = f.read()
    cleaned = [m for m in _CLEANED.finditer(text) if m.group(1) == topic]
    processed = [(float(a), float(b)) for a, b in _PROCESSED.findall(text)]
    records = sum(bases.values())
    return {
        "cleaner_threads": threads,
        "records_cleaned": records,  # every offset below the active segments
        "seconds": round(seconds, 2),
        "records_per_second": round(records / seconds),
        "broker_cpu_seconds": round(cpu1[0] - cpu0[0], 2),
        "cleaner_threads_cpu_seconds": round(cpu1[1] - cpu0[1], 2),
        "cleaner_log": {
            "logs_cleaned": len(cleaned),
            "mb_processed": round(sum(mb for mb, _ in processed), 1),
            "seconds_summed_over_logs": round(sum(sec for _, sec in processed), 2),
        },
    }


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(KafkaConnection(bootstrap).client("consumer", {"group.id": "bench-watermarks"}))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        c.close()


def timed_run(comp: Compactor, topic: str, broker_pid: int | None = None) -> dict[str, Any]:
    """One run's summary figures, with the time split at the service's phase boundaries (where it goes), and the
    broker's CPU meanwhile when its pid is given (it shares the machine's cores with Spark)."""
    marks: dict[str, float] = {}
    cpu0 = broker_cpu(broker_pid)[0] if broker_pid else 0.0
    t0 = time.monotonic()
    out = comp.run(topic, on_phase=lambda phase: marks.setdefault(phase, time.monotonic() - t0))
    total = time.monotonic() - t0
    broker = {"broker_cpu_seconds": round(broker_cpu(broker_pid)[0] - cpu0, 2)} if broker_pid else {}
    keep = ("generation", "records_in", "records_out", "keys", "bytes_in", "bytes_out", "seconds", "appended")
    phases = {
        "plan": marks["planned"],  # manifest read, view claim, offsets
        "spark": marks["written"] - marks["planned"],  # phases 1 and 2: read, reduce, write the view
        "publish": marks["published"] - marks["written"],  # view offsets, fence, manifest
        "collect_and_status": total - marks["published"],  # old generations deleted, status in Redis
    }
    return (
        {k: out[k] for k in keep}
        | {"records_per_second": round(out["records_in"] / out["seconds"])}
        | {"phase_seconds": {k: round(v, 2) for k, v in phases.items()}}
        | broker
    )


# -- memory, from /proc (psutil is not a dependency)
def proc_table() -> dict[int, tuple[str, int, int]]:
    """pid → (comm, ppid, session id) of every live process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                head, rest = f.read().rsplit(b")", 1)
        except OSError:
            continue
        fields = rest.split()
        if fields[0] != b"Z":
            table[int(entry.name)] = (head.split(b"(", 1)[1].decode(), int(fields[1]), int(fields[3]))
    return table


def status_kb(pid: int | str, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Peaks:
    """Samples Spark's JVM (the java process below this one) and its Python workers (the processes of the JVM's
    session) every `interval_s`: the kernel keeps each process's peak (VmHWM), workers are also summed."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.jvm_pid: int | None = None
        self.jvm_kb = self.worker_kb = self.workers_sum_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-peaks", daemon=True)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.sample()
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        table = proc_table()
        me = os.getpid()
        below, grown = {me}, True
        while grown:  # descendants: spark-submit's script may sit between us and java
            more = {pid for pid, (_, ppid, _) in table.items() if ppid in below} - below
            below |= more
            grown = bool(more)
        java = [pid for pid in below if table[pid][0] == "java"]
        if not java:
            return
        self.jvm_pid = java[0]
        self.jvm_kb = max(self.jvm_kb, status_kb(self.jvm_pid, "VmHWM"))
        sid = table[self.jvm_pid][2]
        workers = [pid for pid, (comm, _, s) in table.items() if s == sid and comm.startswith("python")]
        self.workers_sum_kb = max(self.workers_sum_kb, sum(status_kb(pid, "VmRSS") for pid in workers))
        self.worker_kb = max([self.worker_kb, *(status_kb(pid, "VmHWM") for pid in workers)])

    def jvm_heap_flag(self) -> str | None:
        if self.jvm_pid is None:
            return None
        with open(f"/proc/{self.jvm_pid}/cmdline", "rb") as f:
            flags = [a.decode() for a in f.read().split(b"\0") if a.startswith(b"-Xmx")]
        return flags[-1] if flags else None


def big_run(bootstrap: str, redis_url: str, topic: str) -> None:
    """Child process of part 2: one run of `topic` in a Spark started here (driver memory from the environment);
    prints one JSON object, also when the run fails."""
    from compactd.streaming.session import spark_session, stop_spark

    out: dict[str, Any] = {"driver_memory": os.environ.get("SPARK_DRIVER_MEMORY")}
    with Peaks() as peaks:
        t0 = time.monotonic()
        spark = spark_session("local[2]")
        out["spark_start_seconds"] = round(time.monotonic() - t0, 2)
        comp = compactor(bootstrap, redis_url, spark)
        try:
            out |= {"completed": True, "run": timed_run(comp, topic)}
        except Exception as exc:
            out |= {"completed": False, "error": f"{type(exc).__name__}: {str(exc).strip()[:500]}"}
        peaks.sample()
        out["jvm_heap_flag"] = peaks.jvm_heap_flag()
        stop_spark(spark)
    out["peak_rss_mb"] = {
        "driver_python": round(status_kb("self", "VmHWM") / 1024),
        "jvm": round(peaks.jvm_kb / 1024),
        "python_worker_max": round(peaks.worker_kb / 1024),
        "python_workers_sum": round(peaks.workers_sum_kb / 1024),
    }
    print(json.dumps(out), flush=True)


def cli_run(bootstrap: str, redis_url: str, topic: str) -> dict[str, Any]:
    """`compactd compact TOPIC` in a process of its own, as an operator or a scheduler runs it: a JVM started for it,
    cold. Its summary line's figures, and the process's wall time from exec to exit (the JVM's start and stop
    included)."""
    exe = Path(sys.executable).parent / "compactd"
    argv = [str(exe), "compact", topic, "--bootstrap-servers", bootstrap, "--redis-url", redis_url,
            "--checkpoint-dir", tempfile.mkdtemp(prefix="compactd-bench-cli-")]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"compactd compact exited {done.returncode}: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "records_in": out["records_in"],
        "seconds": out["seconds"],
        "records_per_second": round(out["records_in"] / out["seconds"]),
        "process_seconds": round(wall, 2),
        "records_per_second_process": round(out["records_in"] / wall),
    }


def part_one(broker: Any, bootstrap: str, redis_url: str) -> dict[str, Any]:
    from compactd.streaming.session import spark_session, stop_spark

    records, keys, partitions = env_int("RECORDS", 2_000_000), env_int("KEYS", 200_000), env_int("PARTITIONS", 16)
    value_bytes = env_int("VALUE_BYTES", 100)
    append = round(records * float(os.environ.get("COMPACTD_BENCH_APPEND_SHARE", "0.1")))
    topic = "bench.orders"
    create_topic(bootstrap, topic, partitions)
    rnd = random.Random(7)
    first = [i if i < keys else rnd.randrange(keys) for i in range(records)]  # every key at least once
    log.warning("part 1: producing %d records over %d keys, %d partitions", records, keys, partitions)
    produce_s = produce(bootstrap, topic, first, partitions, value_bytes)
    ends = high_watermarks(bootstrap, topic, partitions)
    cleaner = {}
    for threads in (1, 2):  # before Spark starts: each system has the machine to itself
        log.warning("part 1: Kafka's cleaner, %d thread(s), on the same records", threads)
        cleaner[f"threads_{threads}"] = kafka_cleaner(broker, bootstrap, first, partitions, value_bytes, threads)
        log.warning("part 1: %s", cleaner[f"threads_{threads}"])
    # the same records again on a topic of their own, compacted by the CLI in a process of its own (cold)
    cli_topic = "bench.orders.cli"
    create_topic(bootstrap, cli_topic, partitions)
    produce(bootstrap, cli_topic, first, partitions, value_bytes)
    del first
    log.warning("part 1: `compactd compact` in a process of its own, on the same records")
    cli = cli_run(bootstrap, redis_url, cli_topic)
    log.warning("part 1: cli %s", cli)

    t0 = time.monotonic()
    spark = spark_session("local[2]")
    spark_start_s = time.monotonic() - t0
    try:
        comp = compactor(bootstrap, redis_url, spark)
        # The continuous job compacts in a warm session: its Python workers started, their imports done, the JVM's
        # code compiled. One small run first (another topic) takes that cost out of the measured runs; it is
        # reported beside them.
        warm_topic = "bench.warmup"
        create_topic(bootstrap, warm_topic, partitions)
        produce(bootstrap, warm_topic, [rnd.randrange(1000) for _ in range(20_000)], partitions, value_bytes)
        warmup = timed_run(comp, warm_topic)
        log.warning("part 1: warm-up run %s; full run", warmup)
        full = timed_run(comp, topic, broker.proc.pid)
        log.warning("part 1: full run %s; bare read", full)
        bare = bare_read(bootstrap, topic, ends)
        log.warning("part 1: bare read %s; appending %d records", bare, append)
        more = [rnd.randrange(keys) for _ in range(append)]  # keys drawn from the same key space
        append_s = produce(bootstrap, topic, more, partitions, value_bytes, records)
        incremental = timed_run(comp, topic, broker.proc.pid)
        log.warning("part 1: incremental run %s; appending %d more, rewriting", incremental, append)
        # the same delta again, the view rewritten with it (what every incremental run did before delta runs)
        more = [rnd.randrange(keys) for _ in range(append)]
        produce(bootstrap, topic, more, partitions, value_bytes, records + append)
        LAYERS["global"]["compaction.view.dirty.ratio"] = 0
        try:
            rewrite = timed_run(comp, topic, broker.proc.pid)
        finally:
            LAYERS["global"].pop("compaction.view.dirty.ratio")
        log.warning("part 1: incremental run rewriting the view %s", rewrite)
    finally:
        stop_spark(spark)
    return {
        "records": records,
        "keys": keys,
        "partitions": partitions,
        "value_bytes": value_bytes,
        "produce_seconds": round(produce_s, 2),
        "spark_start_seconds": round(spark_start_s, 2),
        "warmup_run_20k_records": warmup,
        "full_run": full,
        "kafka_cleaner": cleaner,
        "full_to_cleaner_rate": {
            k: round(full["records_per_second"] / c["records_per_second"], 3) for k, c in cleaner.items()
        },
        "cli_run": cli,
        # the CLI's own figure (its summary's seconds) and the whole process's, each over the cleaner's
        "cli_to_cleaner_rate": {
            k: {
                "run": round(cli["records_per_second"] / c["records_per_second"], 3),
                "process": round(cli["records_per_second_process"] / c["records_per_second"], 3),
            }
            for k, c in cleaner.items()
        },
        "bare_reader": bare,
        "appended": append,
        "append_produce_seconds": round(append_s, 2),
        "incremental_run": incremental,
        "full_to_bare_read_rate": round(full["records_per_second"] / bare["records_per_second"], 3),
        "incremental_to_full_seconds": round(incremental["seconds"] / full["seconds"], 3),
        "incremental_rewrite_run": rewrite,
        "incremental_rewrite_to_full_seconds": round(rewrite["seconds"] / full["seconds"], 3),
    }


def part_two(bootstrap: str, redis_url: str, memory: str) -> dict[str, Any]:
    big_keys, partitions = env_int("BIG_KEYS", 5_000_000), env_int("BIG_PARTITIONS", 1)
    topic = "bench.big"
    create_topic(bootstrap, topic, partitions)
    log.warning("part 2: producing %d distinct keys, %d partition(s)", big_keys, partitions)
    produce_s = produce(bootstrap, topic, list(range(big_keys)), partitions, env_int("VALUE_BYTES", 100))
    log.warning("part 2: one run in a child process, driver memory %s", memory)
    env = {**os.environ, "SPARK_DRIVER_MEMORY": memory}
    argv = [sys.executable, __file__, "--big-run", bootstrap, redis_url, topic]
    t0 = time.monotonic()
    child = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, check=False)
    lines = child.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {"completed": False, "error": "the child printed nothing"}
    if child.returncode != 0:
        out |= {"completed": False, "returncode": child.returncode}
    log.warning("part 2: %s", out)
    return {
        "keys": big_keys,
        "partitions": partitions,
        "produce_seconds": round(produce_s, 2),
        "child_wall_seconds": round(time.monotonic() - t0, 2),
        **out,
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-run", nargs=3, metavar=("BOOTSTRAP", "REDIS_URL", "TOPIC"), help="internal: part 2's child")
    args = ap.parse_args()
    if args.big_run:
        big_run(*args.big_run)
        return
    memory = os.environ.get("COMPACTD_BENCH_DRIVER_MEMORY", "1g")
    os.environ["SPARK_DRIVER_MEMORY"] = memory  # Spark's default too; part 1 runs with the same heap, said aloud
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="compactd-compaction-bench-"))
    # the cleaner looks for work every CLEANER_BACKOFF_MS, so its measured time starts when the topic turns cleanable
    redis_svc = redis_server(work / "redis")
    # the broker's JVM as Kafka's own start script runs it (G1, the tiered JIT, 1 GiB): the cleaner is the yardstick,
    # and the test brokers' options (the serial collector, C1 only) halved its rate
    broker = kafka_broker(
        work / "broker",
        extra={"log.cleaner.backoff.ms": str(CLEANER_BACKOFF_MS), "log.cleaner.dedupe.buffer.size": str(128 * MB)},
        jvm_options=KAFKA_SCRIPT_JVM_OPTIONS,
        heap=KAFKA_SCRIPT_HEAP,
    )
    try:
        bootstrap, redis_url = f"127.0.0.1:{broker.port}", f"redis://127.0.0.1:{redis_svc.port}/0"
        one = part_one(broker, bootstrap, redis_url)
        two = part_two(bootstrap, redis_url, memory)
    finally:
        broker.stop()
        redis_svc.stop()
        shutil.rmtree(work, ignore_errors=True)  # the broker's logs: several GB at full scale
    print(
        json.dumps(
            {
                "benchmark": "compaction",
                "driver_memory": memory,
                "full_and_incremental": one,
                "big_key_space": two,
                "figures": {
                    "full_to_cleaner_rate": one["full_to_cleaner_rate"],
                    "full_to_bare_read_rate": one["full_to_bare_read_rate"],
                    "incremental_to_full_seconds": one["incremental_to_full_seconds"],
                    "incremental_rewrite_to_full_seconds": one["incremental_rewrite_to_full_seconds"],
                    "big_completed": two.get("completed", False),
                },
                "targets": {
                    "full_to_cleaner_rate": {"threads_1": ">= 1.0", "threads_2": ">= 1.0 (the moonshot)"},
                    "full_to_bare_read_rate": ">= 0.5",
                    "incremental_to_full_seconds": "<= 0.2",
                    "big_completed": f"true, {two['keys']} keys in driver memory {memory}",
                },
                "wall_seconds": round(time.monotonic() - t_start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
