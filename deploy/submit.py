"""Submit compactd to a Spark cluster with its Python environment: `deploy/submit --help`.

Builds compactd's wheel, installs it into a fresh virtualenv, packs that with venv-pack (Spark's jars left out: the
cluster has its own) and ships it to executors with `--archives <env>.tar.gz#environment`. The packed environment is
reused while the wheel's content and the Python version stay the same. Standard library only: it runs before compactd
is installed anywhere.

Client mode (the default): the driver is the Python process this script becomes, and it starts Spark's JVM with
spark-submit (PYSPARK_SUBMIT_ARGS), in a session of its own. SIGTERM or SIGINT, to the driver or to its whole process
group, therefore reaches compactd's graceful stop, not the JVM's shutdown hooks; the JVM ends before the driver does.
Cluster mode: `spark-submit --deploy-mode cluster` (YARN, Kubernetes; Spark standalone runs Python drivers in client
mode only). Exit status: 0, 2 bad usage, 1 other failure; errors are one line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "job.py"
ENV_LINK = "environment"  # the name executors unpack the archive under, and spark.pyspark.python points into
EXECUTOR_PYTHON = f"./{ENV_LINK}/bin/python"
# Spark's own jars (~460 MB) stay out of the archive: executors run Spark's JVM already.
EXCLUDE = ("lib/python*/site-packages/pyspark/jars/*",)
NOT_IMPORTED = "/(tests?|testing)/"


class SubmitError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SubmitError(f"{message} (see `deploy/submit --help`)", 2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="deploy/submit",
        allow_abbrev=False,  # `--conf k=v` is spark-submit's, not an abbreviation of --config
        usage="deploy/submit --master URL --config FILE [options] [spark-submit options] [-- compactd run options]",
        description="Run compactd as a continuous Spark job on a cluster. Options this script does not know go to "
        "spark-submit (e.g. --conf k=v, --executor-memory 2g); options after `--` go to `compactd run` (e.g. --once).",
    )
    env = os.environ.get
    p.add_argument("--master", default=env("COMPACTD_SPARK_MASTER"), help="spark://host:port, yarn, k8s://...")
    p.add_argument("--config", default=env("COMPACTD_CONFIG"), help="compactd YAML config file")
    p.add_argument("--deploy-mode", choices=("client", "cluster"), default="client")
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path(env("COMPACTD_DEPLOY_DIR") or ROOT / "build" / "deploy"),
        help="where the wheel and the packed environment are built and kept (env COMPACTD_DEPLOY_DIR)",
    )
    p.add_argument("--wheel", type=Path, help="a compactd wheel to ship instead of building one from this checkout")
    p.add_argument("--python", default=sys.executable, help="interpreter the shipped environment is built with")
    p.add_argument(
        "--python-prefix",
        help="prefix of that Python on the executors when it differs from here (venv-pack --python-prefix), e.g. /usr",
    )
    p.add_argument("--print-command", action="store_true", help="print what would run, then exit")
    return p


def split_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Own options, spark-submit options, `compactd run` options (after `--`)."""
    argv = list(argv)
    job_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, job_args = argv[:cut], argv[cut + 1 :]
    ns, spark_opts = parser().parse_known_args(argv)
    if not ns.master:
        raise SubmitError("--master is required: spark://host:port, yarn or k8s://https://host:port", 2)
    if not ns.config:
        raise SubmitError("--config is required: the compactd YAML file the job runs with", 2)
    config = Path(ns.config)
    if not config.is_file():
        raise SubmitError(f"config file {config} does not exist (--config)", 2)
    ns.config = config.resolve()
    if ns.deploy_mode == "cluster" and ns.master.startswith(("spark://", "local")):
        raise SubmitError(
            "Spark standalone and local masters run Python drivers in client mode only (--deploy-mode)", 2
        )
    return ns, spark_opts, job_args


def check_master(master: str, timeout_s: float = 3.0) -> None:
    """A spark:// master that does not answer fails here in seconds, not after Spark's minute of retries."""
    if not master.startswith("spark://"):
        return
    hosts = master.removeprefix("spark://").split(",")
    for host_port in hosts:
        host, _, port = host_port.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return
        except (OSError, ValueError):
            continue
    raise SubmitError(f"cannot reach the Spark master at {', '.join(hosts)} within {timeout_s:.0f} s (--master)")


def _run(cmd: Sequence[str | Path], what: str) -> None:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise SubmitError(f"{what} failed: {lines[-1]}")


def build_wheel(work: Path) -> Path:
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, ROOT], "building compactd's wheel")
    return next(dist.glob("compactd-*.whl"))


def environment_key(wheel: Path, python: str) -> str:
    """Content of the wheel (its RECORD: every file's hash) and the Python version: rebuilding with no change reuses
    the packed environment, a one-line code change packs a new one."""
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        lines = sorted(line for line in zf.read(record).decode().splitlines() if not line.startswith(record))
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout
    return hashlib.sha256("\n".join([version, *lines]).encode()).hexdigest()[:12]


def packed_environment(work: Path, wheel: Path, python: str, python_prefix: str | None) -> tuple[Path, Path]:
    """(virtualenv, archive), built once per key."""
    key = environment_key(wheel, python)
    env, archive = work / f"env-{key}", work / f"compactd-env-{key}.tar.gz"
    if archive.is_file() and (env / "bin" / "python").exists():
        log(f"reusing the packed environment {archive.name}")
        return env, archive
    log(f"packing a Python environment with {wheel.name} (once per code change)")
    started = time.monotonic()
    shutil.rmtree(env, ignore_errors=True)
    _run([python, "-m", "venv", env], "creating a virtualenv")
    py = env / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--no-compile", wheel, "venv-pack"], "installing compactd's wheel")
    # executors find what they import compiled: compiled here on every core (pip does it one file at a time), without
    # the packages' own test suites, which nothing imports (a third of the files, left out of the archive's size)
    subprocess.run([py, "-m", "compileall", "-q", "-j", "0", "-x", NOT_IMPORTED, env / "lib"], capture_output=True)
    partial = archive.with_suffix(".partial")
    pack = [env / "bin" / "venv-pack", "-q", "-f", "-p", env, "-o", partial, "--format", "tar.gz"]
    for pattern in EXCLUDE:
        pack += ["--exclude", pattern]
    if python_prefix:
        pack += ["--python-prefix", python_prefix]
    _run(pack, "venv-pack")
    partial.rename(archive)
    log(f"packed {archive.stat().st_size / 1e6:.0f} MB in {time.monotonic() - started:.0f} s")
    return env, archive


def quiet_log4j(env: Path) -> str:
    props = next(env.glob("lib/python*/site-packages/compactd/streaming/log4j2.properties"))
    return f"-Dlog4j2.configurationFile=file:{props}"


def connector_jars(env: Path) -> str:
    """Spark's Kafka connector's jars (comma-separated local paths), as the packed environment's compactd names them
    (this interpreter's compactd where the environment has no interpreter here): fetched into the Maven cache of the
    machine that submits (`make deps`, or here on first use)."""
    python = env / "bin" / "python"
    if not python.exists():
        from compactd.errors import CompactdError
        from compactd.streaming.connector import connector_jars as jars

        try:
            return ",".join(str(p) for p in jars(quiet=True))
        except CompactdError as exc:
            raise SubmitError(str(exc)) from None
    proc = subprocess.run(
        [str(python), "-I", "-m", "compactd.streaming.connector", "--print"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SubmitError((proc.stderr.strip().splitlines() or ["Spark's Kafka connector: no jars"])[-1])
    return proc.stdout.strip()


def spark_confs(archive: Path, jars: str) -> list[str]:
    """What every compactd deployment needs from Spark, whatever the cluster manager: the environment, and Spark's
    Kafka connector as the driver's local jars (Spark serves them to the executors; spark-submit uploads them in
    cluster mode)."""
    confs = {
        "spark.app.name": "compactd",
        "spark.archives": f"{archive}#{ENV_LINK}",
        "spark.jars": jars,
        "spark.pyspark.python": EXECUTOR_PYTHON,
        "spark.ui.showConsoleProgress": "false",
        # the checkpoint is compactd's: a restarted driver must resume, never start a second query on it
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    }
    return [arg for k, v in confs.items() for arg in ("--conf", f"{k}={v}")]


def client_command(
    ns: argparse.Namespace, env: Path, archive: Path, spark_opts: list[str], job_args: list[str]
) -> tuple[list[str], dict[str, str], Path]:
    """(argv, environment, working directory) of the driver. The driver's working directory holds an `environment`
    link to the same virtualenv, so the one relative interpreter path works on the driver and the executors alike."""
    submit_args = [
        "--master",
        ns.master,
        *spark_confs(archive, connector_jars(env)),
        "--driver-java-options",
        " ".join([*os.environ.get("COMPACTD_SPARK_JVM_OPTIONS", "").split(), quiet_log4j(env)]),
        *spark_opts,
        "pyspark-shell",
    ]
    run_dir = ns.work_dir / "driver"
    run_dir.mkdir(parents=True, exist_ok=True)
    link = run_dir / ENV_LINK
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(env.resolve(), target_is_directory=True)
    environ = {
        **os.environ,
        "PYSPARK_SUBMIT_ARGS": shlex.join(submit_args),
        "PYSPARK_PYTHON": EXECUTOR_PYTHON,
        "COMPACTD_SPARK_MASTER": ns.master,
    }
    environ.pop("PYSPARK_DRIVER_PYTHON", None)
    argv = [str(env / "bin" / "python"), str(JOB), "--config", str(ns.config), *job_args]
    return argv, environ, run_dir


def cluster_command(
    ns: argparse.Namespace, env: Path, archive: Path, spark_opts: list[str], job_args: list[str]
) -> list[str]:
    return [
        str(env / "bin" / "spark-submit"),
        "--master",
        ns.master,
        "--deploy-mode",
        "cluster",
        *spark_confs(archive, connector_jars(env)),
        "--files",
        f"{ns.config}#compactd.yaml",
        *spark_opts,
        str(JOB),
        "--config",
        "compactd.yaml",
        *job_args,
    ]


def log(message: str) -> None:
    print(f"deploy/submit: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        ns, spark_opts, job_args = split_args(sys.argv[1:] if argv is None else argv)
        check_master(ns.master)
        ns.work_dir = ns.work_dir.resolve()
        ns.work_dir.mkdir(parents=True, exist_ok=True)
        wheel = ns.wheel.resolve() if ns.wheel else build_wheel(ns.work_dir)
        env, archive = packed_environment(ns.work_dir, wheel, ns.python, ns.python_prefix)
        if ns.deploy_mode == "cluster":
            argv_, environ, cwd = cluster_command(ns, env, archive, spark_opts, job_args), dict(os.environ), Path.cwd()
        else:
            argv_, environ, cwd = client_command(ns, env, archive, spark_opts, job_args)
        if ns.print_command:
            extra = (
                f"PYSPARK_SUBMIT_ARGS={shlex.quote(environ['PYSPARK_SUBMIT_ARGS'])} "
                if ns.deploy_mode == "client"
                else ""
            )
            print(f"cd {shlex.quote(str(cwd))} && {extra}{shlex.join(argv_)}")
            return 0
        os.chdir(cwd)
        os.execve(argv_[0], argv_, environ)  # the driver (or spark-submit) replaces this process: signals reach it
    except SubmitError as e:
        log(str(e))
        return e.code
    except KeyboardInterrupt:
        return 130
    return 1  # not reached: execve does not return


if __name__ == "__main__":
    raise SystemExit(main())
