"""Config events while the continuous job runs: the next trigger uses them; bad ones change nothing."""

from __future__ import annotations

import json
import threading
import time

import pytest

from compactd.app.cli import main
from compactd.codec.config_events import sign
from compactd.daemon.application import Application
from compactd.kafka.reader import read_to_end
from tests.support.waiting import holds_for, wait_for

H = 3_600_000


@pytest.mark.spark
def test_config_event_changes_a_threshold_in_the_running_job(
    spark, cluster, job_settings, redis_url, monkeypatch, capsys
) -> None:
    interval = 1_000
    secrets = ["new-secret", "old-secret"]
    ctopic = cluster.name("gdpr")
    s = job_settings(trigger_interval_ms=interval, config_secrets=secrets)
    for topic in (s.topics.segments, s.topics.config):
        cluster.create(topic)
    monkeypatch.setenv("COMPACTD_TOPICS__CONFIG", s.topics.config)
    monkeypatch.setenv("COMPACTD_CONFIG_SECRETS", json.dumps(secrets))
    flags = ["--bootstrap-servers", s.bootstrap_servers, "--redis-url", s.redis_url]
    now = int(time.time() * 1000)
    segment = {
        "type": "segment_rolled",
        "topic": ctopic,
        "partition": 0,
        "base_offset": 0,
        "end_offset": 50,
        "first_batch_max_ts": now - H,  # an hour old: overdue under any lag below an hour, untouched without one
        "size_bytes": 1,
        "ts": now - H,
    }
    cluster.send(s.topics.segments, [segment])
    state = s.redis_state()
    stop = threading.Event()
    with Application(s, spark=spark) as job:
        runner = threading.Thread(target=job.run, kwargs={"stop": stop})
        runner.start()
        try:
            wait_for("segment merged", lambda: state.view(ctopic, 0).segments, 120)
            holds_for("no action (no lag configured)", lambda: state.records([(ctopic, 0)])[(ctopic, 0)],
                      lambda r: r == [], 2 * interval / 1000)  # fmt: skip

            # bad events first: none of them may change anything
            good = {"type": "config", "scope": f"topic:{ctopic}", "set": {"max.compaction.lag.ms": 60_000}, "ts": now}
            invalid = {**good, "version": 7, "set": {"max.compaction.lag.ms": -5}}
            invalid["sig"] = sign(invalid, secrets[0])
            forged = {**good, "version": 8, "sig": "0" * 64}
            cluster.send(s.topics.config, [invalid, forged], key=f"topic:{ctopic}")
            cluster.send_raw(s.topics.config, b"{oops", b"global")
            cluster.flush()
            wait_for("bad events in the DLQ", lambda: len(cluster.read_all(s.topics.dlq, timeout=2)) >= 3, 60)
            assert state.records([(ctopic, 0)])[(ctopic, 0)] == []
            assert state.config_layers() == {}

            # the real change, through the CLI (signed with the first secret)
            assert main(["config", "set", f"topic:{ctopic}", "max.compaction.lag.ms=60000", *flags]) == 0
            # the next version after everything on the topic, rejected events included: versions never go back
            assert capsys.readouterr().out.strip() == "9"
            sent_at = time.monotonic()
            wait_for("compaction decided", lambda: state.records([(ctopic, 0)])[(ctopic, 0)], 60)
            took = time.monotonic() - sent_at

            # version 9 again with different content (signed with the old secret) is stale
            stale = {**good, "version": 9, "set": {"max.compaction.lag.ms": 1}}
            stale["sig"] = sign(stale, secrets[1])
            cluster.send(s.topics.config, [stale], key=f"topic:{ctopic}")
            cluster.flush()
            wait_for("stale event in the DLQ", lambda: len(cluster.read_all(s.topics.dlq, timeout=2)) >= 4, 60)
        finally:
            stop.set()
            runner.join(120)
    rec = state.records([(ctopic, 0)])[(ctopic, 0)][0]
    assert (rec.action, rec.reason, rec.status) == ("compact", "max_compaction_lag", "dry_run")
    # the event was applied by the trigger that read it: decided within a few triggers of `config set` returning
    assert took < 10 * interval / 1000, took
    dlq = cluster.read_all(s.topics.dlq)
    assert [(d["stream"], d["reason"]) for d in dlq] == [
        ("config", "invalid_config"),
        ("config", "bad_signature"),
        ("config", "malformed_json"),
        ("config", "stale_version"),
    ]
    layer = state.config_layers()[f"topic:{ctopic}"]
    assert layer["version"] == 9 and layer["values"] == {"max.compaction.lag.ms": 60_000}
    assert main(["config", "get", f"partition:{ctopic}/0", *flags]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["values"]["max.compaction.lag.ms"] == 60_000
    assert len(list(read_to_end(s.kafka_connection(), s.topics.config))) == 5
