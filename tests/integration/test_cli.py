"""The command line: configuration precedence, exit codes, status output, and the demo loop closing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compactd.app.cli import main
from compactd.model import Segment
from compactd.settings import Settings, load_settings
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState


def test_flags_beat_environment_beat_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "bootstrap_servers: file:1\nredis_url: redis://file/0\ncheckpoint_dir: /file\n"
        "thresholds:\n  'topic:orders': {max.compaction.lag.ms: 5}\ntopics: {actions: my.actions}\n"
    )
    monkeypatch.setenv("COMPACTD_REDIS_URL", "redis://env/0")
    monkeypatch.setenv("COMPACTD_CHECKPOINT_DIR", "/env")
    s = load_settings(cfg, checkpoint_dir="/flag", bootstrap_servers=None)
    assert (s.bootstrap_servers, s.redis_url, s.checkpoint_dir) == ("file:1", "redis://env/0", "/flag")
    assert s.topics.actions == "my.actions" and s.topics.segments == "compactd.segments"
    assert s.thresholds["topic:orders"] == {"max.compaction.lag.ms": 5}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("thresholds:\n  global: {max.compaction.lag.ms: -1}\n", "greater than 0"),
        ("thresholds:\n  'topik:x': {}\n", "invalid scope"),
        ("no_such_key: 1\n", "no_such_key"),
        ("offsets_source: carrier-pigeon\n", "offsets_source"),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path: Path, capsys, content: str, fragment: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(content)
    assert main(["run", "--once", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("compactd: error:") and fragment in err and "\n" not in err


def test_usage_errors_exit_2(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert main(["run", "--config", "/does/not/exist.yaml"]) == 2
    assert "not found" in capsys.readouterr().err


def test_config_get_resolves_scopes(tmp_path: Path, capsys, redis_url: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("thresholds:\n  global: {dry.run: false}\n  'partition:orders/1': {consumed.retention.ms: 7}\n")
    assert main(["config", "get", "partition:orders/1", "--config", str(cfg), "--redis-url", redis_url]) == 0
    values = json.loads(capsys.readouterr().out)["values"]
    assert values["consumed.retention.ms"] == 7 and values["dry.run"] is False


def test_status_shows_partitions(redis_url: str, rclient, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    st = RedisState(rclient, Settings().key_prefix)  # what `status` reads with no flags: cd:default
    c = BatchChanges()
    c.topic("orders").segments.append((0, Segment(0, 100, 0, 1, 0)))
    c.topic("orders").offsets.append(("g", 0, 100))
    st.merge("s", 0, c, lambda g, t: True)
    monkeypatch.setenv("COMPACTD_REDIS_URL", redis_url)
    assert main(["status", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["partition"] == "orders/0" and row["min_committed"] == 100 and row["deletable"] == 0


@pytest.mark.spark
def test_demo_closes_both_loops(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "compactd", "demo", "--until-closed", "--duration", "150", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    final = out.stdout.split("final state:")[1]
    assert "delete_records" in final and "compact sent" in final
    # Kafka's own cleaner answered the nudge and the nudge went back; the broker's log start moved after a delete
    log = out.stdout.split("final state:")[0]
    nudged = log.index("kafka: orders max.compaction.lag.ms=1")
    assert "the nudge put back" in log[nudged:] and re.search(r"compactd: compact orders/\d sent", log)
    # Kafka cleaned each partition by itself once (nothing was clean), then again past that: the nudged clean
    cleans = re.findall(r"kafka: the cleaner compacted orders/(\d) up to (\d+)", log)
    assert any(int(upto) > min(int(u) for p, u in cleans if p == part) for part, upto in cleans)
    assert re.search(r"kafka: clicks/\d log start moved to \d+", log)
    # piped, the demo is an event log: each line once, no table before the final state
    assert "compaction_delay_s" not in log
    # nothing of the JVMs (Spark's, Kafka's) reaches the terminal
    for noise in ("WARNING: Using incubator", "Setting default log level", "sc.setLogLevel", "INFO ["):
        assert noise not in out.stdout + out.stderr
    # the compaction service on `accounts`: a generation published, and its table read back (500 keys a partition)
    assert re.search(r"compaction service: accounts generation \d+ published", out.stdout)
    assert re.search(r"compacted view accounts.compacted: generation \d+, .*\n  its table \(1000 live keys", final)
    # issue 66 item 6: a keyed producer's table (each customer in one partition), only the demo's topics in the
    # final table, and the job's own log lines in the file the demo names, not among the events
    shown = re.findall(r"(c\d{4})=\S+ \(p(\d)@", out.stdout)
    assert shown and all(len({p for k2, p in shown if k2 == k}) == 1 for k, _ in shown), shown
    table_rows = [ln.split()[0] for ln in final.splitlines() if re.match(r"\s*\S+/\d+\s", ln)]
    assert table_rows and all(r.rsplit("/", 1)[0] in ("orders", "clicks", "accounts") for r in table_rows), table_rows
    assert f"demo: the job's log goes to {tmp_path / 'job.log'}" in log
    assert not re.search(r"INFO compactd\.job: batch \d+", out.stdout + out.stderr)
    assert re.search(r"INFO compactd\.job: batch \d+", (tmp_path / "job.log").read_text())
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert leftover == "", "demo left processes behind"


@pytest.mark.soak
def test_the_demo_on_three_nodes_goes_on_through_a_node_killed_and_restarted(tmp_path: Path) -> None:
    """`make demo CLUSTER=3`: once both loops have closed, the node leading most demo partitions is killed with -9
    and started again 20 s later; both loops close again after that, and deletes move the log start further."""
    out = subprocess.run(
        [sys.executable, "-m", "compactd", "demo", "--nodes", "3", "--until-closed", "--duration", "420",
         "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=540,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout.split("final state:")[0]
    assert re.search(r"demo: kill -9 of Kafka node \d, leader of \d+ demo partitions", log), log[-3000:]
    before, after = log.split("started again", 1)
    assert "the nudge put back" in after and "compaction service: accounts generation" in after, after[-3000:]
    assert re.search(r"compactd: delete_records clicks/\d before \d+ sent", after), after[-3000:]

    def starts(text: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for p, offset in re.findall(r"kafka: clicks/(\d) log start moved to (\d+)", text):
            found[p] = max(found.get(p, 0), int(offset))
        return found

    was, now = starts(before), starts(after)
    assert any(now[p] > was.get(p, 0) for p in now), (was, now)  # a log start moved past where it stood
    assert "Traceback" not in out.stdout + out.stderr
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert leftover == "", "demo left processes behind"
