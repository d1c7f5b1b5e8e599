"""Config events against the real broker and Redis: `config set` writes them, the job's applier takes them."""

from __future__ import annotations

import json

import pytest
import redis
from prometheus_client import CollectorRegistry

from compactd.app.cli import main
from compactd.codec.config_events import sign
from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.control.runtime_config import RuntimeConfig
from compactd.kafka.reader import read_to_end
from compactd.model import Segment
from compactd.settings import Settings
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000


def flags(s: Settings) -> list[str]:
    return ["--bootstrap-servers", s.bootstrap_servers, "--redis-url", s.redis_url]


def config_rows(s: Settings) -> list[dict]:
    """The config topic as the Spark job hands it to the driver."""
    return [
        {
            "stream": "config",
            "raw_key": k,
            "raw_value": v,
            "src_topic": s.topics.config,
            "src_partition": 0,
            "src_offset": i,
        }
        for i, (k, v) in enumerate(read_to_end(s.kafka_connection(), s.topics.config))
    ]


def applier(s: Settings, rclient: redis.Redis, sink: RecordingSink | None = None) -> tuple[RuntimeConfig, Controller]:
    state = RedisState(rclient, s.key_prefix)
    metrics = Metrics(CollectorRegistry())
    ctl = Controller(state, s.thresholds, sink or RecordingSink(), None, metrics, clock=lambda: 10 * H)
    rc = RuntimeConfig(state, s.thresholds, s.secrets(), ctl, metrics)
    rc.load()
    return rc, ctl


def test_config_set_writes_versioned_events_and_get_shows_what_the_job_applied(
    job_settings, cluster, rclient, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = job_settings()
    cluster.create(s.topics.config)
    monkeypatch.setenv("COMPACTD_TOPICS__CONFIG", s.topics.config)
    assert main(["config", "set", "topic:orders", "max.compaction.lag.ms=60000", "dry.run=false", *flags(s)]) == 0
    assert main(["config", "set", "topic:orders", "groups.include=billing.*", *flags(s)]) == 0
    assert capsys.readouterr().out.split() == ["1", "2"]  # versions
    assert main(["config", "set", "topic:orders", "max.compaction.lag.ms=-1", *flags(s)]) == 2
    assert main(["config", "set", "topic:orders", "no.such.key=1", *flags(s)]) == 2
    assert main(["config", "set", "topik:orders", "dry.run=true", *flags(s)]) == 2
    assert "greater than 0" in capsys.readouterr().err
    events = [json.loads(v) for _, v in read_to_end(s.kafka_connection(), s.topics.config)]
    assert [(e["scope"], e["version"], e["set"]) for e in events] == [
        ("topic:orders", 1, {"max.compaction.lag.ms": 60000, "dry.run": False}),
        ("topic:orders", 2, {"groups.include": "billing.*"}),
    ]

    rc, ctl = applier(s, rclient)
    outcome = rc.apply(config_rows(s))
    assert outcome.applied == ["topic:orders v1", "topic:orders v2"] and not outcome.rejected
    th = ctl.thresholds("orders", 0)
    assert (th.max_compaction_lag_ms, th.dry_run, th.groups_include) == (60000, False, ("billing.*",))
    assert rc.apply(config_rows(s)).applied == []  # a re-read of the topic from the start is a replay

    assert main(["config", "get", "partition:orders/3", *flags(s)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["values"]["max.compaction.lag.ms"] == 60000 and shown["values"]["dry.run"] is False
    assert shown["versions"]["topic:orders"]["version"] == 2
    # the next `config set` continues from what was applied
    assert main(["config", "set", "topic:orders", "--unset", "groups.include", *flags(s)]) == 0
    assert capsys.readouterr().out.strip() == "3"


def test_signed_events_stale_and_invalid_ones_change_nothing(job_settings, cluster, rclient, monkeypatch) -> None:
    s = job_settings(config_secrets=["new-secret", "old-secret"])
    cluster.create(s.topics.config)
    monkeypatch.setenv("COMPACTD_TOPICS__CONFIG", s.topics.config)
    monkeypatch.setenv("COMPACTD_CONFIG_SECRETS", '["new-secret", "old-secret"]')
    assert main(["config", "set", "global", "dry.run=false", *flags(s)]) == 0
    good = next(json.loads(v) for _, v in read_to_end(s.kafka_connection(), s.topics.config))
    forged = {**good, "version": 5, "set": {"dry.run": True}}  # keeps the old signature
    unsigned = {k: v for k, v in {**good, "version": 6}.items() if k != "sig"}
    stale = {k: v for k, v in good.items() if k != "sig"} | {"set": {"action.retry.ms": 1000}}  # version 1 again
    stale["sig"] = sign(stale, "old-secret")  # signed with the secret being rotated out: still verifies
    cluster.send(s.topics.config, [forged, unsigned, stale], key="global")
    cluster.send_raw(s.topics.config, b"{not json", b"global")
    cluster.flush()

    rc, ctl = applier(s, rclient)
    outcome = rc.apply(config_rows(s))
    assert outcome.applied == ["global v1"]
    assert [r["error"] for r in outcome.rejected] == [
        "bad_signature",
        "bad_signature",
        "stale_version",
        "malformed_json",
    ]
    assert ctl.thresholds("any").dry_run is False and ctl.thresholds("any").action_retry_ms == 300_000
    assert json.loads(rclient.hget(f"{s.key_prefix}:{{cfg}}:layers", "global"))["version"] == 1


def test_changing_groups_exclude_recounts_who_holds_data_back(job_settings, rclient) -> None:
    s = job_settings()
    rc, ctl = applier(s, rclient)
    batch = BatchChanges()
    batch.topic("orders").segments.append((0, Segment(0, 100, 0, 1, 0)))
    batch.topic("orders").offsets.extend([("billing", 0, 500), ("lagging", 0, 20)])
    ctl.on_batch("s", 0, batch)
    state = RedisState(rclient, s.key_prefix)
    assert state.view("orders", 0).min_committed == 20
    event = {"type": "config", "scope": "topic:orders", "set": {"groups.exclude": ["lag.*"]}, "version": 1, "ts": 1}
    row = {"stream": "config", "raw_value": json.dumps(event).encode(), "src_partition": 0, "src_offset": 0}
    outcome = rc.apply([row])
    assert state.view("orders", 0).min_committed == 500 and ("orders", 0) in outcome.evaluate
    back = {**event, "version": 2, "set": {"groups.exclude": []}}
    rc.apply([{**row, "raw_value": json.dumps(back).encode()}])
    assert state.view("orders", 0).min_committed == 20
