"""The state and the controller against a real 3-master Redis Cluster, compared with a single Redis server.

Every multi-key operation must stay within one slot: Lua scripts touch only keys under their topic's hash tag, and
transactions only `{act}` keys; a cluster refuses anything else with CROSSSLOT, so the same scenario passing on
both proves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.health import StateGuard
from compactd.control.metrics import Metrics
from compactd.local.servers import Service, redis_cluster
from compactd.model import ActionRecord, Segment
from compactd.settings import Settings
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000
T0 = 1_800_000_000_000


@pytest.fixture(scope="module")
def cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Service]]:
    nodes = redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield nodes
    for node in nodes:
        node.stop()


def scenario(state: RedisState) -> dict:
    """Merges over many topics (many slots), group deletes and assignments, a recount, config layers, decisions
    with a refused send retried, answers; returns what an operator would look at."""
    attempts = {"n": 0}

    def answer(rec: ActionRecord) -> ActionRecord:
        attempts["n"] += 1
        return rec.with_status("failed", error="timeout") if attempts["n"] == 1 else rec.with_status("sent")

    sink, clock = RecordingSink(answer), [T0]
    layers = {
        "global": {
            "dry.run": False,
            "consumed.retention.ms": H,
            "max.compaction.lag.ms": H,
            "actions.per.second": 1000,
            "compaction.max.concurrent": 100,
        }
    }
    ctl = Controller(state, layers, sink, None, Metrics(CollectorRegistry()), clock=lambda: clock[0])
    batch = BatchChanges()
    topics = [f"topic-{i}" for i in range(12)]
    for i, topic in enumerate(topics):
        tc = batch.topic(topic)
        for p in range(2):
            tc.segments.append((p, Segment(0, 100, T0 - 3 * H, 10, T0 - 3 * H)))
            tc.segments.append((p, Segment(100, 200, T0 - 10, 10, T0 - 10)))
            tc.offsets.append(("billing", p, 150 + i))
            tc.offsets.append(("stale", p, 20))
    batch.assignments["newcomer"] = {topics[0]: [0, 1]}
    ctl.on_batch("s", 0, batch)
    gone = BatchChanges()
    gone.group_deletes = ["stale"]
    gone.assignments["newcomer"] = {}
    ctl.on_batch("s", 1, gone)
    ctl.set_layers({**layers, "topic:topic-3": {"groups.exclude": ["billing"]}})
    ctl.evaluate(ctl.recount_groups(["topic-3"]), "config")
    state.save_config_layer("topic:topic-3", {"values": {"groups.exclude": ["billing"]}, "version": 1, "ts": 1})
    clock[0] += 10_000
    ctl.tick()  # the refused action is retried
    done = BatchChanges()
    done.topic("topic-1").log_start.append((0, 100))
    ctl.on_batch("s", 2, done)
    return {
        "views": [
            (v.topic, v.partition, v.min_committed, v.log_start) for t in topics for v in state.views([(t, 0), (t, 1)])
        ],
        "sent": sorted((r.topic, r.partition, r.action, r.before_offset) for r in sink.executed),
        "outbox": state.outbox(),
        "last": sorted((k, r.status) for k, r in state.last_actions().items()),
        "groups": state.groups(topics[0]),
        "layers": state.config_layers(),
        "outcomes": dict(ctl.outcomes),
    }


def test_same_results_on_a_cluster_as_on_one_server(cluster_nodes: list[Service], rclient: redis.Redis) -> None:
    single = scenario(RedisState(rclient))
    settings = Settings(redis_url=f"redis://127.0.0.1:{cluster_nodes[1].port}/0", redis_cluster=True)
    state = settings.redis_state()
    state.start()
    state.r.flushall()
    on_cluster = scenario(state)
    assert on_cluster == single
    assert len(single["sent"]) >= 24 and single["outcomes"]["failed"] == 1
    # the keys really are spread over the masters
    per_node = [redis.Redis(port=n.port).dbsize() for n in cluster_nodes]
    assert all(n > 0 for n in per_node), per_node
    keys, used = state.size()
    assert keys == sum(per_node) and used > 0


def test_unreachable_cluster_is_one_line(tmp_path: Path) -> None:
    from compactd.errors import DependencyUnavailable

    state = Settings(redis_url="redis://127.0.0.1:1/0", redis_cluster=True).redis_state(timeout_s=1)
    with pytest.raises(DependencyUnavailable, match="redis_cluster"):
        state.start()


def test_a_shard_that_lost_its_writes_is_a_state_loss(cluster_nodes: list[Service], tmp_path: Path) -> None:
    """The state hash lives on one shard; a failover of another that loses its writes (here: that node flushed) leaves
    the hash intact. Every primary keeps a mark of the epoch and merged batches: the loss is seen at the next check."""
    settings = Settings(redis_url=f"redis://127.0.0.1:{cluster_nodes[0].port}/0", redis_cluster=True)
    state = settings.redis_state()
    state.start()
    state.r.flushall()
    guard = StateGuard(state, tmp_path / "ckpt", tmp_path / "ckpt" / "spark")
    assert guard.loss_at_start("s") is None
    state.merge("s", 0, scenario_batch(), lambda g, t: True)
    guard.merged_batch("s", 0)
    assert guard.loss_now("s") is None
    assert len(state.shard_marks()) == len(cluster_nodes)  # one mark on every primary
    home = state.r.get_node_from_key(state.keys.state_health).port
    other = next(n for n in cluster_nodes if n.port != home)
    redis.Redis(port=other.port).flushall()  # that shard's writes are gone; the state hash is not
    assert state.epoch() == guard.epoch
    why = guard.loss_now("s")
    assert why is not None and "shard lost" in why, why


def scenario_batch() -> BatchChanges:
    c = BatchChanges()
    for i in range(20):  # topics over many slots
        c.topic(f"t{i}").segments.append((0, Segment(0, 10, T0, 1, T0)))
    return c
