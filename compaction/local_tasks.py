"""The compaction's JVM tasks in this process's JVM, without Spark's scheduler: a one-shot `compactd compact` on a local
master.

Each task is one call of `ViewRun.java` (read whole partitions with Kafka's own consumer, keep each key's winner,
write them with its producer, report): nothing in it needs a SparkContext, only the classes on the JVM's class path.
Through the CLI, a run paid the context's start before its first read (5.2 s of Spark's start out of a 10.8-12.0 s
run of 2M records on this 2-core machine, bench/compaction.py). Here the JVM is Spark's own, launched with the same
jars and options (`streaming.session.spark_jvm`) but no context; the tasks run on as many threads as the local
master has cores, from as many Python threads (py4j gives each its own connection), under the same one budget per
JVM (`ViewRun.Budget`). The context is built on that same JVM only for a run that needs Spark: a partition whose keys
outgrow a task's map (`spark_run.shuffle_phases`).

The continuous job keeps running its runs as Spark jobs in its session: there the context is up already, and a
cluster's executors take the tasks."""

from __future__ import annotations

import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("compactd.compaction")
_LOCAL = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


def local_threads(master: str) -> int | None:
    """The task threads a local master runs (`local`: 1, `local[N]`: N, `local[*]`: the cores); None for another
    master (a cluster's executors run the tasks: Spark schedules them)."""
    m = _LOCAL.match(master.strip())
    if m is None:
        return None
    n = m.group(1)
    if n is None:
        return 1
    return os.cpu_count() or 1 if n == "*" else max(1, int(n))


class LocalTasks:
    """Runs `ViewRun` tasks on `threads` threads of the JVM behind `gateway`."""

    def __init__(self, gateway: Any, threads: int) -> None:
        self.gateway = gateway
        self.threads = threads

    def run(self, clients: str, tasks: list[str]) -> list[str]:
        """Each task's report (ViewRun's JSON), in the tasks' order. A task's failure raises py4j's error, whose
        text holds the task's own exception line (`streaming.job.root_cause` finds it) after the others ended."""
        run = self.gateway.jvm.io.compactd.compaction.ViewRun(clients)
        log.info("compaction: %d JVM tasks on %d threads, without Spark's scheduler", len(tasks), self.threads)
        with ThreadPoolExecutor(max_workers=max(1, min(self.threads, len(tasks))), thread_name_prefix="view-run") as ex:
            return list(ex.map(run.call, tasks))
