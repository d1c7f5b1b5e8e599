"""Redis loses its state under a running job: no delete passes a group's committed offset, the job rebuilds the
state from the sources and deletes resume once the rebuild has caught up.

Real Spark job (a `compactd run` process), real broker, a Redis server of the test's own that is killed and brought
back empty, then flushed. The groups live only in compactd's commits topic, so the cluster's own group offsets (the
send-time check) cannot help: only the state epoch can.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from compactd.local.servers import Service, free_port, redis_server

pytestmark = pytest.mark.spark
HOUR = 3_600_000


def segments(topic: str, now: int, n: int) -> list[dict]:
    return [
        {
            "type": "segment_rolled",
            "topic": topic,
            "partition": 0,
            "base_offset": i * 1000,
            "end_offset": (i + 1) * 1000,
            "first_batch_max_ts": now - 5 * HOUR,
            "size_bytes": 1000,
            "ts": now - 5 * HOUR,
        }
        for i in range(n)
    ]


def commit(group: str, topic: str, offset: int) -> dict:
    return {"type": "offset_commit", "group": group, "topic": topic, "partition": 0, "offset": offset, "ts": 0}


def wait_until(what: str, check, proc: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    until = time.monotonic() + timeout_s
    while not check():
        assert proc.poll() is None, f"the job exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()}"
        assert time.monotonic() < until, f"timed out waiting for {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def test_redis_restarted_empty_then_flushed_never_deletes_past_a_group(cluster, job_settings, tmp_path) -> None:
    port = free_port()
    server: Service = redis_server(tmp_path / "redis-1", port=port)
    url = f"redis://127.0.0.1:{port}/0"
    topic = cluster.name("clicks")
    g1, g2 = cluster.name("g1"), cluster.name("g2")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 4000)
    s = job_settings(
        redis_url=url,
        thresholds={"global": {"dry.run": False}, f"topic:{topic}": {"consumed.retention.ms": HOUR}},
    )
    seg, com = s.topics.segments, s.topics.commits
    for t in (seg, com):
        cluster.create(t)
    now = int(time.time() * 1000)
    cluster.send(seg, segments(topic, now, 4))
    cluster.send(com, [commit(g1, topic, 2500), commit(g2, topic, 1100)])

    config = tmp_path / "compactd.yaml"
    config.write_text(yaml.safe_dump(s.model_dump(mode="json")))
    log = tmp_path / "job.log"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "compactd", "run", "--config", str(config)],
        cwd=root,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    low = lambda: cluster.watermarks(topic)[0]  # noqa: E731
    rebuilt = lambda: log.read_text().count("state rebuilt from the sources")  # noqa: E731

    def decided(before: int) -> int:
        """Deletes decided before `before` and carried out (or found done already): the rebuilt state decides the
        delete the lost one had made again, so its second record shows the rebuilt state was evaluated."""
        return sum(
            a["action"] == "delete_records" and a["status"] == "sent" and a["before_offset"] == before
            for a in cluster.read_all(s.topics.actions)
        )

    try:
        wait_until("the first delete (g2 at 1100 allows [0, 1000))", lambda: low() == 1000, proc, log)

        # 1. Redis restarts without its data; the agent sends its segments again and g1 commits on
        server.proc.kill()
        server.proc.wait(10)
        time.sleep(2)  # the job meets the outage: it waits, it does not exit
        server = redis_server(tmp_path / "redis-2", port=port)
        cluster.send(seg, segments(topic, now, 4))
        cluster.send(com, [commit(g1, topic, 2600)])
        wait_until("the rebuilt state's decisions", lambda: decided(1000) >= 2 or low() != 1000, proc, log)
        assert low() == 1000, "deleted past g2's committed offset 1100"

        # 2. deletes resume once rebuilt: g2 reads on
        cluster.send(com, [commit(g2, topic, 2100)])
        wait_until("the delete g2's commit allows", lambda: low() == 2000, proc, log)

        # 3. FLUSHALL under the running job, then only g1 moves: the state that is left knows nothing of g2
        redis.Redis.from_url(url).flushall()
        cluster.send(com, [commit(g1, topic, 3900)])
        wait_until("the rebuilt state's decisions", lambda: decided(2000) >= 2 or low() != 2000, proc, log)
        assert low() == 2000, "deleted past g2's committed offset 2100"
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        finally:
            proc.kill()
            server.stop()

    text = log.read_text()
    deletes = [a for a in cluster.read_all(s.topics.actions) if a["action"] == "delete_records"]
    sent = [a["before_offset"] for a in deletes if a["status"] == "sent"]
    assert sent and max(sent) == 2000, deletes  # never past g2 (1100, then 2100)
    assert text.count("state lost:") == 2 and rebuilt() == 2, text
    assert text.count("Redis unreachable") == 1 and "Traceback" not in text, text
