"""The compaction tasks of one JVM hold at most one budget of bytes together: in local mode they run in the driver, and
a bound per task (250k winners with their values, or a quarter of the heap for a map) let two tasks over 2 KB values
exceed a 1 GiB heap; the JVM died with the stream and the trigger started the same run again.

Small scale, the same rule, on the real broker and a real Spark: two partitions of KEYS distinct keys with 2 KB values
(each within the one-pass path's record count), read by two concurrent tasks in a Spark whose driver has HEAP of heap
(Spark's minimum is 450 MiB). Together their winners are most of that heap: the run must finish, each partition
whole, while the bytes the tasks held together stayed within one budget. The full size (2 partitions x 240k keys, a
1 GiB driver): `COMPACTD_BENCH_BIG_KEYS=480000 COMPACTD_BENCH_BIG_PARTITIONS=2 COMPACTD_BENCH_VALUE_BYTES=2048
python bench/compaction.py` (its part 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.spark

HEAP = "512m"
KEYS, VALUE = 80_000, 2048  # per partition: 164 MB of values, 328 MB for the two tasks


def test_two_tasks_over_large_values_share_one_byte_budget_in_a_small_driver(cluster: Any) -> None:
    topic = cluster.name(f"mem{uuid.uuid4().hex[:6]}")
    cluster.create(topic, 2)
    cluster.create(f"{topic}.compacted", 2)
    value = os.urandom(VALUE)  # incompressible, as stored
    for p in range(2):
        for i in range(KEYS):
            while True:
                try:
                    cluster.producer.produce(topic, key=b"k%07d" % i, value=value, partition=p)
                    break
                except BufferError:
                    cluster.producer.poll(0.1)
    cluster.flush()
    assert [cluster.watermarks(topic, p)[1] for p in range(2)] == [KEYS, KEYS]

    env = {**os.environ, "SPARK_DRIVER_MEMORY": HEAP}
    argv = [sys.executable, "-m", "tests.support.memory_run", cluster.conn.bootstrap_servers, topic, "2", str(KEYS)]
    child = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = child.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {"error": child.stderr[-2000:]}
    assert child.returncode == 0, out  # Spark's JVM exits 52 on an OutOfMemoryError
    got = sorted((r["partition"], r["records_in"], r["written"]) for r in out["reports"])
    assert got == [(0, KEYS, KEYS), (1, KEYS, KEYS)]
    assert out["budget"] <= out["heap"] // 4  # one budget for the JVM, whatever a task's setting says
    assert 0 < out["peak"] <= out["budget"], out  # both tasks' winners and maps, together, within it
    assert [cluster.watermarks(f"{topic}.compacted", p)[1] for p in range(2)] == [KEYS, KEYS]
