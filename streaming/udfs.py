"""compactd's own JVM code, all of it Java that runs in Spark's tasks, under `streaming/jvm/java/`: the stream's
fast path (its decoders and reduction over Spark's internal rows, `io/compactd/spark/`, streaming/columns.py) and the
compaction's task (`io/compactd/compaction/`, registered per run by `compaction.spark_run`). Built once with `javac`
against pyspark's own jars and the connector's `kafka-clients` (the exact classes they run with), cached beside the
Maven jars.

Why Java, not Column expressions: the same checks written as `hex()`/`conv()`/`substr()` expressions decoded 208k
`__consumer_offsets` records/s on this machine's two cores (every field a string conversion, and a generated method
too large for the JIT), where one pass over the bytes in Java runs at the speed of Spark's read (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

from compactd import maven
from compactd.errors import CompactdError


def _sources() -> list[Path]:
    """The stream's decoders and the compaction's task: one tree, one jar, one compile."""
    return sorted(Path(str(resources.files("compactd.streaming.jvm").joinpath("java"))).rglob("*.java"))


def tasks_jar(quiet: bool = False, libs: list[Path] | None = None) -> Path:
    """compactd's jar for Spark's tasks (the decoders and the compaction's task), compiled once per source content and
    pyspark version (`make deps`; else the first session builds it in about two seconds), under `maven.once`'s lock.
    `libs`: the connector's jars (the compaction task uses its Kafka client), on the compile's classpath."""
    import pyspark

    sources = _sources()
    extra = [p.name.encode() for p in libs or []]
    digest = hashlib.sha256(b"".join([*(p.read_bytes() for p in sources), *extra, pyspark.__version__.encode()]))
    jar = maven.cache_root() / f"tasks-{digest.hexdigest()[:16]}" / "compactd-tasks.jar"
    if jar.exists():
        return jar
    javac = shutil.which("javac")
    if javac is None:
        raise CompactdError("javac not found: compactd's decoders are compiled once with a JDK (apt-get install "
                            "openjdk-17-jdk-headless)")  # fmt: skip

    def build() -> None:
        if not quiet:
            print("compiling compactd's Java for Spark's tasks (once) ...", file=sys.stderr, flush=True)
        classpath = os.pathsep.join([str(Path(pyspark.__file__).parent / "jars" / "*"), *map(str, libs or [])])
        with tempfile.TemporaryDirectory() as out:
            argv = [javac, "-nowarn", "--release", "17", "-d", out, "-cp", classpath, *map(str, sources)]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "see javac's output")
                raise CompactdError(f"compiling compactd's Java for Spark's tasks failed: {first[:300]}")
            partial = jar.with_suffix(".partial")
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
                for f in sorted(Path(out).rglob("*.class")):
                    z.write(f, f.relative_to(out).as_posix())
            partial.rename(jar)  # the jar appears whole or not at all: it is `once`'s mark

    maven.once(jar, build)
    return jar
