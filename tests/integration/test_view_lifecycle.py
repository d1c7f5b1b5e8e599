"""The compacted view survives what the cluster does to its source, through the commands: retention past
the horizon, partitions added, the topic deleted and created again, two runs racing for one generation.

Real broker, Redis and Spark; the commands run in this process (`in_process`) on the test session's Spark. Ground
truth is KIP-280's model (`table`) over the records the source held when each generation was built.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest
import redis
from confluent_kafka import TopicPartition

from compactd.compaction.manifest import Manifest
from compactd.compaction.reduce import Record
from compactd.compaction.service import Compactor, RunFailed
from compactd.compaction.store import CompactionState, ManifestLog
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import table
from tests.integration.test_compaction_cli import cli_env, in_process, one_error_line
from tests.support.compaction import Event, produce

pytestmark = pytest.mark.spark


def delete_below(cluster, topic: str, partition: int, offset: int) -> None:
    """What the source's own retention (or anyone's deleteRecords) does."""
    for fut in cluster.admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        fut.result(30)


def rows(out: Any) -> list[tuple[int, str, str | None]]:
    """(offset, key, value) of each printed line."""
    return [(r["offset"], r["key"], r["value"]) for r in map(json.loads, out.stdout.splitlines())]


def model(recs: list[Record]) -> list[tuple[int, str, str | None]]:
    return [(r.offset, r.key.decode(), r.value.decode() if r.value else None) for r in table(recs, Strategy())]


def events(partition: int, pairs: list[tuple[str, str | None]], ts: int) -> list[Event]:
    return [Event(partition, k.encode(), None if v is None else v.encode(), ts + i) for i, (k, v) in enumerate(pairs)]


def test_retention_past_the_horizon_never_publishes_silently(cluster, redis_url, spark, monkeypatch, capsys) -> None:
    """The issue's `prices`: keys k0..k99, generation 1; then k5 deleted, k6 updated and 200 updates more; the
    source loses [0,150). Before: SUCCESS, generation 2, k5 live again. Now: ERROR naming the gap, generation 1
    still published, the compacted read refuses in one line; `--accept-gap` publishes with the gap recorded, and
    `--rebuild` starts a new lineage that equals the model of what the source still holds."""
    topic = cluster.name("prices")
    cluster.create(topic, 1)
    env = cli_env(cluster, redis_url)
    ts = int(time.time() * 1000) - 60_000
    first = produce(cluster, topic, events(0, [(f"k{i}", f"v1-{i}") for i in range(100)], ts), partitions=1)[0]
    assert in_process(monkeypatch, capsys, env, "compact", topic).returncode == 0
    later = [("k5", None), ("k6", "v2-6")] + [(f"k{10 + i % 90}", f"v3-{i}") for i in range(200)]
    second = produce(cluster, topic, events(0, later, ts + 1000), partitions=1)[0]
    delete_below(cluster, topic, 0, 150)

    refused = in_process(monkeypatch, capsys, env, "compact", topic)
    assert refused.returncode == 1 and refused.stdout == ""
    line = one_error_line(refused)
    assert "0: [100,150)" in line and "--accept-gap" in line and "--rebuild" in line, line
    status = json.loads(in_process(monkeypatch, capsys, env, "compact", "status", topic).stdout)
    assert (status["status"], status["generation"]) == ("ERROR", 1)
    assert status["gap_pending"] == [{"partition": 0, "start": 100, "end": 150, "at": 0, "accepted_by": ""}]
    read = in_process(monkeypatch, capsys, env, "read", topic, "--compacted", "--table")
    assert read.returncode == 1 and "[100,150) were deleted" in one_error_line(read)

    accepted = in_process(monkeypatch, capsys, env, "compact", topic, "--accept-gap")
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    out = json.loads(accepted.stdout)
    assert (out["generation"], out["lineage"]) == (2, 1)
    [gap] = out["gaps"]
    assert (gap["partition"], gap["start"], gap["end"]) == (0, 100, 150) and "@" in gap["accepted_by"]
    table_rows = rows(in_process(monkeypatch, capsys, env, "read", topic, "--compacted", "--table"))
    kept = [r for r in second if r.offset >= 150]
    assert table_rows == model(first + kept)  # the view plus what the source holds: k5 comes back, as accepted

    rebuilt = in_process(monkeypatch, capsys, env, "compact", topic, "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    out = json.loads(rebuilt.stdout)
    assert (out["generation"], out["lineage"], out["lineage_why"], out["gaps"]) == (3, 2, "--rebuild", [])
    assert rows(in_process(monkeypatch, capsys, env, "read", topic, "--compacted", "--table")) == model(kept)
    assert "k5" not in {k for _, k, _ in model(kept)}


def test_partitions_added_to_the_source_are_added_to_the_view(cluster, redis_url, spark, monkeypatch, capsys) -> None:
    """The issue's `acct`: 2 partitions, generation 1, then 4. Before: every run and every read failed for good."""
    topic = cluster.name("acct")
    cluster.create(topic, 2)
    env = cli_env(cluster, redis_url)
    ts = int(time.time() * 1000) - 60_000
    sent = {p: produce(cluster, topic, events(p, [(f"a{i % 7}", f"{p}-{i}") for i in range(30)], ts), 2)[p]
            for p in (0, 1)}  # fmt: skip
    assert in_process(monkeypatch, capsys, env, "compact", topic).returncode == 0
    cluster.grow(topic, 4)
    for p in (0, 2, 3):
        sent.setdefault(p, [])
        sent[p] += produce(cluster, topic, events(p, [(f"a{i % 5}", f"n{p}-{i}") for i in range(20)], ts + 500), 4)[p]

    read = in_process(monkeypatch, capsys, env, "read", topic, "--compacted", "--table")
    assert read.returncode == 0, read.stderr[-2000:]  # generation 1 read with the new partitions from the source
    run = in_process(monkeypatch, capsys, env, "compact", topic)
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(json.loads(run.stdout)["horizon"]) == ["0", "1", "2", "3"]
    view = ManifestLog(cluster.conn, env["COMPACTD_TOPICS__COMPACTIONS"]).read(topic)
    assert view is not None and len(cluster.admin.list_topics(view.view, timeout=10).topics[view.view].partitions) == 4
    got = [json.loads(line) for line in in_process(monkeypatch, capsys, env, "read", topic, "--compacted", "--table")
           .stdout.splitlines()]  # fmt: skip
    for p in range(4):
        mine = [(r["offset"], r["key"], r["value"]) for r in got if r["partition"] == p]
        assert mine == model(sent[p]), p


def test_a_recreated_source_gets_a_new_view_never_the_old_one(cluster, redis_url, spark, monkeypatch, capsys) -> None:
    topic = cluster.name("cv")
    cluster.create(topic, 1)
    env = cli_env(cluster, redis_url)
    ts = int(time.time() * 1000) - 60_000
    produce(cluster, topic, events(0, [(f"old{i}", "x") for i in range(300)], ts), partitions=1)
    assert in_process(monkeypatch, capsys, env, "compact", topic).returncode == 0
    cluster.recreate(topic, 1)
    new = produce(cluster, topic, events(0, [(f"new{i % 10}", f"n{i}") for i in range(100)], ts + 1000), 1)[0]

    read = in_process(monkeypatch, capsys, env, "read", topic, "--compacted", "--table")
    assert read.returncode == 1 and "another log" in one_error_line(read)
    run = in_process(monkeypatch, capsys, env, "compact", topic)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert (out["generation"], out["lineage"]) == (2, 2) and "another log" in out["lineage_why"]
    assert rows(in_process(monkeypatch, capsys, env, "read", topic, "--compacted", "--table")) == model(new)


def test_of_two_manifests_of_one_generation_the_first_is_published(cluster) -> None:
    """The fence: a run that publishes generation g+1 after another did loses, and is told so; compaction of the
    manifest topic cannot reorder it (each run's record has a key of its own)."""
    log = ManifestLog(cluster.conn, cluster.name("compactions"))
    cluster.create(log.topic, 1, {"cleanup.policy": "compact"})
    base = Manifest("fenced", "fenced.compacted", 1, run="a0")
    log.write(replace(base, generation=0, run=""))
    assert log.publish(base) == base
    first, late = replace(base, generation=2, run="first"), replace(base, generation=2, run="late")
    assert log.publish(first) == first
    assert log.publish(late) == first  # the late run learns it lost
    assert log.read("fenced") == first
    third = replace(base, generation=3, run="next")
    assert log.publish(third) == third and log.read("fenced") == third


def test_a_run_that_lost_its_lease_stops_and_never_publishes(cluster, job_settings, redis_url, spark) -> None:
    """A run paused past its lease (here: the lease taken from it while its writers ran) stops at its next step;
    the run that took the topic meanwhile publishes."""
    topic = cluster.name("paused")
    cluster.create(topic, 1)
    s = job_settings(compaction_lease_ms=2_000)
    r = redis.Redis.from_url(redis_url)
    comp = Compactor(s, r, lambda: {"global": {"compaction.view.grace.ms": 0}}, lambda: spark)
    ts = int(time.time() * 1000) - 60_000
    produce(cluster, topic, events(0, [(f"p{i % 9}", f"{i}") for i in range(50)], ts), partitions=1)

    def stolen(phase: str) -> None:
        if phase == "written":
            r.delete(CompactionState(r, s.key_prefix)._key(topic, "lease"))  # expired: another run may start
            assert comp.run(topic)["generation"] == 1

    with pytest.raises(RunFailed, match=r"lost its lease|published meanwhile"):
        comp.run(topic, on_phase=stolen)
    published = comp.log.read(topic)
    assert published is not None and published.generation == 1


def test_a_new_lineage_leaves_only_its_own_keys_readable_and_keeps_compacting(
    cluster, redis_url, spark, monkeypatch, capsys
) -> None:
    """Issue 64, item 8 (reproduced): a source of 4 partitions compacted, then deleted and created again with 2
    partitions and new keys. Before: the next run started lineage 2, a plain read_committed consumer of the view read
    all 120 old keys (30 on each of its 4 partitions) as live beside the 60 new ones, and every later run exited 1
    (`view topic ... has 4 partitions and ... has 2: nothing written`). The old lineage goes as the new one is
    published, the view's extra partitions are emptied, and the source keeps being compacted."""
    from tests.support.compaction import last_record_wins, read_plain

    topic = cluster.name("lt")
    cluster.create(topic, 4)
    env = cli_env(cluster, redis_url)
    ts = int(time.time() * 1000) - 60_000
    for p in range(4):
        produce(cluster, topic, events(p, [(f"old{p}-{i}", "x") for i in range(30)], ts), partitions=4)
    assert in_process(monkeypatch, capsys, env, "compact", topic).returncode == 0
    cluster.recreate(topic, 2)
    for p in range(2):
        produce(cluster, topic, events(p, [(f"new{p}-{i}", "n") for i in range(30)], ts + 1000), partitions=2)

    run = in_process(monkeypatch, capsys, env, "compact", topic)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert (out["generation"], out["lineage"]) == (2, 2), out
    view = f"{topic}.compacted"
    live = {k for recs in read_plain(cluster, view).values() for k in last_record_wins(recs)}
    assert live == {f"new{p}-{i}".encode() for p in range(2) for i in range(30)}, sorted(live)[:5]

    for p in range(2):
        produce(cluster, topic, events(p, [(f"new{p}-0", "m")], ts + 2000), partitions=2)
    again = in_process(monkeypatch, capsys, env, "compact", topic)
    assert again.returncode == 0, one_error_line(again)
    assert json.loads(again.stdout)["generation"] == 3
    live = {k for recs in read_plain(cluster, view).values() for k in last_record_wins(recs)}
    assert len(live) == 60 and all(k.startswith(b"new") for k in live)
