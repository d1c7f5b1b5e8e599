"""The cluster's lifecycle under a running job (a `compactd run` process, real Spark, real broker, real Redis):
topics deleted and created again, and nudges that outlive the state. Ground truth is the broker: watermarks and
topic configs, not compactd's own records."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml
from confluent_kafka import TopicPartition

from compactd.state.redis_store import RedisState
from tests.integration.test_sinks_and_controller import topic_config
from tests.integration.test_topic_lifecycle import recreate
from tests.support.waiting import holds_for

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
MIN, HOUR = 60_000, 3_600_000
LAG = "max.compaction.lag.ms"


def start(config: Path, log: Path, crash_at: str | None = None) -> subprocess.Popen:
    prefix = ["-m", "tests.support.crashing_run", crash_at] if crash_at else ["-m", "compactd"]
    cmd = [sys.executable, *prefix, "run", "--config", str(config)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def wait_until(what: str, check, proc: subprocess.Popen | None, log: Path, timeout_s: float = 120.0) -> None:
    until = time.monotonic() + timeout_s
    while not check():
        if proc is not None:
            assert proc.poll() is None, f"the job exited ({proc.returncode}) waiting for {what}:\n{log.read_text()}"
        assert time.monotonic() < until, f"timed out waiting for {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    finally:
        proc.kill()


def segment(topic: str, base: int, end: int, closed: int, ts: int | None = None) -> dict:
    return {
        "type": "segment_rolled", "topic": topic, "partition": 0, "base_offset": base, "end_offset": end,
        "first_batch_max_ts": closed if ts is None else ts, "size_bytes": 1000, "ts": closed,
    }  # fmt: skip


def write_config(s, tmp_path: Path) -> Path:
    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump(s.model_dump(mode="json")))
    return config


def test_recreated_topics_lose_none_of_their_new_records(cluster, job_settings, tmp_path) -> None:
    orders, trimmed = cluster.name("orders"), cluster.name("trimmed")
    for t in (orders, trimmed):
        cluster.create(t, 1, {"cleanup.policy": "delete"})
        cluster.fill(t, 3000)
    for fut in cluster.admin.delete_records([TopicPartition(trimmed, 0, 2000)]).values():
        fut.result(30)
    # forced retention of an hour: nothing is due until a config event shortens it, after the re-creation
    s = job_settings(thresholds={"global": {"dry.run": False, "forced.retention.ms": HOUR}})
    for t in (s.topics.segments, s.topics.config):
        cluster.create(t)
    now = int(time.time() * 1000)
    old = now - 5 * MIN
    cluster.send(s.topics.segments, [segment(orders, b, b + 1000, old) for b in (0, 1000, 2000)])
    cluster.send(
        s.topics.segments,
        [{"type": "log_start", "topic": trimmed, "partition": 0, "log_start_offset": 2000, "ts": old},
         segment(trimmed, 2000, 2500, old)],
    )  # fmt: skip
    log = tmp_path / "job.log"
    proc = start(write_config(s, tmp_path), log)
    state = RedisState(redis.Redis.from_url(s.redis_url), prefix=s.key_prefix)
    try:
        wait_until("the old segments merged", lambda: state.partitions(orders) and state.partitions(trimmed), proc, log)
        recreate(cluster, orders, 2000)  # only an active segment: nothing of it is due
        recreate(cluster, trimmed, 2600)  # the old delete (to 2500) is inside the new log's end
        event = {"type": "config", "scope": "global", "set": {"forced.retention.ms": MIN}, "version": 1, "ts": now}
        cluster.send(s.topics.config, [event], key="global")  # the OLD segments are due now

        def skipped() -> list[dict]:
            return [a for a in cluster.read_all(s.topics.actions) if a["status"] == "skipped"]

        wait_until("both stale deletes skipped", lambda: len({a["topic"] for a in skipped()}) == 2, proc, log)
        assert cluster.watermarks(orders) == (0, 2000) and cluster.watermarks(trimmed) == (0, 2600)
        assert all(a["detail"]["why"].startswith("stale state: ") for a in skipped())

        # the new topic's own segments: the delete goes out once one is due, and no further
        now = int(time.time() * 1000)
        cluster.send(s.topics.segments, [segment(orders, 0, 1000, now - 5 * MIN), segment(orders, 1000, 1500, now)])
        wait_until("the new topic's due segment deleted", lambda: cluster.watermarks(orders)[0] == 1000, proc, log)
        # a few triggers (500 ms) pass: the delete goes no further (a slow job only proves less)
        holds_for("the delete no further", lambda: (cluster.watermarks(orders), cluster.watermarks(trimmed)),
                  lambda w: w == ((1000, 2000), (0, 2600)), 2)  # fmt: skip

        # Redis loses everything: the rebuild reads the sources from their start, the old logs' events included,
        # and drops those the resets superseded (their positions are on the ledger)
        redis.Redis.from_url(s.redis_url).flushall()
        wait_until("the rebuild", lambda: "state rebuilt from the sources" in log.read_text(), proc, log)
        assert [(x.base_offset, x.end_offset) for x in state.view(orders, 0).segments] == [(0, 1000), (1000, 1500)]
        assert state.partitions(trimmed) == []  # it only ever had the old log's events
        # the rebuilt state's triggers pass: none deletes a new record
        holds_for("no new record deleted by the rebuilt state",
                  lambda: (cluster.watermarks(orders), cluster.watermarks(trimmed)),
                  lambda w: w == ((1000, 2000), (0, 2600)), 3)  # fmt: skip
    finally:
        stop(proc)
    text = log.read_text()
    assert text.count("topic re-created: ") == 2 and "Traceback" not in text, text
    assert "events of 2 re-created topics from before their reset are dropped" in text, text
    sent = [a for a in cluster.read_all(s.topics.actions) if a["status"] == "sent"]
    # the rebuilt state decides the delete the lost one had made again: below the log start, it changes nothing
    assert {(a["topic"], a["before_offset"]) for a in sent} == {(orders, 1000)}


def test_nudges_are_put_back_after_kill_9_and_state_loss(cluster, job_settings, tmp_path) -> None:
    """1. the job is killed (-9) right after it nudged a topic, before the nudge's record was written, and Redis is
    flushed while it is down; 2. Redis is flushed under the running job while another nudge is on. Each time, once
    the cleaner catches up, the topic's config is back to what it was within a minute."""
    first, second = cluster.name("ledger1"), cluster.name("ledger2")
    for t in (first, second):
        cluster.create(t, 1, {"cleanup.policy": "compact", LAG: "86400000"})
        cluster.fill(t, 150)  # the segments below hold [0, 100): the log holds them (else: stale state)
    s = job_settings(thresholds={"global": {"dry.run": False}, f"topic:{first}": {LAG: HOUR}})
    for t in (s.topics.segments, s.topics.config):
        cluster.create(t)
    r = redis.Redis.from_url(s.redis_url)
    config = write_config(s, tmp_path)
    now = int(time.time() * 1000)
    overdue = now - 2 * HOUR
    cluster.send(s.topics.segments, [segment(first, 0, 100, overdue), segment(second, 0, 100, overdue)])
    log = tmp_path / "job.log"

    crashing = start(config, log, crash_at="after_nudge:0")
    try:
        crashing.wait(180)
    finally:
        crashing.kill()
    assert crashing.returncode == -9, log.read_text()
    assert topic_config(cluster.bootstrap, first, LAG, want=("1", False)) == ("1", False)
    r.flushall()  # the nudge's record never reached Redis, and Redis has nothing now

    proc = start(config, log)
    try:
        compacted = {"type": "compacted", "topic": first, "partition": 0, "cleaned_up_to": 100, "ts": now}
        cluster.send(s.topics.segments, [compacted])
        t0 = time.monotonic()
        wait_until("the first topic's config put back", lambda: topic_config(cluster.bootstrap, first, LAG)[0]
                   == "86400000", proc, log, timeout_s=180)  # fmt: skip
        # 2. a nudge on the second topic, then FLUSHALL under the running job
        event = {"type": "config", "scope": f"topic:{second}", "set": {LAG: HOUR}, "version": 1, "ts": now}
        cluster.send(s.topics.config, [event], key=f"topic:{second}")
        wait_until("the second topic nudged", lambda: topic_config(cluster.bootstrap, second, LAG)[0] == "1", proc, log)
        r.flushall()
        compacted = {"type": "compacted", "topic": second, "partition": 0, "cleaned_up_to": 100, "ts": now}
        cluster.send(s.topics.segments, [compacted])
        t1 = time.monotonic()
        wait_until("the second topic's config put back", lambda: topic_config(cluster.bootstrap, second, LAG)[0]
                   == "86400000", proc, log, timeout_s=60)  # fmt: skip
        back_s = time.monotonic() - t1
    finally:
        stop(proc)
    text = log.read_text()
    assert "state lost:" in text and "Traceback" not in text.split("after_nudge")[-1], text
    assert back_s < 60, back_s
    print(f"first topic back {time.monotonic() - t0:.1f}s after the cleaner answered (job start included); "
          f"second {back_s:.1f}s")  # fmt: skip
