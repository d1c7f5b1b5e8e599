"""The compaction service through the continuous job: a config event turns it on for a topic, the threshold is
crossed, generations are published next to the running stream, `compact status` says SUCCESS, the view reads as
KIP-280 says, each run is an action record, and source retention never passes the published horizon."""

from __future__ import annotations

import json
import threading
import time

import pytest

from compactd.app.cli import main
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import CompactedReader, table
from compactd.daemon.application import Application
from tests.support.compaction import history, produce
from tests.support.waiting import wait_for

H = 3_600_000


def segment(topic: str, partition: int, end: int, now: int) -> dict:
    return {
        "type": "segment_rolled",
        "topic": topic,
        "partition": partition,
        "base_offset": 0,
        "end_offset": end,
        "first_batch_max_ts": now - 2 * H,
        "size_bytes": 10,
        "ts": now - H,
    }


@pytest.mark.versions
@pytest.mark.spark
def test_the_job_compacts_a_topic_turned_on_by_a_config_event(
    spark, cluster, job_settings, redis_url, monkeypatch, capsys
) -> None:
    s = job_settings(trigger_interval_ms=500, compaction_check_interval_ms=500)
    topic = cluster.name("accounts")
    cluster.create(topic, 2)
    for t in (s.topics.segments, s.topics.config, s.topics.commits):
        cluster.create(t)
    monkeypatch.setenv("COMPACTD_TOPICS__CONFIG", s.topics.config)
    monkeypatch.setenv("COMPACTD_TOPICS__COMPACTIONS", s.topics.compactions)
    flags = ["--bootstrap-servers", s.bootstrap_servers, "--redis-url", s.redis_url]
    first = produce(cluster, topic, history(seed=11, n=300, keys=40), partitions=2)
    now = int(time.time() * 1000)
    # forced retention would delete every rolled segment: only the published horizon holds it back
    cluster.send(s.topics.segments, [segment(topic, p, len(first[p]), now) for p in (0, 1)])
    reader = CompactedReader(s.kafka_connection(), s.topics.compactions)
    stop = threading.Event()
    with Application(s, spark=spark) as job:
        runner = threading.Thread(target=job.run, kwargs={"stop": stop})
        runner.start()
        try:
            time.sleep(2)
            # service off: no view, no cap, and (dry run, the default) nothing deleted either
            assert cluster.watermarks(topic, 0)[0] == 0
            settings = [
                "compaction.service=true",
                "dry.run=false",
                "compaction.threshold.bytes=500",  # ~10 B per record: 120 new records cross it,
                "compaction.view.grace.ms=0",
                "forced.retention.ms=0",
            ]
            assert main(["config", "set", f"topic:{topic}", *settings, *flags]) == 0
            capsys.readouterr()

            def generation() -> int:
                assert main(["compact", "status", topic, *flags]) == 0
                return json.loads(capsys.readouterr().out)["generation"]

            wait_for("generation 1 published", lambda: generation() >= 1, 120)
            # the retention delete decided meanwhile stops at the horizon
            wait_for("source deleted up to the horizon", lambda: cluster.watermarks(topic, 0)[0] > 0, 60)
            manifest = reader.manifests.read(topic)
            assert manifest is not None
            for p in (0, 1):
                low, _ = cluster.watermarks(topic, p)
                assert low <= manifest.partitions[str(p)].horizon

            # records appended: their bytes cross the threshold, the job publishes generation 2 by itself
            more = produce(cluster, topic, history(seed=12, n=120, keys=40, start_ts=20_000), partitions=2)
            wait_for("generation 2 published", lambda: generation() >= 2, 120)
            assert main(["compact", "status", topic, *flags]) == 0
            status = json.loads(capsys.readouterr().out)
        finally:
            stop.set()
            runner.join(120)
    assert (status["status"], status["error"]) == ("SUCCESS", None)
    whole = {p: first[p] + more[p] for p in (0, 1)}
    got: dict[int, list] = {0: [], 1: []}
    for p, rec in reader.partition_records(topic, table_mode=True):
        got[p].append((rec.offset, rec.key, rec.value))
    for p in (0, 1):
        assert got[p] == [(r.offset, r.key, r.value) for r in table(whole[p], Strategy())]
        low, _ = cluster.watermarks(topic, p)
        assert low <= reader.manifests.read(topic).partitions[str(p)].horizon  # type: ignore[union-attr]
    runs = [a for a in cluster.read_all(s.topics.actions) if a["action"] == "compact_view"]
    assert [r["status"] for r in runs][:2] == ["sent", "sent"]
    assert runs[0]["reason"] == "first_generation" and runs[0]["detail"]["generation"] == 1
    assert runs[1]["reason"] == "compaction_threshold" and runs[1]["detail"]["generation"] == 2
    assert runs[1]["detail"]["records_in"] > 0
