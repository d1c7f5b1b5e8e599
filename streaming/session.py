"""The Spark session compactd runs in: local by default, any master by setting.

Executors import the installed `compactd` package (in local mode the Python workers run this interpreter, so
this virtualenv); nothing is put on PYTHONPATH. The Python data source is registered on every session.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from importlib import resources

from pyspark.sql import SparkSession

from compactd.errors import ExecutorsUnavailable
from compactd.streaming.kafka_source import KafkaSource


def quiet_log4j() -> str:
    """`-Dlog4j2.configurationFile=...` for compactd's one-line Spark logging (a file shipped in the package)."""
    path = resources.files(__package__ or "compactd.streaming").joinpath("log4j2.properties")
    return f"-Dlog4j2.configurationFile=file:{path}"


def submitted() -> bool:
    """Started by spark-submit (or pyspark's gateway with PYSPARK_SUBMIT_ARGS, as deploy/submit does): master,
    interpreters and shipped files come from there and compactd must not override them."""
    return "PYSPARK_GATEWAY_PORT" in os.environ or "PYSPARK_SUBMIT_ARGS" in os.environ


def spark_session(master: str = "local[2]", verbose: bool = False) -> SparkSession:
    """A session whose Python workers use this interpreter (local) or what spark-submit ships (a cluster);
    `verbose` keeps Spark's own logging."""
    builder = SparkSession.builder
    if not submitted():
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        builder = builder.master(master).appName("compactd")
    builder = (
        builder.config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    if not verbose:
        builder = builder.config("spark.driver.extraJavaOptions", quiet_log4j())
        # py4j logs every exception raised in foreachBatch with its traceback; compactd reports it once
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if not verbose else "INFO")
    spark.dataSource.register(KafkaSource)
    return spark


def _where_compactd_is(_: int) -> tuple[str, str]:
    import compactd

    return compactd.__version__, os.path.dirname(compactd.__file__ or "")


def check_executors(spark: SparkSession, timeout_s: float) -> list[str]:
    """One tiny task per default-parallelism slot: every executor imports compactd, the same version as the driver.
    Returns where executors found it. A cluster with no free executor or without the shipped environment fails here,
    in `timeout_s`, with one line, instead of a stream that never makes progress."""
    import compactd

    sc = spark.sparkContext
    slots = max(1, sc.defaultParallelism)
    result: list[tuple[str, str]] = []
    error: list[BaseException] = []

    def probe() -> None:
        try:
            sc.setJobGroup("compactd-executor-check", "compactd: do executors import compactd?", True)
            result.extend(sc.parallelize(range(slots), slots).map(_where_compactd_is).collect())
        except BaseException as e:  # reported below as one line
            error.append(e)

    worker = threading.Thread(target=probe, name="compactd-executor-check", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        sc.cancelJobGroup("compactd-executor-check")
        raise ExecutorsUnavailable(
            f"no Spark executor ran a task within {timeout_s:.0f} s: check that the cluster has workers with free "
            "cores and memory for this application (spark.executor.cores, spark.executor.memory)"
        )
    if error:
        text = str(error[0])
        missing = "ModuleNotFoundError" in text or "No module named" in text
        reason = "cannot import compactd" if missing else "failed a probe task"
        hint = "ship the environment with deploy/submit (spark.archives, spark.pyspark.python)"
        last = next((line.strip() for line in reversed(text.splitlines()) if "Error" in line), text[:200])
        raise ExecutorsUnavailable(f"Spark executors {reason} ({last}): {hint}")
    versions = {v for v, _ in result}
    if versions != {compactd.__version__}:
        raise ExecutorsUnavailable(
            f"executors run compactd {', '.join(sorted(versions))}, the driver {compactd.__version__}: "
            "resubmit with deploy/submit so both use the same wheel"
        )
    return sorted({where for _, where in result})
