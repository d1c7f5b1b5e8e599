"""Fixtures live in modules under tests/support; this file registers them, orders the collected tests, and has the
tests that start Spark wait for its class-data archive (tests/support/warmup.py)."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from compactd.gc_pause import collect_on_own_thread
from tests.support import warmup
from tests.support.ordering import reorder, starts_no_spark

pytest_plugins = ["tests.support.fixtures"]

# The suite's Spark JVMs (its session and every job it starts as a process) live seconds, not hours: C1 alone halves
# their start on two cores, where a long-running job gains from C2 (streaming/session.py); the serial collector
# takes another 5-10 % off (a session and one query: 9.6 CPU-s with C1, 8.9 with C1 and the serial collector).
os.environ.setdefault("COMPACTD_SPARK_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# No generated example has a time limit: hypothesis' default of 200 ms an example failed a unit property on a loaded
# machine (405 ms for one example, 0.07 ms when run again). What a test proves never depends on the machine's speed.
settings.register_profile("compactd", deadline=None)
settings.load_profile("compactd")


def pytest_configure(config: pytest.Config) -> None:
    # the tests make Kafka clients of their own too, before compactd makes one: the collector leaves librdkafka's
    # threads from the start (compactd/gc_pause.py; a worker died with SIGABRT in a 3-node teardown before it did)
    collect_on_own_thread()
    keep_client_crashes()
    if not hasattr(config, "workerinput") and not config.option.collectonly:  # the suite's own process, not a worker
        warmup.start()


CRASH_DIR = Path(tempfile.gettempdir()) / "compactd-test-crashes"


def keep_client_crashes() -> None:
    """librdkafka's last words before it aborts a process (its CRASH and FATAL lines, through compactd's logger) to a
    file of the worker's own, written as they come: pytest keeps a test's log in memory, which an abort loses with
    the worker. `make test` prints the files when the suite fails (a worker aborted twice in 3-node tests, its
    reason unseen)."""
    CRASH_DIR.mkdir(exist_ok=True)
    handler = logging.FileHandler(CRASH_DIR / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.log")
    handler.setLevel(logging.CRITICAL)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("compactd.librdkafka").addHandler(handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        warmup.done()


SOAK = os.environ.get("COMPACTD_SOAK") == "1"  # `make soak` sets it


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("soak") is not None and not SOAK:
        pytest.skip("a long fault run: `make soak` runs it")
    if not starts_no_spark(item):
        warmup.wait()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    reorder(items)


@pytest.fixture(autouse=True)
def _root_log_handlers() -> Iterator[None]:
    """CLI tests call `logging.basicConfig(force=True)` on pytest's captured stderr, which closes after the test;
    restoring the root handlers keeps a later test's background threads from logging into a closed file."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
