"""kill -9 inside a batch, restart from the same checkpoint: same state, no duplicated or unsafe action."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from compactd.daemon.application import Application
from tests.support.fixtures import dump_redis

pytestmark = pytest.mark.spark
HOUR = 3_600_000


def run_cli(config: Path, log: Path, fault: str | None = None, env: dict[str, str] | None = None) -> int:
    """`compactd run --once` in a subprocess; with `fault`, killed with SIGKILL at that point of that batch."""
    prefix = ["-m", "tests.support.crashing_run", fault] if fault else ["-m", "compactd"]
    root = Path(__file__).resolve().parents[2]  # the crash wrapper lives with the tests
    with open(log, "ab") as out:
        cmd = [sys.executable, *prefix, "run", "--once", "--config", str(config)]
        return subprocess.run(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300).returncode


def merge_state(r: redis.Redis, prefix: str) -> dict:
    """Everything merged from events, minus bookkeeping that legitimately differs between runs (the state epoch is
    random, the gate's time is the run's)."""
    return {
        key.decode().removeprefix(prefix): value
        for key, value in dump_redis(r, f"{prefix}:{{*").items()
        if not key.endswith(b":applied") and b"{act}" not in key and b"{sched}" not in key and b"{state}" not in key
    }


def essence(actions: list[dict]) -> list[tuple]:
    return sorted((a["action"], a["topic"], a["partition"], a["reason"], a.get("before_offset")) for a in actions)


# Each kill point is a job process killed with -9 (15-20 CPU-s each, of `make test`'s 5 minutes). `make test` kills
# the job after batch 2 merged and enqueued its actions, before it sent them: the restart merges the batch again
# (idempotent merge) and carries out what the outbox holds once (idempotent actions). `make soak` kills it first after
# batch 1's merge too.
@pytest.mark.parametrize(
    "faults",
    [
        pytest.param(("after_enqueue:2",), id="one-kill"),
        pytest.param(("after_merge:1", "after_enqueue:2"), marks=pytest.mark.soak, id="two-kills"),
    ],
)
def test_kill_9_mid_batch_then_restart_matches_crash_free_run(
    spark, cluster, job_settings, rclient, tmp_path, faults: tuple[str, ...]
) -> None:
    now = int(time.time() * 1000)
    orders, ctopic = cluster.name("orders"), cluster.name("ctopic")
    cluster.create(orders, 2, {"cleanup.policy": "delete"})
    cluster.create(ctopic, 1, {"cleanup.policy": "compact"})
    cluster.fill(orders, 400, partition=0)
    cluster.fill(orders, 400, partition=1)
    thresholds = {
        "global": {"dry.run": False},
        f"topic:{orders}": {"consumed.retention.ms": HOUR, "forced.retention.ms": 5 * HOUR},
        f"topic:{ctopic}": {"max.compaction.lag.ms": HOUR, "compaction.nudge": "segment.ms"},
    }
    common = {"max_rows_per_trigger": 5, "thresholds": thresholds}
    crash = job_settings(redis_prefix="crash", checkpoint_dir=str(tmp_path / "crash"), **common)
    seg, com = crash.topics.segments, crash.topics.commits
    events = []
    for p in (0, 1):
        for i, age in enumerate((6 * HOUR, 3 * HOUR, 2 * HOUR, 1000)):
            events.append(
                {
                    "type": "segment_rolled",
                    "topic": orders,
                    "partition": p,
                    "base_offset": i * 100,
                    "end_offset": (i + 1) * 100,
                    "first_batch_max_ts": now - age,
                    "size_bytes": 1,
                    "ts": now - age,
                }
            )
    events.append(
        {
            "type": "segment_rolled",
            "topic": ctopic,
            "partition": 0,
            "base_offset": 0,
            "end_offset": 10,
            "first_batch_max_ts": now - 2 * HOUR,
            "size_bytes": 1,
            "ts": now - 2 * HOUR,
        }
    )
    cluster.send(seg, events)
    cluster.send(
        com,
        [
            {"type": "offset_commit", "group": "a", "topic": orders, "partition": 0, "offset": 250, "ts": now},
            {"type": "offset_commit", "group": "b", "topic": orders, "partition": 0, "offset": 390, "ts": now},
            {"type": "offset_commit", "group": "a", "topic": orders, "partition": 1, "offset": 150, "ts": now},
            {"type": "offset_delete", "group": "b", "topic": orders, "partition": 0, "ts": now},
            {"type": "offset_commit", "group": "b", "topic": orders, "partition": 0, "offset": 300, "ts": now},
        ],
    )

    # Reference: the same input, no crash, dry run (the broker is left for the crash run to act on).
    ref = job_settings(
        redis_prefix="ref",
        checkpoint_dir=str(tmp_path / "ref"),
        **{**common, "thresholds": {**thresholds, "global": {"dry.run": True}}},
    )
    ref.topics.actions = cluster.name("ref-actions")
    with Application(ref, spark=spark) as job:
        job.run(once=True)

    config = tmp_path / "crash.yaml"
    config.write_text(yaml.safe_dump(crash.model_dump(mode="json")))
    log = tmp_path / "crash.log"
    for fault in faults:
        assert run_cli(config, log, fault=fault) == -9, log.read_text()[-3000:]
    assert run_cli(config, log) == 0, log.read_text()[-3000:]

    merged = merge_state(rclient, crash.key_prefix)
    assert merged and merged == merge_state(rclient, ref.key_prefix)
    got = cluster.read_all(crash.topics.actions)
    assert len({a["id"] for a in got}) == len(got), "an action was carried out twice"
    assert essence(got) == essence(cluster.read_all(ref.topics.actions))
    # safety: consumed retention never passes the minimum committed offset (p0: min(a=250, b=300); p1: a=150)
    deletes = {a["partition"]: a for a in got if a["action"] == "delete_records"}
    assert (deletes[0]["before_offset"], deletes[0]["reason"]) == (200, "consumed_retention")
    assert (deletes[1]["before_offset"], deletes[1]["reason"]) == (100, "forced_retention")
    assert all(a["status"] == "sent" for a in got)
    assert cluster.watermarks(orders, 0)[0] == 200 and cluster.watermarks(orders, 1)[0] == 100
