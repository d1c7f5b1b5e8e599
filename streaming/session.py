"""The Spark session compactd runs in: local by default, any master by setting.

Executors import the installed `compactd` package (in local mode the Python workers run this interpreter, so
this virtualenv); nothing is put on PYTHONPATH. The Python data source is registered on every session.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib import resources

from pyspark.sql import SparkSession

from compactd.streaming.kafka_source import KafkaSource


def quiet_log4j() -> str:
    """`-Dlog4j2.configurationFile=...` for compactd's one-line Spark logging (a file shipped in the package)."""
    path = resources.files(__package__ or "compactd.streaming").joinpath("log4j2.properties")
    return f"-Dlog4j2.configurationFile=file:{path}"


def spark_session(master: str = "local[2]", verbose: bool = False) -> SparkSession:
    """A session whose Python workers use this interpreter; `verbose` keeps Spark's own logging."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("compactd")
        .config("spark.sql.shuffle.partitions", "4")
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
