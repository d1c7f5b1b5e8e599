"""deploy/submit's own checks and the commands it composes (the real submission runs in
tests/e2e/test_standalone_cluster.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"deploy_{name}", ROOT / "deploy" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def submit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "deploy" / "submit"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "compactd.yaml"
    path.write_text("bootstrap_servers: 127.0.0.1:9092\n")
    return path


def test_an_unreachable_master_fails_in_seconds_with_one_line(config: Path) -> None:
    started = time.monotonic()
    done = submit("--master", "spark://127.0.0.1:1", "--config", str(config))
    assert done.returncode == 1 and time.monotonic() - started < 10
    assert done.stderr.splitlines() == [
        "deploy/submit: cannot reach the Spark master at 127.0.0.1:1 within 3 s (--master)"
    ]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--config", "x.yaml"], "--master is required"),
        (["--master", "spark://127.0.0.1:1"], "--config is required"),
        (["--master", "spark://127.0.0.1:1", "--config", "/no/such.yaml"], "does not exist (--config)"),
        (["--master", "spark://h:1", "--config", "CFG", "--deploy-mode", "cluster"], "client mode only"),
        (["--master", "yarn", "--config", "CFG", "--deploy-mode", "both"], "invalid choice"),
    ],
)
def test_bad_usage_exits_2_with_one_line(args: list[str], says: str, config: Path) -> None:
    done = submit(*[str(config) if a == "CFG" else a for a in args])
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr


def test_cluster_mode_ships_the_environment_and_the_config(config: Path, tmp_path: Path) -> None:
    sub = load("submit")
    ns, spark_opts, job_args = sub.split_args(
        [
            "--master",
            "yarn",
            "--config",
            str(config),
            "--deploy-mode",
            "cluster",
            "--num-executors",
            "2",
            "--",
            "--once",
        ]
    )
    env, archive = tmp_path / "env-k", tmp_path / "compactd-env-k.tar.gz"
    argv = sub.cluster_command(ns, env, archive, spark_opts, job_args)
    assert argv[0] == str(env / "bin" / "spark-submit")
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    assert confs["spark.archives"] == f"{archive}#environment"
    assert confs["spark.pyspark.python"] == "./environment/bin/python"
    assert "spark.pyspark.driver.python" not in confs  # cluster mode: the driver runs the shipped one too
    assert argv[argv.index("--files") + 1] == f"{config.resolve()}#compactd.yaml"
    assert argv[-5:] == ["2", str(ROOT / "deploy" / "job.py"), "--config", "compactd.yaml", "--once"]


def test_client_mode_driver_finds_the_executor_interpreter_path_too(config: Path, tmp_path: Path) -> None:
    sub = load("submit")
    ns, spark_opts, job_args = sub.split_args(
        ["--master", "spark://h:1", "--config", str(config), "--work-dir", str(tmp_path)]
    )
    env = tmp_path / "env-k"
    (env / "lib" / "python3.11" / "site-packages" / "compactd" / "streaming").mkdir(parents=True)
    (env / "lib" / "python3.11" / "site-packages" / "compactd" / "streaming" / "log4j2.properties").touch()
    argv, environ, cwd = sub.client_command(ns, env, tmp_path / "a.tar.gz", spark_opts, job_args)
    assert (cwd / "environment").resolve() == env.resolve()
    assert environ["PYSPARK_PYTHON"] == "./environment/bin/python" and "PYSPARK_DRIVER_PYTHON" not in environ
    assert environ["PYSPARK_SUBMIT_ARGS"].startswith("--master spark://h:1 ")
    assert environ["PYSPARK_SUBMIT_ARGS"].endswith(" pyspark-shell")
    assert argv[:2] == [str(env / "bin" / "python"), str(ROOT / "deploy" / "job.py")]


def test_environment_key_follows_the_wheels_content(tmp_path: Path) -> None:
    import zipfile

    sub = load("submit")

    def wheel(name: str, body: str) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(
                "compactd-0.1.0.dist-info/RECORD", f"compactd/x.py,sha256={body},1\ncompactd-0.1.0.dist-info/RECORD,,\n"
            )
        return path

    a, a_again, b = wheel("a.whl", "AAA"), wheel("a2.whl", "AAA"), wheel("b.whl", "BBB")
    key = sub.environment_key
    assert key(a, sys.executable) == key(a_again, sys.executable) != key(b, sys.executable)


def test_job_moves_log_level_before_the_subcommand() -> None:
    job = load("job")
    assert job.compactd_argv(["--once", "--log-level", "DEBUG"]) == ["--log-level", "DEBUG", "run", "--once"]
    assert job.compactd_argv(["--config", "c.yaml"]) == ["run", "--config", "c.yaml"]


def test_spark_submit_conf_options_pass_through_after_config(config: Path) -> None:
    """`--conf k=v` is spark-submit's: it must not be taken for an abbreviation of `--config`."""
    ns, spark_opts, job_args = load("submit").split_args(
        ["--master", "spark://h:7077", "--config", str(config), "--conf", "spark.executor.cores=1", "--", "--once"]
    )
    assert ns.config == config.resolve()
    assert spark_opts == ["--conf", "spark.executor.cores=1"] and job_args == ["--once"]
