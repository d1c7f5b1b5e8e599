"""What makes the Spark compactd launches start cheaply, kept in the user's cache (`~/.cache/compactd`):

- a class-data archive of the classes Spark's JVM loads as it starts (`class_data_sharing`);
- a Spark home whose Python workers import the installed pyspark, not `python/lib/pyspark.zip`
  (`spark_home_for_workers`).

Neither applies when spark-submit starts the JVM (deploy/submit, a cluster): the cluster's own home is used then.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import pyspark
from pyspark.find_spark_home import _find_spark_home

log = logging.getLogger("compactd.spark")

DAY_S = 86_400.0
ARCHIVE_KEEP_S = 30 * DAY_S  # an archive no start used for this long (another JDK or Spark version) is removed


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compactd"


def spark_home_for_workers() -> Path | None:
    """A Spark home for the JVM compactd launches, the same as pyspark's own except for its `python/` directory.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its Python workers' path. Python keeps no bytecode for
    what it imports from a zip, so every worker process (about seven per job start: the daemon, the streaming
    source's runner, the data source's planners) compiles pyspark again: 0.4 s of CPU each on this machine. Without
    the zip there, workers import the installed pyspark, this very version, compiled once. Built once per pyspark
    install (links, no copies); None when SPARK_HOME is another Spark than the installed pyspark, or where the
    cache cannot be written."""
    try:
        home = Path(_find_spark_home()).resolve()
        if home != Path(pyspark.__file__).resolve().parent or not (home / "python" / "lib" / "pyspark.zip").is_file():
            return None
        key = hashlib.sha256(f"{home}\n{pyspark.__version__}".encode()).hexdigest()[:12]
        cache = cache_dir()
        linked = cache / f"spark-home-{key}"
        if (linked / "jars").is_dir():
            return linked
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f"{linked.name}.{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for entry in home.iterdir():
            if entry.name != "python":
                (partial / entry.name).symlink_to(entry)
        try:
            partial.rename(linked)
        except OSError:  # another start made it first
            shutil.rmtree(partial, ignore_errors=True)
        return linked if (linked / "jars").is_dir() else None
    except OSError as exc:
        log.debug("Spark home for workers: %s", exc)
        return None


def class_data_sharing(home: Path | None = None, write: bool = True) -> tuple[list[str], tuple[Path, Path] | None]:
    """JVM options for class data sharing (a dynamic AppCDS archive, JDK 13+; Spark 4 runs on 17+): the classes
    Spark's start loads are mapped from an archive in the user's cache instead of loaded and verified one by one,
    about 2.5 s of a 7 s start on 2 cores. Without an archive for this JDK, this Spark home and these jars, the JVM
    writes one as it exits (once; `stop_spark` keeps it if the JVM exited cleanly). ([], None) where it cannot
    apply: no JDK base archive, no writable cache directory. `home`: the Spark home the JVM starts from (the
    archive holds its jars' paths), pyspark's by default. `write` False: an archive is used if there is one, none is
    written (a JVM that will not start Spark's context would archive the wrong classes)."""
    try:
        java_home = os.environ.get("JAVA_HOME")
        java = Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")
        java = java.resolve(strict=True)
        libjvm = java.parent.parent / "lib" / "server"
        if not (libjvm / "classes.jsa").is_file():  # a dynamic archive sits on top of the JDK's base archive
            return [], None
        home = home or Path(_find_spark_home())
        identity = [
            str(java),
            str(home),
            *(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(libjvm.iterdir())),
        ]
        # the JVM maps an archive only while every jar on its class path has the size and modification time it was
        # dumped with, and ignores it silently otherwise: a pyspark installed again at the same path (a venv made
        # anew, a fresh clone in the same directory) needs an archive of its own, not the old one's key
        identity += sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in (home / "jars").glob("*.jar"))
        key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
        cache = cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        archive = cache / f"spark-jvm-{key}.jsa"
        quiet = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]  # a stale archive is ignored, silently
        if archive.is_file():
            if archive.stat().st_mtime < time.time() - DAY_S:
                os.utime(archive)  # in use: other versions' archives unused for ARCHIVE_KEEP_S are removed
            return [f"-XX:SharedArchiveFile={archive}", *quiet], None
        if not write:
            return [], None
        for old in cache.glob("spark-jvm-*.jsa.*"):  # what JVMs of crashed runs wrote, and their locks
            if old.stat().st_mtime < time.time() - 3600:
                old.unlink(missing_ok=True)
        if not os.access(cache, os.W_OK):
            return [], None
        try:  # one writer at a time: JVMs starting together (a test suite, several jobs) do not all dump it
            os.close(os.open(_writing(archive), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return [], None
        partial = cache / f"{archive.name}.{os.getpid()}"
        partial.unlink(missing_ok=True)
        return [f"-XX:ArchiveClassesAtExit={partial}", *quiet], (partial, archive)
    except (OSError, RuntimeError):  # no home directory, an unreadable JDK: start without
        return [], None


def _writing(archive: Path) -> Path:
    """The lock the one JVM writing `archive` holds (removed when it is kept or dropped, or after an hour)."""
    return archive.with_name(f"{archive.name}.writing")


def keep_archive(partial: Path, archive: Path, written: bool) -> None:
    """The archive a JVM wrote as it exited: kept if the JVM exited cleanly, else dropped."""
    _writing(archive).unlink(missing_ok=True)
    try:
        if written and partial.is_file() and partial.stat().st_size > 0:
            os.replace(partial, archive)
            for other in archive.parent.glob("spark-jvm-*.jsa"):  # archives of JDKs or Sparks no longer used
                if other != archive and other.stat().st_mtime < time.time() - ARCHIVE_KEEP_S:
                    other.unlink(missing_ok=True)
            log.info("Spark's classes archived for faster starts: %s", archive)
        else:
            partial.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("class data archive: %s", exc)


def main() -> int:
    """`python -m compactd.streaming.jvm_start`: start Spark's JVM once and stop it, so that its class-data archive
    exists before many JVMs start at once (a test suite, a container image being built). Without it, the first JVM
    to start writes it as it exits, and every JVM started meanwhile pays the full start (on 2 cores a session starts
    in 10 s without it, 2.5 s with it)."""
    from compactd.streaming.session import spark_session, stop_spark

    options, archive = class_data_sharing(spark_home_for_workers())
    if archive is None:
        print("Spark's class-data archive: " + (options[0].split("=", 1)[1] if options else "not available here"))
        return 0
    keep_archive(*archive, written=False)  # gives the writer's lock back: the JVM below takes it and writes it
    stop_spark(spark_session())
    print(f"Spark's class-data archive: {archive[1] if archive[1].is_file() else 'not written'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
