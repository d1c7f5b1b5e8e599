"""One compaction run in the JVM (`spark_run.run_in_jvm`) in a Spark of its own, whose driver heap comes from
SPARK_DRIVER_MEMORY (read by spark-submit when the JVM starts): what a test needs to see a run's memory in a small
driver, where an OutOfMemoryError kills the JVM and would take the test's own session with it.

Usage: python -m tests.support.memory_run BOOTSTRAP TOPIC PARTITIONS END
Reads offsets [0, END) of every partition of TOPIC into TOPIC.compacted with the settings' defaults; prints one JSON
line: the reports, the JVM's heap and the compaction tasks' budget and peak held bytes; or, when the run fails, the
error and the JVM's exit status if it died (Spark exits 52 on an OutOfMemoryError).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from compactd.compaction.spark_run import ReadRange, RunInput, WriteSpec, run_in_jvm
from compactd.kafka.config import KafkaConnection
from compactd.streaming import session
from compactd.streaming.connector import java_options


def run(spark: Any, bootstrap: str, topic: str, partitions: int, end: int) -> dict[str, Any]:
    spec = WriteSpec({}, {}, f"{topic}.compacted", 1_800_000_000_000, 0, java_options(KafkaConnection(bootstrap)))
    ranges = [ReadRange(topic, p, 0, end, False) for p in range(partitions)]
    reports = run_in_jvm(spark, {}, RunInput(ranges, {"kind": "offset"}, False, partitions), spec)
    jvm = spark.sparkContext._jvm
    task = jvm.io.compactd.compaction.ViewRun
    return {
        "reports": reports,
        "heap": jvm.java.lang.Runtime.getRuntime().maxMemory(),
        "budget": task.budgetBytes(),
        "peak": task.peakHeldBytes(),
    }


if __name__ == "__main__":
    bootstrap, topic, partitions, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    spark = session.spark_session("local[2]")
    jvm_proc = session._launched.proc if session._launched is not None else None
    try:
        out = run(spark, bootstrap, topic, partitions, end)
    except Exception as exc:  # reported as the child's one line
        deadline = time.monotonic() + 30
        while jvm_proc is not None and jvm_proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        code = jvm_proc.poll() if jvm_proc is not None else None
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:300]}", "jvm_exit": code}), flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)
    session.stop_spark(spark)
