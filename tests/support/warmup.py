"""Spark's class-data archive, written in the background while the suite starts.

Without the archive every JVM the suite starts costs about three times the CPU (`compactd.streaming.jvm_start`),
and the first JVM to start would write it only as it exits: a worker's session, at the end of the suite. So the
pytest process that runs the suite (xdist's controller, or pytest alone) starts `python -m
compactd.streaming.jvm_start` at once, and each test that starts Spark waits until it has finished; the tests that
start none run first meanwhile (`tests.support.ordering`). With the archive there already, it finishes at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

READY = "COMPACTD_TEST_SPARK_READY"  # the file that exists once the archive is written (or could not be)
WAIT_S = 300.0


def start() -> None:
    """In the suite's own process, before xdist starts its workers (they inherit READY)."""
    if READY in os.environ:
        return
    where = Path(tempfile.mkdtemp(prefix="compactd-warmup-"))
    ready = where / "ready"
    os.environ[READY] = str(ready)
    with open(where / "jvm_start.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "compactd.streaming.jvm_start"], stdout=log, stderr=subprocess.STDOUT
        )

    def finish() -> None:
        try:
            proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        finally:
            ready.touch()

    threading.Thread(target=finish, name="compactd-test-warmup", daemon=True).start()


def wait() -> None:
    """In whichever process runs a test that starts Spark: until the archive is written (at most WAIT_S)."""
    ready = os.environ.get(READY)
    until = time.monotonic() + WAIT_S
    while ready and not Path(ready).exists() and time.monotonic() < until:
        time.sleep(0.1)


def done() -> None:
    """In the suite's own process at its end: its log and marker go; a warm-up still running finishes on its own."""
    ready = os.environ.get(READY)
    if ready and Path(ready).exists():
        shutil.rmtree(Path(ready).parent, ignore_errors=True)
