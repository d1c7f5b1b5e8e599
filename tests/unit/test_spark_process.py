"""Spark's JVM as a process, without starting Spark: `end_session` (what stops the JVM, a child in a session of its
own, and everything it started), the class-data archive's life cycle and the Spark home the workers see."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pyspark
import pytest

from compactd.streaming import jvm_start
from compactd.streaming.jvm_start import class_data_sharing, spark_home_for_workers
from compactd.streaming.jvm_start import keep_archive as _keep_archive
from compactd.streaming.session import end_session
from tests.support.processes import tree, wait_until_gone


def started(script: str) -> tuple[subprocess.Popen, dict]:
    """`sh -c script` in a session of its own, with a pipe on its stdin like Spark's gateway; and what it started."""
    proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 5
    while len(found := tree(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc, found


def test_leader_exits_on_stdin_eof_and_what_it_left_in_its_session_is_killed() -> None:
    proc, children = started("sleep 60 & exec cat >/dev/null")  # cat ends on EOF; the sleep would stay
    began = time.monotonic()
    end_session(proc, timeout_s=5, linger_s=0.2)
    assert time.monotonic() - began < 3
    assert proc.returncode == 0
    assert wait_until_gone(children, 1) == []


def test_leader_that_outlives_the_budget_is_killed_with_its_session() -> None:
    proc, children = started("trap '' TERM; sleep 60 & exec sleep 60")  # ignores stdin
    began = time.monotonic()
    end_session(proc, timeout_s=0.5, linger_s=0)
    assert time.monotonic() - began < 3
    assert proc.returncode == -9
    assert wait_until_gone(children, 1) == []


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options, archive = class_data_sharing()
    if not options:
        pytest.skip("this JDK has no base class-data archive")
    assert archive is not None
    _keep_archive(*archive, written=False)  # gives the writer's lock back
    return tmp_path / "compactd"


def test_one_jvm_at_a_time_writes_the_archive(cache: Path) -> None:
    options, archive = class_data_sharing()
    assert archive is not None and options[0].startswith("-XX:ArchiveClassesAtExit=")
    assert class_data_sharing() == ([], None)  # started meanwhile: runs without, writes nothing
    _keep_archive(*archive, written=False)
    assert class_data_sharing()[0][0].startswith("-XX:ArchiveClassesAtExit=")


def test_first_start_writes_an_archive_that_later_starts_map(cache: Path) -> None:
    options, archive = class_data_sharing()
    assert archive is not None
    partial, final = archive
    assert options[0] == f"-XX:ArchiveClassesAtExit={partial}" and not final.exists()
    partial.write_bytes(b"archive")  # what the JVM writes as it exits
    _keep_archive(partial, final, written=True)
    assert final.read_bytes() == b"archive" and not partial.exists()
    options, archive = class_data_sharing()
    assert options[0] == f"-XX:SharedArchiveFile={final}" and archive is None


def test_an_archive_from_a_jvm_that_did_not_exit_cleanly_is_dropped(cache: Path) -> None:
    _, archive = class_data_sharing()
    assert archive is not None
    archive[0].write_bytes(b"half")
    _keep_archive(*archive, written=False)
    assert list(cache.iterdir()) == []
    assert class_data_sharing()[0][0].startswith("-XX:ArchiveClassesAtExit=")


def test_archives_of_other_versions_go_once_unused_for_a_month(cache: Path) -> None:
    _, archive = class_data_sharing()
    assert archive is not None
    old, recent = cache / "spark-jvm-old.jsa", cache / "spark-jvm-recent.jsa"
    old.write_bytes(b"x")
    recent.write_bytes(b"x")
    month_ago = time.time() - 31 * 86_400
    os.utime(old, (month_ago, month_ago))
    archive[0].write_bytes(b"archive")
    _keep_archive(*archive, written=True)
    assert sorted(p.name for p in cache.iterdir()) == sorted([archive[1].name, recent.name])


def test_no_sharing_without_the_jdk_base_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    (tmp_path / "jdk" / "lib" / "server").mkdir(parents=True)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert class_data_sharing() == ([], None)


def test_no_sharing_where_the_cache_cannot_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # a file where the directory would go
    assert class_data_sharing() == ([], None)


def test_the_workers_spark_home_links_everything_of_pyspark_but_its_zips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    home = spark_home_for_workers()
    assert home is not None and home.parent == tmp_path / "compactd"
    real = Path(pyspark.__file__).parent
    assert sorted(p.name for p in home.iterdir()) == sorted(p.name for p in real.iterdir() if p.name != "python")
    assert all(p.resolve() == real / p.name for p in home.iterdir())
    assert spark_home_for_workers() == home  # built once


def test_another_spark_home_is_left_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "spark-4"
    (other / "python" / "lib").mkdir(parents=True)
    (other / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    monkeypatch.setenv("SPARK_HOME", str(other))  # its pyspark.zip may be another version than the installed one
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert spark_home_for_workers() is None


def test_the_warm_up_starts_no_jvm_when_the_archive_exists(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, archive = class_data_sharing(spark_home_for_workers())
    assert archive is not None
    archive[0].write_bytes(b"archive")
    _keep_archive(*archive, written=True)
    assert jvm_start.main() == 0
    assert capsys.readouterr().out == f"Spark's class-data archive: {archive[1]}\n"


def test_jars_installed_again_at_the_same_path_get_an_archive_of_their_own(cache: Path, tmp_path: Path) -> None:
    """The JVM ignores an archive, silently, once a class-path jar's modification time differs from the one it was
    dumped with: a venv made anew at the same path (a fresh clone in the same directory) must not keep the old key
    (found in a clone of this repo whose archive was older than its jars)."""
    home = tmp_path / "spark-home"
    (home / "jars").mkdir(parents=True)
    jar = home / "jars" / "spark-core.jar"
    jar.write_bytes(b"jar")
    first = class_data_sharing(home)
    assert first[1] is not None
    _keep_archive(*first[1], written=False)
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))  # same size, installed later
    second = class_data_sharing(home)
    assert second[1] is not None and second[1][1] != first[1][1]
    _keep_archive(*second[1], written=False)
