"""JVM artifacts from Maven Central, through a pom kept in the repository, cached once per pom content.

`mvn -B dependency:copy-dependencies` copies a pom's runtime jars into `~/.cache/compactd/<name>-<version>-<hash of the
pom>/<folder>`, so a version change is a new directory and never a mix. Two poms use it: Apache Kafka's for the test and
demo broker (`local/jvm/pom.xml`) and Spark's Kafka connector for the job (`streaming/jvm/pom.xml`). `make deps` fills
both; the first use on a machine where a directory is empty fills it too, with one progress line.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from compactd.errors import CompactdError

_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def pom_property(pom: Path, name: str) -> str:
    """A property of the pom (`<properties><name>`)."""
    node = ET.parse(pom).getroot().find(f"m:properties/m:{name}", _NS)
    if node is None or not node.text:
        raise CompactdError(f"{pom} has no {name} property")
    return node.text.strip()


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compactd"


def jars_dir(pom: Path, name: str, version: str, folder: str = "libs") -> Path:
    """Where this pom's jars live: one directory per pom content."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    return cache_root() / f"{name}-{version}-{digest}" / folder


def once(done: Path, build: Callable[[], None]) -> None:
    """Run `build` once per cache entry, which is complete when `done` exists (`build` creates it last). Several
    processes (pytest's workers) may ask at once: one builds under a file lock beside `done`, the others wait for it
    and find the entry complete."""
    if done.exists():
        return
    done.parent.mkdir(parents=True, exist_ok=True)
    with open(done.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            build()


def ensure_jars(pom: Path, name: str, version: str, what: str, folder: str = "libs", quiet: bool = False) -> Path:
    """The pom's runtime jars, fetched once with Maven when the cache lacks them (`once`). `what` names the artifacts
    in the progress and error lines."""
    libs = jars_dir(pom, name, version, folder)
    done = libs.parent / "complete"
    if done.exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise CompactdError(f"mvn not found: {what} comes from Maven Central (apt-get install maven)")

    def fetch() -> None:
        if not quiet:
            print(f"fetching {what} from Maven Central (once) ...", file=sys.stderr, flush=True)
        shutil.rmtree(libs, ignore_errors=True)
        started = time.monotonic()
        argv = [mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime"]
        proc = subprocess.run([*argv, f"-DoutputDirectory={libs}"], capture_output=True, text=True)
        if proc.returncode != 0:
            last = next((ln for ln in reversed(proc.stdout.splitlines()) if "ERROR" in ln), "see mvn's output")
            raise CompactdError(f"fetching {what} with Maven failed: {last.strip()[:300]}")
        done.write_text(f"{time.monotonic() - started:.1f} s\n")
        if not quiet:
            print(f"fetched {what} in {time.monotonic() - started:.0f} s", file=sys.stderr)

    once(done, fetch)
    return libs
