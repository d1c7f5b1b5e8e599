"""One distribution, one import name: the wheel holds `compactd` only, and works from where it is unpacked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(out: Path) -> Path:
    had_build_dir = (ROOT / "build").exists()
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(out),
                str(ROOT),
            ],
            check=True,
            capture_output=True,
        )
    finally:
        if not had_build_dir:  # setuptools builds in the checkout: leave it as it was
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    return next(out.glob("compactd-*.whl"))


def test_wheel_has_one_top_level_name_and_its_package_data(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"compactd"}
    for expected in (
        "compactd/state/lua/merge.lua",
        "compactd/streaming/log4j2.properties",
        "compactd/__main__.py",
        "compactd/streaming/connector.py",
        "compactd/streaming/jvm/pom.xml",
        "compactd/app/cli.py",
    ):
        assert expected in names
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["compactd"]


def test_unpacked_wheel_imports_and_finds_its_lua_without_the_source_tree(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import compactd, redis; from compactd.state.redis_store import RedisState; "
        "s = RedisState(redis.Redis(port=1)); print(compactd.__file__); print(len(s._lua['merge']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,  # not the checkout: nothing found by accident
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0].startswith(str(site)) and int(out[1]) > 1000


def test_python_dash_m_compactd_is_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "compactd", "run", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "redis://127.0.0.1:6379/0" in out.stdout and "COMPACTD_REDIS_URL" in out.stdout  # defaults are shown


def test_the_agent_imports_no_redis_spark_or_prometheus() -> None:
    """The sidecar beside each broker needs Kafka and the log-dir reader, nothing of the job."""
    probe = (
        "import sys, compactd.agent.agent, compactd.app.cli; "
        "print(sorted(m for m in ('redis', 'pyspark', 'prometheus_client') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
