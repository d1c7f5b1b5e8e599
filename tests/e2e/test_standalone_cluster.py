"""compactd on a real multi-process Spark: a standalone master and worker on loopback, the job submitted with
`deploy/submit` exactly as docs/deploying.md says. The worker has no virtualenv and no PYTHONPATH:
its executors import compactd only from the environment deploy/submit packs and ships."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from compactd.control.slices import slice_of
from tests.support import processes
from tests.support.spark_standalone import EXECUTOR_JAVA_OPTIONS, standalone_cluster

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
HOUR = 3_600_000
# `make soak` runs the core scenario with evaluation_slices=2 on two executors (`make test` does not: a second
# executor's JVM at the suite's busiest moment made other tests' local Spark fail to start Python workers)
SLICES = int(os.environ.get("COMPACTD_STANDALONE_SLICES", "0"))


def segment(topic: str, base: int, end: int, first_ts: int, ts: int) -> dict:
    return {
        "type": "segment_rolled",
        "topic": topic,
        "partition": 0,
        "base_offset": base,
        "end_offset": end,
        "first_batch_max_ts": first_ts,
        "size_bytes": 10,
        "ts": ts,
    }


@pytest.mark.soak  # 60-110 s and 75-160 CPU-s, a third of them packing the environment: too much for make test
def test_deploy_submit_runs_the_core_scenario_on_a_standalone_cluster(cluster, job_settings, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    orders, ctopic = cluster.name("orders"), cluster.name("ctopic")
    if SLICES:  # the two topics in different slices, so that each executor's task has a partition to merge
        names = (cluster.name(f"ctopic{i}") for i in range(100))
        ctopic = next(t for t in names if slice_of(t, SLICES) != slice_of(orders, SLICES))
    cluster.create(orders, 1, {"cleanup.policy": "delete"})
    cluster.create(ctopic, 1, {"cleanup.policy": "compact"})
    cluster.fill(orders, 3000)
    settings = job_settings(
        thresholds={
            "global": {"dry.run": False},
            f"topic:{orders}": {"consumed.retention.ms": HOUR},
            f"topic:{ctopic}": {"max.compaction.lag.ms": HOUR},
        },
        evaluation_slices=SLICES,
    )
    cluster.send(
        settings.topics.segments,
        [
            segment(orders, 0, 1000, now - 3 * HOUR, now - 2 * HOUR),
            segment(orders, 1000, 2000, now - 2 * HOUR, now - 90 * 60_000),
            segment(orders, 2000, 3000, now - HOUR, now - 60_000),
            segment(ctopic, 0, 100, now - 2 * HOUR, now - HOUR),
        ],
    )
    cluster.send_raw(settings.topics.segments, b'{"type": "segment_rolled", "topic": ', b"bad")
    cluster.send(
        settings.topics.commits,
        [
            {"type": "offset_commit", "group": "billing", "topic": orders, "partition": 0, "offset": 1500, "ts": now},
            {"type": "offset_commit", "group": "analytics", "topic": orders, "partition": 0, "offset": 2500, "ts": now},
        ],
    )
    cluster.flush()
    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYTHON"] = sys.executable  # the interpreter deploy/submit runs with and builds the shipped environment from
    log = tmp_path / "submit.log"

    def expected_output() -> bool:
        done = {(a["action"], a["status"]) for a in cluster.read_all(settings.topics.actions)}
        return {("delete_records", "sent"), ("compact", "sent")} <= done and bool(cluster.read_all(settings.topics.dlq))

    with standalone_cluster(tmp_path / "spark") as spark:
        started = time.monotonic()
        # the continuous job, as deployed; in a session of its own, like a service: the test is not in its group
        proc = subprocess.Popen(
            [
                *(str(ROOT / "deploy" / "submit"), "--master", spark.master_url, "--config", str(config)),
                *("--conf", f"spark.executor.extraJavaOptions={EXECUTOR_JAVA_OPTIONS}"),
                *(("--conf", "spark.executor.cores=1") if SLICES else ()),  # two executors on the worker's two cores
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
            env=env,
            start_new_session=True,
        )
        try:
            deadline, first_action = started + 900, None
            while not expected_output():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(1)
                if first_action is None and cluster.read_all(settings.topics.actions):
                    first_action = time.monotonic() - started
            driver = processes.tree(proc.pid)  # deploy/submit became the driver; Spark's JVM is its child
            os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as `kill -TERM -- -PGID` or `timeout` do
            rc = proc.wait(120)
        finally:
            proc.kill()
        executor_logs = spark.executor_logs()
    stderr = log.read_text()
    assert rc == 0, stderr[-3000:]
    assert "SIGTERM: stopping after the running batch" in stderr and "compactd: error" not in stderr, stderr[-3000:]
    assert processes.wait_until_gone(driver) == []  # nothing the driver started outlives it

    # executors imported compactd from the archive the worker unpacked into the application's directory
    shipped = [line for line in stderr.splitlines() if "executors import compactd" in line]
    assert shipped and f"{spark.work_dir}/app-" in shipped[0] and "/environment/" in shipped[0], stderr[-3000:]
    assert "Traceback" not in executor_logs
    if SLICES:  # each task merged and planned its slice of the topics, and the driver logged what each did
        slices = [line for line in stderr.splitlines() if f"per-topic work in {SLICES} tasks" in line]
        assert slices and all(line.count(" merged ") == SLICES for line in slices), stderr[-3000:]
        # the first batch has both topics' segments: each task merged a partition, in a Python worker of its own
        tasks = re.findall(r"(\S+) merged (\d+)", slices[0].split(" tasks: ", 1)[1])
        assert [int(n) for _, n in tasks] == [1, 1] and len({w for w, _ in tasks}) == 2, slices[0]
        print(slices[0])

    actions = {a["action"]: a for a in cluster.read_all(settings.topics.actions)}
    delete = actions["delete_records"]
    assert (delete["topic"], delete["before_offset"], delete["status"]) == (orders, 1000, "sent")
    compact = actions["compact"]
    assert (compact["topic"], compact["reason"], compact["status"]) == (ctopic, "max_compaction_lag", "sent")
    assert cluster.watermarks(orders) == (1000, 3000)
    dlq = cluster.read_all(settings.topics.dlq)
    assert [d["reason"] for d in dlq] == ["malformed_json"], json.dumps(dlq)[:500]
    print(f"submit-to-first-action {first_action:.1f} s" if first_action else "no action seen while running")


def test_a_cluster_without_free_executors_fails_in_seconds_with_one_line(cluster, job_settings, tmp_path: Path) -> None:
    with standalone_cluster(tmp_path / "spark", worker=False) as spark:
        settings = job_settings(spark_master=spark.master_url, executor_check_timeout_ms=5_000)
        cluster.create(settings.topics.segments)
        cluster.send_raw(settings.topics.segments, b"{}", b"k")  # something to read: `run --once` starts Spark
        cluster.flush()
        config = tmp_path / "compactd.yaml"
        config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "compactd", "run", "--once", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "no Spark executor ran a task within 5 s" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and took < 60
