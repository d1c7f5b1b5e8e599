"""`compactd compact TOPIC`, `compactd compact status TOPIC`, `compactd read TOPIC --compacted [--table]`."""

from __future__ import annotations

import json
import sys
from typing import Any

from compactd.app.progress import SparkTasks, progress
from compactd.errors import UsageError
from compactd.settings import Settings


def compactor(settings: Settings, spark: Any = None) -> tuple[Any, Any]:
    """A Compactor over this cluster's Redis and config layers (the job's applied config events included); Spark
    starts only when a run needs it. On a local master the run's JVM tasks go to Spark's JVM launched without its
    context (compaction/local_tasks.py), which is built on that JVM only for a run that needs Spark's shuffle.
    Returns (compactor, a close callable)."""
    from pyspark.sql import SparkSession

    from compactd.compaction.local_tasks import LocalTasks, local_threads
    from compactd.compaction.service import Compactor
    from compactd.kafka.admin import check_reachable
    from compactd.policy.runtime_config import AppliedLayer, effective_layers
    from compactd.streaming.session import spark_jvm, stop_jvm, submitted

    state = settings.redis_state()
    state.start()
    check_reachable(settings.kafka_connection())  # a broker away: one line naming the setting, within seconds
    session: list[Any] = [spark] if spark is not None else []
    owned: list[bool] = []  # whether this command started the session (and so stops it)

    def layers() -> dict[str, dict[str, Any]]:
        applied = {s: AppliedLayer.from_json(v) for s, v in state.config_layers().items()}
        return effective_layers(settings.thresholds, applied)

    threads = local_threads(settings.spark_master)
    own_jvm = spark is None and threads is not None and not submitted() and SparkSession.getActiveSession() is None

    def get_tasks() -> LocalTasks:
        assert threads is not None
        if session:  # the context is up already (an earlier run needed Spark): its JVM runs them as well
            return LocalTasks(session[0].sparkContext._gateway, threads)
        return LocalTasks(spark_jvm(settings.spark_master), threads)

    def get_spark() -> Any:
        if not session:
            from compactd.streaming.session import spark_session

            active = SparkSession.getActiveSession()  # called from a process that has one: use it, leave it
            session.append(active if active is not None else spark_session(settings.spark_master))
            owned.append(active is None)
        return session[0]

    def close() -> None:
        comp.close()
        if session and any(owned):
            from compactd.streaming.session import stop_spark

            stop_spark(session[0])
        stop_jvm()  # a JVM launched for the tasks alone, no context built on it
        state.close()

    comp = Compactor(settings, state.r, layers, get_spark, tasks=get_tasks if own_jvm else None)
    return comp, close


def compact(
    settings: Settings,
    topic: str,
    strategy: str | None,
    header: str | None,
    accept_gap: bool = False,
    rebuild: bool = False,
) -> int:
    from compactd.compaction.service import Overrides, RunOptions

    if strategy is not None and strategy not in ("offset", "timestamp", "header"):
        raise UsageError(f"--strategy {strategy}: choose offset, timestamp or header")
    comp, close = compactor(settings)
    try:
        with progress(f"compact {topic}") as bar:
            tasks = SparkTasks(bar)  # the Spark job runs between "planned" and "written"
            steps = {"written": "checking the view", "checked": "publishing the generation", "published": "published"}

            def on_phase(phase: str) -> None:
                if phase == "planned":
                    bar.phase("reading, reducing, writing the view")
                    tasks.start()
                    return
                tasks.stop()
                bar.phase(steps.get(phase, phase))

            bar.phase("planning")
            try:
                summary = comp.run(
                    topic, Overrides(strategy, header), on_phase=on_phase, options=RunOptions(accept_gap, rebuild)
                )
            finally:
                tasks.stop()  # before close() stops Spark under the poller
    finally:
        close()
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 0


def compact_status(settings: Settings, topic: str) -> int:
    comp, close = compactor(settings)
    try:
        print(json.dumps(comp.status(topic), sort_keys=True), flush=True)
    finally:
        close()
    return 0


def read_compacted(settings: Settings, topic: str, table: bool) -> int:
    from compactd.compaction.view import CompactedReader, json_line
    from compactd.kafka.admin import check_reachable

    check_reachable(settings.kafka_connection())
    reader = CompactedReader(settings.kafka_connection(), settings.topics.compactions)
    out = sys.stdout
    with progress(f"read {topic}") as bar:
        if not bar.enabled:  # the plain loop: no per-record cost when nobody watches
            for partition, rec in reader.partition_records(topic, table_mode=table):
                out.write(json_line(partition, rec) + "\n")
        else:
            bar.phase("reading the view" + (" as a table" if table else ""))
            count = reader.cluster.partitions(topic) or 0  # None: the read below names the missing topic
            shown = -1
            for records, (partition, rec) in enumerate(reader.partition_records(topic, table_mode=table), 1):
                out.write(json_line(partition, rec) + "\n")
                if partition != shown or records % 1024 == 0:  # a redraw per record would cost more than the read
                    shown = partition
                    bar.advance(partition + 1, count or None, f"partition {partition + 1}/{count}, {records} records")
    out.flush()
    return 0
