"""`kill -9` of a `compactd compact` process in the middle of its run (planned, about to start Spark): the previous
generation stays published and readable; the dead run's lease names a process of this host that is gone, so
`compact status` says the run died and the next run takes the lease over at once (before: it waited 69 s for the
lease to expire), publishes, and leaves the view topic holding exactly its generation.

(A run that dies after writing the view is in the property test, at every phase boundary; a real `kill -9` there
would start a second Spark JVM, the most expensive thing a test here can do.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from compactd.compaction.service import Compactor
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import CompactedReader, table
from tests.support.compaction import history, produce

LEASE_MS = 2_000


@pytest.mark.spark
def test_a_killed_run_leaves_the_previous_generation_and_the_next_run_takes_over_at_once(
    cluster, job_settings, redis_url, spark
) -> None:
    topic = cluster.name("killed")
    cluster.create(topic, 2)
    s = job_settings(compaction_lease_ms=LEASE_MS)
    layers = {"global": {"compaction.view.grace.ms": 0}}
    comp = Compactor(s, redis.Redis.from_url(redis_url), lambda: layers, lambda: spark)
    sent = produce(cluster, topic, history(seed=5, n=200, keys=30), partitions=2)
    assert comp.run(topic)["generation"] == 1
    first = comp.log.read(topic)
    assert first is not None
    more = produce(cluster, topic, history(seed=6, n=100, keys=30, start_ts=5_000), partitions=2)

    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
    env.update(
        COMPACTD_BOOTSTRAP_SERVERS=cluster.bootstrap,
        COMPACTD_REDIS_URL=redis_url,
        COMPACTD_TOPICS__COMPACTIONS=s.topics.compactions,
        COMPACTD_COMPACTION_LEASE_MS=str(LEASE_MS),
        COMPACTD_THRESHOLDS='{"global": {"compaction.view.grace.ms": 0}}',
    )
    cmd = [sys.executable, "-m", "tests.support.crashing_compaction", "planned", "compact", topic]
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert comp.state.lease_holder(topic) is not None  # the dead run still holds the topic
    assert comp.log.read(topic) == first  # not published: readers still get generation 1
    reader = CompactedReader(comp.conn, s.topics.compactions)
    got: dict[int, list] = {0: [], 1: []}
    for p, rec in reader.partition_records(topic, table_mode=True):
        got[p].append((rec.offset, rec.key, rec.value))
    for p in (0, 1):
        assert got[p] == [(r.offset, r.key, r.value) for r in table(sent[p] + more[p], Strategy())]

    # the lease names a process of this host that is gone: status says so, and the next run takes over at once
    status = comp.status(topic)
    assert (status["status"], status["generation"]) == ("ERROR", 1), status
    assert "is gone" in status["error"]
    out = comp.run(topic)
    assert out["generation"] == 2
    second = comp.log.read(topic)
    assert second is not None
    for p in (0, 1):
        pv = second.partitions[str(p)]
        assert cluster.watermarks(second.view, p) == (pv.view_start, pv.view_end)  # the dead run's range is gone
