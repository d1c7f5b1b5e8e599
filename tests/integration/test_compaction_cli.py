"""The compaction commands as an operator runs them, against the real broker, Redis and Spark: `compactd compact`,
`compact status` and `read --compacted [--table]` in subprocesses, and the `compactd-view` Spark data source. Every
record a reader prints is checked against the pure model (`reduce_partition`, `table`) over what was produced, never
against the code's own output."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import pytest
import redis

from compactd.compaction.reduce import Record, reduce_partition
from compactd.compaction.service import Compactor, Overrides
from compactd.compaction.store import CompactionState, ManifestLog
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import CompactedReader, ViewSource, table
from compactd.kafka.config import KafkaConnection
from tests.support.compaction import STATUS_KEYS, Event, history, produce

SUMMARY_KEYS = {
    "topic",
    "generation",
    "status",
    "records_in",
    "records_out",
    "keys",
    "tombstones",
    "bytes_in",
    "bytes_out",
    "seconds",
    "horizon",
    "lineage",  # beyond the contract's keys: the view's lineage and the gaps accepted in it
    "lineage_why",
    "gaps",
    "appended",  # the partitions whose delta was appended to the previous generation, not rewritten with it
    "dirty_ratio",  # the largest share of a partition's view range those appends make up
}
BIN_KEY, BIN_VALUE = b"\xff\xfek", b"\x80v\xff"  # not UTF-8: printed as key_b64 / value_b64


def cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compactd", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def cli_env(cluster, redis_url: str) -> dict[str, str]:
    """The CLI's settings from the environment only: this test's broker, Redis and manifest topic."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
    env.update(
        COMPACTD_BOOTSTRAP_SERVERS=cluster.bootstrap,
        COMPACTD_REDIS_URL=redis_url,
        COMPACTD_TOPICS__COMPACTIONS=cluster.name("compactions"),
        COMPACTD_LOG_LEVEL="WARNING",
    )
    return env


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("compactd: error: "), lines[0]
    return lines[0]


def expected_line(partition: int, rec: Record) -> dict[str, Any]:
    """The contract's line for a record, built here independently of `json_line`."""

    def text(raw: bytes | None, name: str) -> dict[str, Any]:
        if raw is None:
            return {name: None}
        try:
            return {name: raw.decode("utf-8")}
        except UnicodeDecodeError:
            return {f"{name}_b64": base64.b64encode(raw).decode()}

    def header(raw: bytes | None) -> Any:
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(raw).decode()}

    return {
        "partition": partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        **text(rec.key, "key"),
        **text(rec.value, "value"),
        "headers": [{k: header(v)} for k, v in rec.headers],
    }


def deletes(row: dict[str, Any]) -> bool:
    """A printed tombstone: `value` present and null (a non-UTF-8 value is `value_b64` instead)."""
    return "value" in row and row["value"] is None


def specials(ts: int) -> list[Event]:
    """A non-UTF-8 key and value (with a non-UTF-8 header), and a key written then deleted, on both partitions."""
    return [
        Event(0, BIN_KEY, BIN_VALUE, ts, (("bin", b"\xff\x00"),)),
        Event(1, b"gone", b"alive", ts),
        Event(1, b"gone", None, ts + 1),  # the winner: a tombstone the view keeps (delete.retention.ms)
        Event(0, b"gone0", b"x", ts),
        Event(0, b"gone0", None, ts + 1),
    ]


def in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """The command through `compactd.app.cli.main` in this process, with `env` as its environment: the same code
    path as the subprocess, on the test session's Spark (a second JVM would cost more than the whole test)."""
    from compactd.app.cli import main

    for name, value in env.items():
        if name.startswith("COMPACTD_"):
            monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


@pytest.mark.spark
def test_compact_status_and_read_speak_the_contract(cluster, redis_url, spark, monkeypatch, capsys) -> None:
    topic = cluster.name("orders")
    cluster.create(topic, 2)
    env = cli_env(cluster, redis_url)
    first = history(seed=11, n=300, keys=40)
    first += specials(first[-1].timestamp)
    sent = produce(cluster, topic, first, partitions=2)
    rule = Strategy("header", "v")  # the run's --strategy override must reach the run and the table reader

    run = in_process(monkeypatch, capsys, env, "compact", topic, "--strategy", "header", "--header", "v")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout
    summary = json.loads(lines[0])
    assert set(summary) == SUMMARY_KEYS
    manifest = ManifestLog(KafkaConnection(cluster.bootstrap), cluster.name("compactions")).read(topic)
    assert manifest is not None and manifest.strategy_rule == rule
    now = manifest.started_at  # the run's clock: when its tombstones entered the view

    views: dict[int, list[Record]] = {}
    keys = tombstones = 0
    for p in (0, 1):
        views[p], counts = reduce_partition([], sent[p], rule, now=now)
        keys, tombstones = keys + counts.keys, tombstones + counts.tombstones
    assert summary["topic"] == topic and summary["status"] == "SUCCESS" and summary["generation"] == 1
    assert summary["horizon"] == {"0": len(sent[0]), "1": len(sent[1])}
    assert summary["records_in"] == len(first)
    assert summary["records_out"] == len(views[0]) + len(views[1])
    assert (summary["keys"], summary["tombstones"]) == (keys, tombstones)
    assert summary["bytes_in"] > summary["bytes_out"] > 0 and summary["seconds"] >= 0

    status = cli(env, "compact", "status", topic)
    assert status.returncode == 0, status.stderr[-3000:]
    assert len(status.stdout.splitlines()) == 1
    st = json.loads(status.stdout)
    assert set(st) == STATUS_KEYS
    assert st["status"] == "SUCCESS" and st["error"] is None
    same = ("topic", "generation", "horizon", "keys", "records_in", "records_out", "bytes_in", "bytes_out")
    assert {k: st[k] for k in same} == {k: summary[k] for k in same}

    # records appended after the run: the reader reads them from the source, after the view
    more = history(seed=12, n=80, keys=40, start_ts=10_000)
    more += [
        Event(0, BIN_KEY, None, more[-1].timestamp + 1),  # deletes the non-UTF-8 key
        Event(1, b"gone", b"back", more[-1].timestamp + 1),  # no header either side: the higher offset wins
    ]
    tail = produce(cluster, topic, more, partitions=2)
    assert all(r.offset >= len(sent[p]) for p in (0, 1) for r in tail[p])

    read = cli(env, "read", topic, "--compacted")
    assert read.returncode == 0, read.stderr[-3000:]
    got = [json.loads(line) for line in read.stdout.splitlines()]
    want = [expected_line(p, r) for p in (0, 1) for r in (*views[p], *tail[p])]
    assert got == want
    for p in (0, 1):  # view then tail, in offset order: nothing twice
        offsets = [row["offset"] for row in got if row["partition"] == p]
        assert offsets == sorted(set(offsets))
    # what the fixture promised to cover, so the comparison above covers it
    assert any(row.get("key_b64") == "//5r" and row.get("value_b64") == "gHb/" for row in got)
    assert any(row.get("key") == "gone" and deletes(row) and row["offset"] < len(sent[1]) for row in got)  # view's
    assert any(row.get("key_b64") == "//5r" and deletes(row) for row in got)  # the tail's delete

    read_table = cli(env, "read", topic, "--compacted", "--table")
    assert read_table.returncode == 0, read_table.stderr[-3000:]
    got_table = [json.loads(line) for line in read_table.stdout.splitlines()]
    want_table = [expected_line(p, r) for p in (0, 1) for r in table([*sent[p], *tail[p]], rule)]
    assert got_table == want_table
    assert all(row.get("value") is not None or "value_b64" in row for row in got_table)
    assert not any(row.get("key_b64") == "//5r" for row in got_table)  # deleted in the tail
    assert any(row.get("key") == "gone" and row.get("value") == "back" for row in got_table)
    assert not any(row.get("key") == "gone0" for row in got_table)


def test_compact_on_a_local_master_runs_without_a_spark_context_until_a_run_needs_the_shuffle(
    cluster, redis_url
) -> None:
    """`compactd compact` in a process of its own on `local[2]` (issue 65): its JVM tasks run on threads of Spark's
    JVM launched without a context (compaction/local_tasks.py), and the view reads as the model says. A topic whose
    keys outgrow the tasks' map (1 MiB, two-pass reads) needs Spark's shuffle: the context is built then, on the same
    JVM, and that view reads right too."""
    env = cli_env(cluster, redis_url) | {"COMPACTD_LOG_LEVEL": "INFO", "COMPACTD_SPARK_MASTER": "local[2]"}
    topic, wide = cluster.name("narrow"), cluster.name("wide")
    cluster.create(topic, 2)
    cluster.create(wide, 1)
    sent = produce(cluster, topic, history(seed=31, n=300, keys=40), partitions=2)
    for i in range(60_000):  # more keys than a 1 MiB map holds
        cluster.send_raw(wide, b"v%d" % i, b"k%d" % i)
    cluster.send_raw(wide, None, b"k7")  # a delete among them
    cluster.flush()

    def read_table(t: str) -> list[dict[str, Any]]:
        out = cli(env, "read", t, "--compacted", "--table")
        assert out.returncode == 0, out.stderr[-3000:]
        return [json.loads(line) for line in out.stdout.splitlines()]

    run = cli(env, "compact", topic)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1])["generation"] == 1
    assert "without Spark's scheduler" in run.stderr, run.stderr[-3000:]
    assert "Spark's shuffle" not in run.stderr, run.stderr[-3000:]
    want = [expected_line(p, r) for p in (0, 1) for r in table(sent[p], Strategy())]
    assert read_table(topic) == want

    tight = env | {"COMPACTD_COMPACTION_TASK_RECORDS": "1", "COMPACTD_COMPACTION_TASK_MAP_MB": "1"}
    run = cli(tight, "compact", wide)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "without Spark's scheduler" in run.stderr and "Spark's shuffle reduces them" in run.stderr, run.stderr
    reader = CompactedReader(KafkaConnection(cluster.bootstrap), cluster.name("compactions"))
    got = {rec.key: rec.value for _, rec in reader.partition_records(wide, table_mode=True)}  # 60k lines: no CLI
    assert len(got) == 60_000 - 1 and b"k7" not in got
    assert all(value == b"v" + key[1:] for key, value in got.items())


def test_exit_codes_and_error_lines(cluster, redis_url) -> None:
    env = cli_env(cluster, redis_url)
    topic = cluster.name("held")
    cluster.create(topic, 1)
    produce(cluster, topic, history(seed=21, n=10, keys=3), partitions=1)

    bad = cli(env, "compact", topic, "--strategy", "newest")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "--strategy" in one_error_line(bad)

    missing = cluster.name("no-such-topic")
    gone = cli(env, "compact", missing)
    assert gone.returncode == 1 and gone.stdout == ""
    assert "does not exist" in one_error_line(gone)
    failed = json.loads(cli(env, "compact", "status", missing).stdout)
    assert failed["status"] == "ERROR" and "does not exist" in failed["error"] and failed["generation"] == 0

    lease = CompactionState(redis.Redis.from_url(redis_url), "cd:default").take_lease(topic)
    try:
        held = cli(env, "compact", topic)
    finally:
        lease.release()
    assert held.returncode == 1 and held.stdout == ""
    line = one_error_line(held)  # who holds it (this test's live process) and for how long
    assert "already running" in line and f"pid {os.getpid()} on " in line and "lease for " in line, line

    never = cli(env, "compact", "status", topic)  # the held run never started: still never run
    assert never.returncode == 0, never.stderr[-3000:]
    st = json.loads(never.stdout)
    assert set(st) == STATUS_KEYS
    assert (st["status"], st["generation"], st["horizon"], st["error"]) == ("NOT_RUN", 0, {}, None)

    plain = cli(env, "read", topic)
    assert plain.returncode == 2 and plain.stdout == ""
    assert "--compacted" in one_error_line(plain)

    unknown = cli(env, "read", missing, "--compacted")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "does not exist" in one_error_line(unknown)

    away = {**env, "COMPACTD_BOOTSTRAP_SERVERS": "127.0.0.1:1"}  # no broker there
    for args in (("read", topic, "--compacted"), ("compact", topic), ("compact", "status", topic)):
        started = time.monotonic()
        out = cli(away, *args)
        assert out.returncode == 1 and out.stdout == "", args
        assert "Kafka unreachable" in (line := one_error_line(out)) and "bootstrap_servers" in line, args
        assert time.monotonic() - started < 20, args


def rows_by_partition(df) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for row in df.collect():
        ts = row["timestamp"]
        ms = None if ts is None else round(ts.timestamp() * 1000) if isinstance(ts, datetime) else ts
        headers = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"])
        key = None if row["key"] is None else bytes(row["key"])
        value = None if row["value"] is None else bytes(row["value"])
        out.setdefault(row["partition"], []).append((row["offset"], ms, key, value, headers))
    return out


def as_rows(recs: list[Record]) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in recs]


@pytest.mark.spark
def test_spark_data_source_reads_what_the_reader_reads(cluster, job_settings, redis_url, spark) -> None:
    topic = cluster.name("events")
    manifests = cluster.name("compactions")
    cluster.create(topic, 2)
    settings = job_settings()
    settings = settings.model_copy(update={"topics": settings.topics.model_copy(update={"compactions": manifests})})
    first = history(seed=31, n=200, keys=25)
    first += specials(first[-1].timestamp)
    sent = produce(cluster, topic, first, partitions=2)

    comp = Compactor(settings, redis.Redis.from_url(redis_url), lambda: {}, lambda: spark)
    out = comp.run(topic, Overrides(strategy="timestamp"))
    assert out["generation"] == 1
    manifest = comp.log.read(topic)
    assert manifest is not None
    rule = Strategy("timestamp")
    tail = produce(cluster, topic, history(seed=32, n=60, keys=25, start_ts=20_000), partitions=2)

    model = {p: reduce_partition([], sent[p], rule, now=manifest.started_at)[0] + tail[p] for p in (0, 1)}
    model_table = {p: table([*sent[p], *tail[p]], rule) for p in (0, 1)}

    reader = CompactedReader(settings.kafka_connection(), manifests)
    library: dict[int, list[Record]] = {0: [], 1: []}
    for p, rec in reader.partition_records(topic):
        library[p].append(rec)
    assert {p: as_rows(v) for p, v in library.items()} == {p: as_rows(v) for p, v in model.items()}

    spark.dataSource.register(ViewSource)
    base = (
        spark.read.format("compactd-view")
        .option("topic", topic)
        .option("kafka.bootstrap.servers", cluster.bootstrap)
        .option("manifests", manifests)
    )
    assert rows_by_partition(base.load()) == {p: as_rows(v) for p, v in model.items()}
    assert rows_by_partition(base.option("table", "true").load()) == {p: as_rows(v) for p, v in model_table.items()}
