"""A new user's mistakes: each gets one line naming the problem and the setting to change, and nothing is left."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compactd.app.cli import main
from compactd.errors import DependencyUnavailable
from compactd.kafka.admin import check_reachable
from compactd.kafka.config import KafkaConnection
from compactd.local.servers import free_port
from compactd.settings import load_settings


def compactd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "compactd", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("compactd: error: ")
    return lines[0]


def test_unreachable_kafka_is_one_line_and_creates_no_checkpoint(redis_url: str, tmp_path: Path) -> None:
    ckpt, dead = tmp_path / "ckpt", f"127.0.0.1:{free_port()}"
    out = compactd(
        "run", "--once", "--bootstrap-servers", dead, "--redis-url", redis_url, "--checkpoint-dir", str(ckpt)
    )
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert f"Kafka unreachable at {dead}" in line and "Connection refused" in line and "bootstrap_servers" in line
    assert not ckpt.exists()


@pytest.mark.parametrize("where", ["refused", "unresolvable"])
def test_a_broker_known_to_be_down_fails_the_check_at_once_not_at_its_timeout(where: str) -> None:
    """Refused and unresolvable are known at once: only a broker that does not answer at all takes the timeout."""
    servers = f"127.0.0.1:{free_port()}" if where == "refused" else "no-such-broker.invalid:9092"
    started = time.monotonic()
    with pytest.raises(DependencyUnavailable) as err:
        check_reachable(KafkaConnection(servers), timeout_s=60)
    assert time.monotonic() - started < 10
    assert ("Connection refused" if where == "refused" else "Failed to resolve") in str(err.value)


def test_wrong_redis_url_with_a_live_broker_names_redis(broker: str, tmp_path: Path) -> None:
    ckpt, dead = tmp_path / "ckpt", f"redis://127.0.0.1:{free_port()}/0"
    out = compactd("run", "--once", "--bootstrap-servers", broker, "--redis-url", dead, "--checkpoint-dir", str(ckpt))
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert f"Redis unreachable at {dead}" in line and "redis_url" in line and "Kafka" not in line
    assert not ckpt.exists()


def test_both_wrong_names_both(tmp_path: Path) -> None:
    args = ["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--redis-url", f"redis://127.0.0.1:{free_port()}/0"]
    out = compactd("run", "--once", *args, "--checkpoint-dir", str(tmp_path / "c"))
    line = one_line(out.stderr)
    assert out.returncode == 1 and "Redis and Kafka unreachable" in line
    assert "redis_url" in line and "bootstrap_servers" in line


def test_status_and_agent_fail_the_same_way(tmp_path: Path) -> None:
    status = compactd("status", "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert status.returncode == 1 and "Redis unreachable" in one_line(status.stderr)
    agent = compactd("agent", "--once", "--log-dir", str(tmp_path), "--bootstrap-servers", f"127.0.0.1:{free_port()}")
    assert agent.returncode == 1 and "Kafka unreachable" in one_line(agent.stderr)


def test_redis_password_is_not_printed(tmp_path: Path) -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    out = compactd("status", "--redis-url", url)
    assert out.returncode == 1 and "s3cret" not in out.stderr and "***" in one_line(out.stderr)


def test_bad_log_level_and_no_command_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "chatty", "status"]) == 2
    assert "invalid log level" in one_line(capsys.readouterr().err)
    assert main([]) == 2
    assert "usage: compactd" in capsys.readouterr().err


def test_config_get_without_scope_shows_effective_defaults(capsys: pytest.CaptureFixture[str], redis_url: str) -> None:
    assert main(["config", "get", "--redis-url", redis_url]) == 0
    values = json.loads(capsys.readouterr().out)["values"]
    assert values["dry.run"] is True and values["action.retry.ms"] == 300_000
    assert values["compaction.nudge"] == "max.compaction.lag.ms" and values["max.compaction.lag.ms"] is None


def test_kafka_settings_take_yaml_ints_and_booleans(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text('kafka: {"session.timeout.ms": 10000, "enable.ssl.certificate.verification": false}\n')
    conn = load_settings(cfg).kafka_connection()
    assert conn.client("consumer")["session.timeout.ms"] == 10000
    assert conn.spark_options()["kafka.enable.ssl.certificate.verification"] == "false"


def test_bad_hex_and_undecodable_bytes_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["offsets", "decode", "--key", "zz"]) == 2
    assert "bad hex" in one_line(capsys.readouterr().err)
    assert main(["offsets", "decode", "--key", "0001"]) == 2
    assert "truncated" in one_line(capsys.readouterr().err)
