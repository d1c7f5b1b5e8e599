"""Redis that requires a password: every compactd entry point passes it, and never prints it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from compactd.app.cli import main
from compactd.local.servers import Service, redis_server
from compactd.model import Segment
from compactd.settings import Settings
from compactd.state.changes import BatchChanges

PASSWORD = "s3cr3t-pw"


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = redis_server(tmp_path_factory.mktemp("redis-auth"), password=PASSWORD)
    yield svc
    svc.stop()


def test_password_from_url_or_setting_reaches_redis(locked_redis: Service, capsys, monkeypatch) -> None:
    url = f"redis://127.0.0.1:{locked_redis.port}/0"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url).ping()  # the server really is locked
    for settings in (
        Settings(redis_url=f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0"),
        Settings(redis_url=url, redis_password=PASSWORD),
    ):
        state = settings.redis_state()
        state.start()
        batch = BatchChanges()
        batch.topic("orders").segments.append((0, Segment(0, 10, 1, 1, 1)))
        state.merge("s", 0, batch, lambda g, t: True)  # the Lua scripts load through the authenticated client
        assert state.partitions("orders") == [0]
        state.r.flushall()
    monkeypatch.setenv("COMPACTD_REDIS_PASSWORD", PASSWORD)
    assert main(["config", "get", "global", "--redis-url", url]) == 0
    assert "values" in json.loads(capsys.readouterr().out)
    assert main(["status", "--redis-url", url]) == 0


def test_wrong_password_is_one_line_without_the_password(locked_redis: Service, capsys, tmp_path: Path) -> None:
    url = f"redis://:wrong-{PASSWORD}@127.0.0.1:{locked_redis.port}/0"
    assert main(["status", "--redis-url", url]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and PASSWORD not in err
    assert err.startswith("compactd: error: Redis") and ":***@" in err and "redis_password" in err
