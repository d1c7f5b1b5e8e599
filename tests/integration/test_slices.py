"""A batch evaluated in slices of topics (control/slices.py: merged and planned apart, the busy partitions planned by
the driver) gives exactly what evaluating it all in one place gives: the same actions, deadlines, compaction-due
times, metrics and state, batch after batch, on a real Redis."""

from __future__ import annotations

from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.control.slices import slice_of
from compactd.model import Segment
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support.examples import examples

H = 3_600_000
T0 = 1_800_000_000_000
TOPICS = ("a", "b.c", "d", "e", "__internal")
GROUPS = ("g1", "g2", "g3")
T, P = st.sampled_from(TOPICS), st.integers(0, 3)

change = st.one_of(
    st.tuples(st.just("segment"), T, P, st.integers(0, 8), st.integers(0, 6)),
    st.tuples(st.just("offset"), T, P, st.sampled_from(GROUPS), st.integers(0, 900)),
    st.tuples(st.just("offset_delete"), T, P, st.sampled_from(GROUPS), st.just(0)),
    st.tuples(st.just("log_start"), T, P, st.integers(0, 800), st.just(0)),
    st.tuples(st.just("compacted"), T, P, st.integers(0, 800), st.integers(0, 2)),
    st.tuples(st.just("group_delete"), T, st.just(0), st.sampled_from(GROUPS), st.just(0)),
)  # fmt: skip
LAYERS: dict[str, dict[str, Any]] = {
    "global": {"dry.run": True, "consumed.retention.ms": H, "forced.retention.ms": 4 * H, "max.compaction.lag.ms": H},
    "topic:d": {"groups.exclude": ["g3"]},
    "partition:e/1": {"consumed.retention.ms": 0},
    "topic:b.c": {"topics.exclude": [r"b\.c"]},
}


def to_changes(batch: list[tuple[Any, ...]], now: int) -> BatchChanges:
    ch = BatchChanges()
    for kind, topic, p, x, y in batch:
        tc = ch.topic(topic)
        if kind == "segment":  # segment x of the partition, closed y hours ago
            tc.segments.append((p, Segment(100 * x, 100 * x + 100, now - (y + 1) * H, 1000, now - y * H)))
        elif kind == "offset":
            tc.offsets.append((x, p, y))
        elif kind == "offset_delete":
            tc.offsets.append((x, p, None))
        elif kind == "log_start":
            tc.log_start.append((p, x))
        elif kind == "compacted":  # seen y hours ago (0: an event without the time)
            tc.compacted.append((p, x) if y == 0 else (p, x, now - y * H))
        elif x not in ch.group_deletes:
            ch.group_deletes.append(x)
    return ch


def zset(r: redis.Redis, key: str) -> dict[str, float]:
    return {m.decode(): s for m, s in r.zrange(key, 0, -1, withscores=True)}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(change, min_size=3, max_size=25), min_size=1, max_size=5))
def test_shares_decide_what_one_place_decides(redis_url: str, batches: list) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushall()
    clock = [T0]
    ctls, sinks = [], []
    for prefix, slices in (("cd:one", 0), ("cd:slices", 3)):
        sink = RecordingSink()
        state = RedisState.from_url(redis_url, prefix)
        metrics = Metrics(CollectorRegistry())
        ctls.append(Controller(state, LAYERS, sink, None, metrics, clock=lambda c=clock: c[0], slices=slices))
        sinks.append(sink)
    assert len({slice_of(t, 3) for t in TOPICS}) > 1  # the topics do split
    for i, batch in enumerate(batches):
        clock[0] = T0 + i * H // 2
        for ctl in ctls:
            ctl.on_batch("s", i, to_changes(batch, clock[0]))
        one, shared = ctls
        keys = one.state.all_partitions()
        assert shared.state.all_partitions() == keys
        assert shared.state.views(keys) == one.state.views(keys)
        assert shared.state.records(keys) == one.state.records(keys)
        assert zset(r, shared.state.k_deadlines) == zset(r, one.state.k_deadlines)
        assert shared.metrics.partitions._stats == one.metrics.partitions._stats
        assert [x.to_json() for x in sinks[1].executed] == [x.to_json() for x in sinks[0].executed]
    clock[0] += 10 * H  # time alone makes more due: the deadlines both stored bring the same partitions back
    for ctl in ctls:
        ctl.tick()
    assert [x.to_json() for x in sinks[1].executed] == [x.to_json() for x in sinks[0].executed]
