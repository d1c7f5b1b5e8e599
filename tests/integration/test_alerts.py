"""The alert rules, checked and unit-tested by promtool (Debian `prometheus`, installed by `make deps`), and their
runbooks in docs/operations.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

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


RUNBOOK = "https://github.com/compactd/compactd/blob/main/docs/operations.md#"
OPERATIONS = DASHBOARDS.parent / "docs" / "operations.md"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (outside code fences): lower case, punctuation other
    than `-` and `_` dropped, spaces to `-`, a repeated heading suffixed -1, -2, ..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_every_alert_links_its_runbook_section() -> None:
    rules = [r for g in yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())["groups"] for r in g["rules"]]
    alerts = [r["alert"] for r in rules if "alert" in r]
    assert len(alerts) == 13
    text = OPERATIONS.read_text()
    anchors = github_anchors(text)
    for rule in rules:
        url = rule.get("annotations", {}).get("runbook_url")
        assert url == RUNBOOK + rule["alert"].lower(), (rule["alert"], url)
        assert url.removeprefix(RUNBOOK) in anchors, f"{rule['alert']}: no heading for #{url.rsplit('#', 1)[1]}"
    # and no runbook for an alert that is gone: every `### Compactd...` heading names an alert
    runbooks = re.findall(r"^### (Compactd\w+)\s*$", text, re.MULTILINE)
    assert sorted(runbooks) == sorted(alerts)
