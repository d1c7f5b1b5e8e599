"""SIGTERM or SIGINT to the job's whole process group — as `kill -TERM -- -PGID`, supervisord's `stopasgroup` and
Ctrl-C send them — finishes the running batch, drains the outbox and exits 0, and nothing the job started (Spark's
JVM, Python workers) outlives it; a second signal exits 1 at once.

The driver is alone in its process group (Spark's JVM and its workers have a session of their own, checked below),
so a signal to the group is the signal `timeout` or `kill PID` sends to the driver alone: one case covers both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.processes import tree, wait_until_gone

pytestmark = pytest.mark.spark
HOUR = 3_600_000
SLOW_S = 3.0  # the batch the first signal meets; it must finish before the job exits


def start(
    settings, tmp_path: Path, env: dict[str, str] | None = None, slow_s: float = SLOW_S
) -> tuple[subprocess.Popen, Path, Path]:
    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    marker, log = tmp_path / "in-batch", tmp_path / "job.log"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "tests.support.slow_run", str(marker), str(slow_s), "run", "--config", str(config)]
    # a session (and process group) of its own, as under a terminal or a supervisor: the test is not in the group
    proc = subprocess.Popen(
        cmd, cwd=root, stdout=subprocess.PIPE, stderr=log.open("wb"), start_new_session=True, env=env
    )
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


@pytest.mark.parametrize(
    "sig",
    # SIGINT's graceful stop is also the first of test_second_sigint_exits_1_at_once's two: `make soak` runs it here
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.soak)],
    ids=["sigterm-group", "sigint-group"],
)
def test_signal_finishes_the_batch_and_drains_then_exits_0(cluster, job_settings, redis_url, tmp_path, sig) -> None:
    topic = cluster.name("gdpr")
    s = job_settings(thresholds={f"topic:{topic}": {"max.compaction.lag.ms": HOUR}})
    overdue_segment(cluster, s, topic)
    proc, marker, log = start(s, tmp_path)
    try:
        wait_for(marker, proc)
        started = tree(proc.pid)  # the driver, Spark's JVM and the Python workers it runs
        assert len(started) > 2, started
        assert [p.pid for p in started.values() if p.sid == proc.pid] == [proc.pid]  # the group is the driver
        signalled = time.monotonic()
        os.killpg(proc.pid, sig)
        assert proc.wait(120) == 0, log.read_text()
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    assert took >= SLOW_S - 1  # it waited for the batch instead of cutting it short
    assert wait_until_gone(started) == []  # nothing the job started outlives it
    state = s.redis_state()
    assert state.outbox() == []  # decided in that batch, carried out before leaving
    audit = cluster.read_all(s.topics.actions)
    assert [(a["topic"], a["action"], a["status"]) for a in audit] == [(topic, "compact", "dry_run")]
    text = log.read_text()
    assert f"{sig.name}: stopping after the running batch" in text and "Traceback" not in text
    assert "compactd: error" not in text


def test_second_sigint_exits_1_at_once(cluster, job_settings, tmp_path) -> None:  # Ctrl-C twice
    topic = cluster.name("gdpr")
    s = job_settings(thresholds={f"topic:{topic}": {"max.compaction.lag.ms": HOUR}})
    overdue_segment(cluster, s, topic)
    slow_s = 30.0  # the batch the signals meet: the second one does not wait for it
    proc, marker, log = start(s, tmp_path, slow_s=slow_s)
    try:
        wait_for(marker, proc)
        started = tree(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        # the second signal once the first was taken (two before the handler runs are one to Python)
        deadline = time.monotonic() + 30
        while "SIGINT: stopping after the running batch" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.05)
        time.sleep(0.2)  # and the job at its next step: waiting in a Py4J call (the case that hid the signal)
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(60)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    errors = [ln for ln in log.read_text().splitlines() if ln.startswith("compactd: error:")]
    assert rc == 1 and took < slow_s / 2, (rc, took)
    assert errors == [
        "compactd: error: stopped by a second SIGINT before the running batch finished; "
        "the checkpoint replays it on the next start"
    ]
    assert wait_until_gone(started) == []
