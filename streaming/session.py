"""The Spark session compactd runs in: local by default, any master by setting.

Executors import the installed `compactd` package (in local mode the Python workers run this interpreter, so
this virtualenv); nothing is put on PYTHONPATH. Spark's Kafka connector comes as local jars (`connector`).

Spark's JVM is started in a session (and process group) of its own: a signal to the driver's process group — Ctrl-C,
`kill -TERM -- -PGID`, `timeout`, supervisord's `stopasgroup` — reaches only the driver, whose graceful stop needs
the JVM until it has finished. The JVM still ends with the driver: it exits when its stdin (a pipe from the driver)
closes, and `stop_spark` stops it, waits for it and its Python workers, and kills what outlives the budget.
What makes the start cheap (the class-data archive, the Spark home the workers see) is in `jvm_start`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from compactd.errors import ExecutorsUnavailable
from compactd.streaming import connector
from compactd.streaming.jvm_start import class_data_sharing, keep_archive, spark_home_for_workers

log = logging.getLogger("compactd.spark")

# JVM options of the driver (in local mode, the executor too). Its JIT is the JVM's default (C1 then C2): the JVM
# reads Kafka since the connector replaced compactd's Python source, and C2 reads 2M records in 1.9 s where C1 alone
# took 3.3 s (+14-16 % events/s through `run --once`), for 1.2-2.0 s more from start to first batch
# (docs/benchmarks.md). COMPACTD_SPARK_JVM_OPTIONS adds options (the test suite's short-lived jobs: C1 only).
_EXTRA_JAVA_OPTIONS = tuple(os.environ.get("COMPACTD_SPARK_JVM_OPTIONS", "").split())
# The parallel collector, unless those options name one: a micro-batch allocates a row or more per record and keeps
# almost nothing, and G1's concurrent threads took 0.3-0.5 of the 2.4-3.1 CPU-seconds a 1M-record batch cost on two
# cores, where the parallel collector took 0.06-0.3: 8-13 % more events/s through repeated `run --once` rounds
# (docs/benchmarks.md). Its pauses on the driver's 1 GiB heap stay far below the trigger.
DRIVER_JAVA_OPTIONS = (
    _EXTRA_JAVA_OPTIONS
    if any(o.startswith("-XX:+Use") and o.endswith("GC") for o in _EXTRA_JAVA_OPTIONS)
    else ("-XX:+UseParallelGC", *_EXTRA_JAVA_OPTIONS)
)
ARCHIVE_DUMP_S = 60.0  # how long the first run's JVM may take to write its class-data archive as it exits


@dataclass
class _Launched:
    """The JVM this process launched, the py4j gateway to it, and the class-data archive it writes at exit."""

    gateway: Any
    proc: subprocess.Popen
    archive: tuple[Path, Path] | None  # (written at exit, where it goes once the JVM exited cleanly)


_launched: _Launched | None = None  # None when there is none, or when spark-submit owns it
# A JVM launched by `spark_jvm` before any SparkContext: (its gateway, the conf it was launched with), until
# `spark_session` builds the context on it
_jvm_only: tuple[Any, SparkConf] | None = None


def quiet_log4j() -> str:
    """`-Dlog4j2.configurationFile=...` for compactd's one-line Spark logging (a file shipped in the package)."""
    path = resources.files(__package__ or "compactd.streaming").joinpath("log4j2.properties")
    return f"-Dlog4j2.configurationFile=file:{path}"


def submitted() -> bool:
    """Started by spark-submit (or pyspark's gateway with PYSPARK_SUBMIT_ARGS, as deploy/submit does): master,
    interpreters and shipped files come from there and compactd must not override them."""
    return "PYSPARK_GATEWAY_PORT" in os.environ or "PYSPARK_SUBMIT_ARGS" in os.environ


def spark_options(master: str = "local[2]", verbose: bool = False) -> dict[str, str]:
    """What compactd sets on every session (master and name only when spark-submit does not set them)."""
    options = {
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # compaction runs share the session's executors with the stream: fair pools, not first come first served
        "spark.scheduler.mode": "FAIR",
        # the Kafka rows a decode task gets from the JVM per Arrow batch (10,000 by default: a fixed cost per batch)
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
        **connector.SESSION_CONF,
    }
    if not submitted():  # spark-submit gets the connector's jars with --jars (deploy/submit)
        jars = ",".join(str(p) for p in connector.connector_jars())
        options |= {"spark.master": master, "spark.app.name": "compactd", "spark.jars": jars}
    options["spark.driver.extraJavaOptions"] = " ".join([*DRIVER_JAVA_OPTIONS, *([] if verbose else [quiet_log4j()])])
    return options


def spark_session(master: str = "local[2]", verbose: bool = False) -> SparkSession:
    """A session whose Python workers use this interpreter (local) or what spark-submit ships (a cluster);
    `verbose` keeps Spark's own logging. Launches Spark's JVM in a session of its own (see the module's doc) unless
    this process already has one; keeps the process's SIGINT handler (pyspark installs its own, which cancels jobs
    and raises KeyboardInterrupt: Ctrl-C must stop compactd gracefully instead)."""
    global _launched
    if not submitted():
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not verbose:
        # py4j logs every exception raised in foreachBatch with its traceback; compactd reports it once
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
    global _jvm_only
    options = spark_options(master, verbose)
    main = threading.current_thread() is threading.main_thread()
    on_sigint = signal.getsignal(signal.SIGINT) if main else None
    try:
        if _jvm_only is not None:  # `spark_jvm` launched it: the context on that JVM
            (gateway, conf), _jvm_only = _jvm_only, None
            SparkContext(conf=conf, gateway=gateway)
        elif SparkContext._gateway is None:  # no JVM in this process yet: start one, out of the driver's group
            gateway, conf, archive = _launch(options)
            proc = getattr(gateway, "proc", None)
            if proc is not None:
                _launched = _Launched(gateway, proc, archive)
            SparkContext(conf=conf, gateway=gateway)
        builder = SparkSession.builder
        for key, value in options.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    finally:
        if on_sigint is not None:
            signal.signal(signal.SIGINT, on_sigint)
    spark.sparkContext.setLogLevel("WARN" if not verbose else "INFO")
    if spark.sparkContext.master.startswith("local"):  # a cluster's executors are checked first (check_executors)
        warm_workers(spark)  # while the query starts
    return spark


def spark_jvm(master: str = "local[2]", verbose: bool = False) -> Any:
    """The py4j gateway to this process's Spark JVM, launched without a SparkContext if there is none yet: Spark's
    classes, the connector's and compactd's jars, no scheduler. A one-shot `compactd compact` runs its JVM tasks
    there (compaction/local_tasks.py) and builds the context (`spark_session`, on this same JVM) only for a run
    that needs Spark; the context's start was about 3 s of the CLI's 5.2 s of Spark. Its class-data archive is
    used when there is one, never written (it would hold this JVM's classes, not a context's). `stop_jvm` ends it
    when no session was built on it."""
    global _launched, _jvm_only
    if _jvm_only is not None:
        return _jvm_only[0]
    if SparkContext._gateway is not None:
        return SparkContext._gateway
    if not submitted():
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not verbose:
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
    main = threading.current_thread() is threading.main_thread()
    on_sigint = signal.getsignal(signal.SIGINT) if main else None
    try:
        gateway, conf, archive = _launch(spark_options(master, verbose), write_archive=False)
    finally:
        if on_sigint is not None:
            signal.signal(signal.SIGINT, on_sigint)
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        _launched = _Launched(gateway, proc, archive)
    _jvm_only = (gateway, conf)
    return gateway


def stop_jvm(timeout_s: float = 10.0) -> None:
    """End the JVM `spark_jvm` launched, if no session was built on it (`stop_spark` ends it otherwise)."""
    global _launched, _jvm_only
    if _jvm_only is None:
        return
    _jvm_only = None
    launched, _launched = _launched, None
    if launched is None:
        return
    with contextlib.suppress(Exception):
        launched.gateway.shutdown()
    end_session(launched.proc, timeout_s, linger_s=0.5)


def _launch(options: dict[str, str], write_archive: bool = True) -> tuple[Any, SparkConf, tuple[Path, Path] | None]:
    """Spark's JVM with `options`, in a session of its own: (py4j gateway, the conf it was launched with, the
    class-data archive it writes at exit; `write_archive` False: an existing one is used, none is written)."""
    conf = SparkConf().setAll(list(options.items()))
    home = None if submitted() else spark_home_for_workers()
    sharing, archive = ([], None) if submitted() else class_data_sharing(home, write=write_archive)
    if sharing:
        conf.set("spark.driver.extraJavaOptions", f"{options['spark.driver.extraJavaOptions']} {' '.join(sharing)}")
    try:
        return _gateway(conf, home), conf, archive
    except Exception:
        if not sharing:
            raise
    log.warning("Spark's JVM did not start with class data sharing (%s): starting it without", sharing[0])
    conf.set("spark.driver.extraJavaOptions", options["spark.driver.extraJavaOptions"])
    return _gateway(conf, home), conf, None


def _gateway(conf: SparkConf, home: Path | None) -> Any:
    """Spark's JVM in a session of its own, started from `home` (pyspark's when None), its stderr passed on by a
    thread that keeps its Python workers' tracebacks out (`forward_stderr`)."""
    before = os.environ.get("SPARK_HOME")
    if home is not None:
        os.environ["SPARK_HOME"] = str(home)  # what pyspark starts the JVM from, and the JVM's own SPARK_HOME
    try:
        gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True, "stderr": subprocess.PIPE})
    finally:
        if before is None:
            os.environ.pop("SPARK_HOME", None)
        else:
            os.environ["SPARK_HOME"] = before
    threading.Thread(
        target=forward_stderr, args=(gateway.proc.stderr, sys.stderr), daemon=True, name="compactd-spark-stderr"
    ).start()
    return gateway


_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# What the JVM and Spark print to stderr on every start, before any logging config applies: nothing an operator can
# act on, so it goes to the debug log (the incubator warning is the JVM's, for Spark's vector module; the log-level
# lines are Spark's shell hint).
JVM_CHATTER = (
    "WARNING: Using incubator modules:",
    "Setting default log level to ",
    "To adjust logging level use sc.setLogLevel(",
)


def forward_stderr(lines: Iterable[bytes], out: TextIO) -> None:
    """Pass on what Spark's JVM writes to stderr, except the tracebacks its Python workers print there (a task's
    failure, which compactd already says in one line) and the JVM's start-up chatter (JVM_CHATTER). Each traceback,
    chained ones included, and each chatter line go to the debug log instead."""
    block: list[str] = []
    state = "out"  # "in": frames until the exception line; "end": after it, where a chained traceback may follow
    for raw in lines:
        line = raw.decode(errors="replace")
        starts = line.startswith("Traceback (most recent call last):")
        if state == "end" and not (starts or not line.strip() or line.startswith(_CHAINED)):
            log.debug("a Spark Python worker's traceback:\n%s", "".join(block).rstrip())
            block, state = [], "out"
        if state == "out" and line.startswith(JVM_CHATTER):
            log.debug("Spark's JVM: %s", line.rstrip())
            continue
        if state == "out" and not starts:
            out.write(line)
            out.flush()
            continue
        block.append(line)
        if starts:
            state = "in"
        elif state == "in" and line[:1] not in (" ", "\t") and line.strip():
            state = "end"  # the exception line
    if block:
        log.debug("a Spark Python worker's traceback:\n%s", "".join(block).rstrip())


def stop_spark(spark: SparkSession, timeout_s: float = 10.0, graceful: bool = True) -> None:
    """Stop the session and, if this process launched it, Spark's JVM: close its stdin (the gateway server exits
    on EOF), wait up to `timeout_s` for it, then kill it and whatever of its session (Python workers) remains.
    `graceful=False` (a forced stop) kills the JVM at once without asking Spark anything."""
    global _launched
    launched, _launched = _launched, None
    if launched is not None and getattr(spark.sparkContext, "_gateway", None) is not launched.gateway:
        _launched, launched = launched, None  # another JVM's session: leave ours alone
    if graceful or launched is None:
        stopping = threading.Thread(target=_stop_session, args=(spark,), name="compactd-spark-stop", daemon=True)
        stopping.start()
        stopping.join(timeout_s)  # a JVM that does not answer is killed below instead
        if stopping.is_alive():
            log.warning("Spark's session did not stop within %.0fs", timeout_s)
    if launched is None:
        return
    if not graceful:
        _kill(launched.proc.pid)
    with contextlib.suppress(Exception):
        launched.gateway.shutdown()
    SparkContext._gateway = None  # type: ignore[assignment]
    SparkContext._jvm = None  # type: ignore[assignment]
    if launched.archive is not None and graceful:
        timeout_s = max(timeout_s, ARCHIVE_DUMP_S)  # the first run's JVM writes its class-data archive as it exits
    end_session(launched.proc, timeout_s, linger_s=2.0 if graceful else 0.0)
    if launched.archive is not None:
        keep_archive(*launched.archive, written=launched.proc.returncode == 0)


def _stop_session(spark: SparkSession) -> None:
    try:
        spark.stop()
    except Exception as exc:  # the JVM is gone already: nothing left to stop there
        log.debug("stopping Spark: %s", exc)


def end_session(proc: subprocess.Popen, timeout_s: float, linger_s: float = 2.0) -> None:
    """End a child started in a session of its own and everything in that session: close its stdin, give it
    `timeout_s` to exit (SIGKILL after), give what remains of its session `linger_s` to follow, SIGKILL the rest."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    if not _exited(proc.pid, timeout_s):
        log.warning("pid %d (%s) did not exit within %.0fs of the stop: killed", proc.pid, _name(proc), timeout_s)
        _kill(proc.pid)
        _exited(proc.pid, 5.0)
    # still unreaped, its pid names no other session: whatever is left in it was started by it
    leftovers = _session_members(proc.pid)
    deadline = time.monotonic() + linger_s
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = _session_members(proc.pid)
    for pid in leftovers:
        _kill(pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)


def _name(proc: subprocess.Popen) -> str:
    args = proc.args if isinstance(proc.args, (list, tuple)) else [proc.args]
    return os.path.basename(str(args[0])) if args else "?"


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _exited(pid: int, timeout_s: float) -> bool:
    """Whether the child `pid` exited within `timeout_s`, leaving it unreaped (its pid cannot be reused yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True  # reaped already
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _session_members(sid: int) -> list[int]:
    """Live processes (zombies excluded) of the session `sid`, from /proc; [] where there is no /proc."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == sid:
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != b"Z" and int(fields[3]) == sid:
                found.append(int(entry.name))
    return found


def _warm_worker(batches: Iterator[Any]) -> Iterator[Any]:
    """Runs in a Python worker before the first micro-batch: imports and first calls of what the decode tasks run
    (the decoder, pyarrow's kernels, librdkafka), so the worker Spark reuses for that batch has paid for them."""
    import confluent_kafka  # noqa: F401

    from compactd.streaming.decode import Decoder, reduce_table

    decoder = Decoder("segments", "commits")
    sample = b'{"type": "segment_rolled", "topic": "t", "partition": 0, "base_offset": 0, "end_offset": 1, '
    sample += b'"first_batch_max_ts": 0, "size_bytes": 0, "ts": 0}'
    reduce_table(decoder.table(decoder.segments_topic, 0, [0, 1], [None, None], [sample, b"{"]))
    yield from batches


def warm_workers(spark: SparkSession) -> threading.Thread:
    """Start Spark's Python workers, one per task slot, with what the decode tasks import, on a thread: while the
    query starts, the workers the first micro-batch reuses get ready, instead of starting in it
    (`spark.python.worker.reuse`, Spark's default). An Arrow map, like the decode: an RDD
    task's worker would be another pool (SQL workers run with other environment variables). Failures only cost the
    warm-up."""
    slots = max(1, spark.sparkContext.defaultParallelism)

    def run() -> None:
        try:
            spark.sparkContext.setJobGroup("compactd-warm-up", "compactd: Python workers before the first batch", True)
            spark.range(0, slots, 1, slots).mapInArrow(_warm_worker, "id long").collect()
        except Exception as exc:  # a stop while it runs, or a worker that cannot import: the batch will say so
            log.debug("warming Python workers: %s", (str(exc).splitlines() or [""])[0])

    thread = threading.Thread(target=run, name="compactd-warm-up", daemon=True)
    thread.start()
    return thread


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
