"""Spark gives the Python process behind compactd's streaming source 10 s to connect back. On a machine busy enough
to miss that, the query fails before reading anything: compactd starts it again from its checkpoint, says so on one
line, and the run's result is the same as on an idle machine. (`run --once` meets the same fault in
tests/e2e/test_crash.py, on its restart after the kills.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_graceful_stop import HOUR, overdue_segment

pytestmark = pytest.mark.spark


def slow_first_source_runner(tmp_path: Path) -> Path:
    """A Python for Spark's workers whose first streaming-source process starts 12 s late (then none is late)."""
    marker, wrapper = tmp_path / "delayed-once", tmp_path / "python"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'if [[ "$*" == *python_streaming_source_runner* && ! -e {marker} ]]; then touch {marker}; sleep 12; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def test_a_python_worker_too_slow_to_connect_back_restarts_the_query(cluster, job_settings, tmp_path: Path) -> None:
    topic = cluster.name("gdpr")
    settings = job_settings(thresholds={f"topic:{topic}": {"max.compaction.lag.ms": HOUR}})
    overdue_segment(cluster, settings, topic)
    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYSPARK_PYTHON"] = str(slow_first_source_runner(tmp_path))
    log = tmp_path / "job.log"
    cmd = [sys.executable, "-m", "compactd", "run", "--config", str(config)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True)
    try:  # the continuous job, stopped as a supervisor does once its first decision is out
        until = time.monotonic() + 180
        while not cluster.read_all(settings.topics.actions):
            assert proc.poll() is None and time.monotonic() < until, log.read_text()[-3000:]
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait(180)
    finally:
        proc.kill()
    stderr = log.read_text()
    assert rc == 0, stderr[-3000:]
    assert (tmp_path / "delayed-once").exists()  # the fault happened
    restarts = [line for line in stderr.splitlines() if "did not connect back" in line]
    assert len(restarts) == 1 and "query started again from its checkpoint (1 of 3)" in restarts[0], stderr
    assert "Traceback" not in stderr and "Py4J" not in stderr
    audit = cluster.read_all(settings.topics.actions)
    assert [(a["topic"], a["action"], a["status"]) for a in audit] == [(topic, "compact", "dry_run")]
