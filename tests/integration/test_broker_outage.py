"""The broker goes away for a while: decided actions wait in the Redis outbox and go out when it returns."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.kafka.config import KafkaConnection
from compactd.local.broker import kafka_broker
from compactd.model import Segment
from compactd.sinks.audit import AuditLog
from compactd.sinks.kafka_admin import KafkaAdminSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support import kraft
from tests.support.fixtures import Cluster

H = 3_600_000
T0 = 1_800_000_000_000


@pytest.mark.versions
def test_actions_wait_in_the_outbox_while_the_broker_is_down(tmp_path: Path, rclient: redis.Redis) -> None:
    broker = kafka_broker(tmp_path / "broker")
    bootstrap = f"127.0.0.1:{broker.port}"
    cluster = Cluster(bootstrap)
    for name in ("t", "actions"):
        cluster.create(name)
    cluster.fill("t", 100)
    conn = KafkaConnection(bootstrap, {"socket.timeout.ms": 2000, "message.timeout.ms": 600_000})
    state, clock = RedisState(rclient), [T0]
    ctl = Controller(
        state,
        {"global": {"dry.run": False, "consumed.retention.ms": H, "action.backoff.ms": 1000}},
        KafkaAdminSink(conn, state, timeout_s=2.0),
        AuditLog(conn, "actions", timeout_s=2.0),
        Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
    )
    batch = BatchChanges()
    batch.topic("t").segments.append((0, Segment(0, 60, T0 - 3 * H, 1, T0 - 3 * H)))
    batch.topic("t").offsets.append(("g", 0, 60))
    broker.kill()  # kill -9 (in ZooKeeper mode its start waits out the dead process's session)
    try:
        ctl.on_batch("s", 0, batch)  # decided while the broker is down: refused, kept
        [waiting] = state.outbox()
        assert waiting.status == "pending" and waiting.detail["try"] == 1 and waiting.detail["error"]
        clock[0] += 1000
        ctl.tick()  # still down: the second try fails too, and backs off further
        assert state.outbox()[0].detail["try"] == 2
        assert state.outbox()[0].detail["retry_at"] == clock[0] + 2000
    finally:
        broker.start()  # same log dir, same address
    try:
        for name in ("t", "actions"):  # a restarted broker leads its partitions a moment after it first answers
            kraft.until_visible(cluster.conn, name, 1)
        clock[0] += 2000
        ctl.tick()
        assert state.outbox() == []
        assert cluster.watermarks("t") == (60, 100)
        ctl.audit.flush()  # type: ignore[union-attr]
        audit = cluster.read_all("actions")
        assert [(r["status"], r["detail"].get("try")) for r in audit] == [("failed", 1), ("failed", 2), ("sent", 2)]
        assert len({r["id"] for r in audit}) == 1  # one decision, three attempts
    finally:
        ctl.sink.close()
        ctl.audit.close()  # type: ignore[union-attr]
        broker.stop()
