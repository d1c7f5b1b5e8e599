"""A Spark standalone master and one worker on loopback, from the pyspark wheel (no Spark install needed).

The worker runs with a bare environment (no virtualenv, no PYTHONPATH, no PYSPARK_PYTHON): its executors can import
compactd only from what the application ships.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark

from compactd.local.servers import Service, free_port

SPARK_HOME = Path(pyspark.__file__).parent
# The master's and the worker's JVMs (SPARK_DAEMON_JAVA_OPTS) and the executors' (EXECUTOR_JAVA_OPTIONS, a
# `spark.executor.extraJavaOptions` the test submits with): the serial collector and the client compiler only, as the
# suite's brokers and local Spark run. Short-lived processes on two shared cores spend less CPU that way (the C2
# compiler's threads are most of a short JVM's CPU); peak throughput is not what they are for.
DAEMON_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
EXECUTOR_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def bare_env() -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "SPARK_HOME": str(SPARK_HOME)}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    env["SPARK_DAEMON_JAVA_OPTS"] = DAEMON_JAVA_OPTIONS
    return env


@dataclass
class Standalone:
    master_url: str
    master: Service
    worker: Service | None
    work_dir: Path

    def executor_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.work_dir.glob("app-*/*/stderr")))


def _wait_for(log: Path, text: str, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: {text!r} not in {log} within {timeout:.0f} s")


@contextlib.contextmanager
def standalone_cluster(workdir: Path, cores: int = 2, memory: str = "2g", worker: bool = True) -> Iterator[Standalone]:
    """A master and (unless `worker` is False) one worker registered with it."""
    workdir.mkdir(parents=True, exist_ok=True)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    env = bare_env()
    master_argv = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
    master = Service(
        "spark-master",
        [spark_class, *master_argv, "--webui-port", str(free_port())],
        port,
        workdir / "master.log",
        env=env,
    )
    service = None
    work_dir = workdir / "work"
    try:
        if not worker:
            yield Standalone(url, master, None, work_dir)
            return
        worker_port = free_port()
        worker_argv = [
            *("org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--port", str(worker_port)),
            *("--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir)),
        ]
        service = Service(
            "spark-worker",
            [spark_class, *worker_argv],
            worker_port,
            workdir / "worker.log",
            env=env,
        )
        _wait_for(workdir / "master.log", "Registering worker", "the worker joins the master")
        yield Standalone(url, master, service, work_dir)
    finally:
        if service is not None:
            service.stop()
        master.stop()
