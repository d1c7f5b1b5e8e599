"""The packed read of partition views (one script call per topic, lua/views.lua) returns exactly what the
pipelined read returns, on states built by the real merge from generated batches."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactd.model import Segment
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support.examples import examples

TOPICS = ("a", "b.c")
GROUPS = ("g1", "g2", "g3")
T, P = st.sampled_from(TOPICS), st.integers(0, 2)

change = st.one_of(
    st.tuples(st.just("segment"), T, P, st.integers(0, 500), st.integers(1, 200)),
    st.tuples(st.just("offset"), T, P, st.sampled_from(GROUPS), st.integers(0, 900)),
    st.tuples(st.just("log_start"), T, P, st.integers(0, 800), st.just(0)),
    st.tuples(st.just("compacted"), T, P, st.integers(0, 800), st.just(0)),
    st.tuples(st.just("group_delete"), st.sampled_from(TOPICS), st.just(0), st.sampled_from(GROUPS), st.just(0)),
)  # fmt: skip


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(change, min_size=4, max_size=30), min_size=1, max_size=4))
def test_packed_views_equal_the_pipelined_read(redis_url: str, batches: list) -> None:
    import redis

    redis.Redis.from_url(redis_url).flushall()
    state = RedisState.from_url(redis_url, "cd:test")
    for i, batch in enumerate(batches):
        ch = BatchChanges()
        for kind, topic, p, x, y in batch:
            tc = ch.topic(topic)
            if kind == "segment":
                tc.segments.append((p, Segment(x, x + y, 1_000 + x, y * 10, 2_000 + x)))
            elif kind == "offset":
                tc.offsets.append((x, p, y))
            elif kind == "log_start":
                tc.log_start.append((p, x))
            elif kind == "compacted":
                tc.compacted.append((p, x))
            else:
                tc.group_deletes.append(x)
        state.merge("s", i, ch, lambda group, topic: group != "g3")  # g3 never counts
    keys = [(t, p) for t in TOPICS for p in range(4)]  # partition 3: never written
    assert state.views(keys) == state.views_pipelined(keys)
    assert state.views(keys[::-1]) == state.views_pipelined(keys[::-1])
