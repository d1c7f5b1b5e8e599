"""The alert rules, checked and unit-tested by promtool (Debian `prometheus`, installed by `make deps`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    assert exe, "promtool not found: `make deps` installs the Debian prometheus package"
    return subprocess.run([exe, *args], cwd=DASHBOARDS, capture_output=True, text=True, timeout=120)


def test_alert_rules_are_valid() -> None:
    out = promtool("check", "rules", "alerts.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 13 rules found" in out.stdout


def test_alert_rules_fire_when_they_should_and_only_then() -> None:
    out = promtool("test", "rules", "alerts_test.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
