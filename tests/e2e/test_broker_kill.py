"""Apache Kafka killed with -9 and started again under a running job: nothing unsafe while it is down or after,
and the job carries on by itself (no restart of its own).

Ground truth is the broker's low watermark, sampled all along: it never passes the group's committed offset."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from compactd.daemon.application import Application
from compactd.local.broker import kafka_broker
from tests.support.events import old_segments
from tests.support.fixtures import Cluster
from tests.support.running import Running
from tests.support.waiting import holds_for, wait_for

pytestmark = pytest.mark.spark
H = 3_600_000


def commit(group: str, topic: str, offset: int, now: int) -> dict:
    return {"type": "offset_commit", "group": group, "topic": topic, "partition": 0, "offset": offset, "ts": now}


@pytest.mark.soak  # `make test` kills a node of three under a running job (test_replicated_cluster.py)
def test_broker_killed_and_restarted_under_a_running_job(spark, job_settings, tmp_path: Path) -> None:
    broker = kafka_broker(tmp_path / "broker")
    try:
        cluster = Cluster(broker.bootstrap)
        topic = cluster.name("orders")
        cluster.create(topic, 1, {"cleanup.policy": "delete"})
        cluster.fill(topic, 4000)
        settings = job_settings(
            bootstrap_servers=broker.bootstrap,
            trigger_interval_ms=500,
            thresholds={
                "global": {"dry.run": False, "action.retry.ms": 1000},
                f"topic:{topic}": {"consumed.retention.ms": H},
            },
        )
        t = settings.topics
        for name in (t.segments, t.commits):
            cluster.create(name)
        now = int(time.time() * 1000)
        cluster.send(t.segments, old_segments(topic, [1000, 2000, 3000, 4000], now))
        cluster.send(t.commits, [commit("billing", topic, 1500, now)])
        held = [1500]  # the group's committed offset as the job has been told, in order
        lows: list[int] = []

        def low() -> int:
            lw = cluster.watermarks(topic)[0]
            lows.append(lw)
            return lw

        with Application(settings, spark=spark) as job, Running(job) as running:
            wait_for("the first delete", lambda: low() == 1000, 120)
            broker.kill()  # kill -9: no controlled shutdown, the log dir as a crash leaves it
            # the job's triggers, sweeps and outbox meet a dead broker: it keeps running
            holds_for("the job running", lambda: running.thread.is_alive() and not running.failed, bool, 5)
            broker.start()  # same log dir, same address
            # Kafka checkpoints a deleteRecords' log start every second here (a minute by default): killed before
            # that, it starts again with the older one, and the deleted records are readable again
            assert low() in (0, 1000) and cluster.watermarks(topic)[1] == 4000
            now = int(time.time() * 1000)
            cluster.send(t.commits, [commit("billing", topic, 2500, now)])
            held.append(2500)
            wait_for("the delete after the restart", lambda: low() == 2000, 120)
            holds_for("the log start at 2000 for a few more triggers", low, lambda lw: lw == 2000, 2)
            running.assert_alive()
        assert not running.failed, running.failed
        # never past the group: the low watermark only ever reached segment ends at or below its committed offset
        assert max(lows) == 2000 and all(lw <= max(held) for lw in lows)
        assert set(lows) <= {0, 1000, 2000}
        # the same topic ID before and after the crash: the log start going back reset nothing
        assert job.metrics.registry.get_sample_value("compactd_topic_resets_total") in (None, 0)
    finally:
        broker.stop()
