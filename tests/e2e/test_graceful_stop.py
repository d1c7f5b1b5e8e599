"""SIGTERM finishes the running batch, drains the outbox and exits 0; a second SIGTERM exits 1 at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.spark
HOUR = 3_600_000
SLOW_S = 8.0


def start(settings, tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    marker, log = tmp_path / "in-batch", tmp_path / "job.log"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "tests.support.slow_run", str(marker), str(SLOW_S), "run", "--config", str(config)]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=log.open("wb"))
    return proc, marker, log


def overdue_segment(cluster, settings, topic: str) -> None:
    now = int(time.time() * 1000)
    cluster.create(settings.topics.segments)
    cluster.send(
        settings.topics.segments,
        [
            {
                "type": "segment_rolled",
                "topic": topic,
                "partition": 0,
                "base_offset": 0,
                "end_offset": 10,
                "first_batch_max_ts": now - 2 * HOUR,
                "size_bytes": 1,
                "ts": now - 2 * HOUR,
            }
        ],
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    until = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, "the job exited before its first batch"
        assert time.monotonic() < until, "no batch started"
        time.sleep(0.1)


def test_sigterm_finishes_the_batch_and_drains_then_exits_0(cluster, job_settings, redis_url, tmp_path) -> None:
    topic = cluster.name("gdpr")
    s = job_settings(thresholds={f"topic:{topic}": {"max.compaction.lag.ms": HOUR}})
    overdue_segment(cluster, s, topic)
    proc, marker, log = start(s, tmp_path)
    try:
        wait_for(marker, proc)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    assert took >= SLOW_S - 1  # it waited for the batch instead of cutting it short
    state = s.redis_state()
    assert state.outbox() == []  # decided in that batch, carried out before leaving
    audit = cluster.read_all(s.topics.actions)
    assert [(a["topic"], a["action"], a["status"]) for a in audit] == [(topic, "compact", "dry_run")]
    text = log.read_text()
    assert "SIGTERM: stopping after the running batch" in text and "Traceback" not in text


def test_second_sigterm_exits_1_at_once(cluster, job_settings, tmp_path) -> None:
    topic = cluster.name("gdpr")
    s = job_settings(thresholds={f"topic:{topic}": {"max.compaction.lag.ms": HOUR}})
    overdue_segment(cluster, s, topic)
    proc, marker, log = start(s, tmp_path)
    try:
        wait_for(marker, proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    errors = [ln for ln in log.read_text().splitlines() if ln.startswith("compactd: error:")]
    assert rc == 1 and took < SLOW_S, (rc, took)
    assert errors == [
        "compactd: error: stopped by a second SIGTERM before the running batch finished; "
        "the checkpoint replays it on the next start"
    ]
