"""The packed reads of partition state (lua/views.lua, lua/explain_rank.lua, lua/live_records.lua) return exactly what
the pipelined per-partition commands return, on states built by the real merge from generated batches; and the
controller, which plans from them in bulk, leaves what the pure per-partition plan gives."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.model import ActionRecord, Segment
from compactd.policy.forecast import partition_stats
from compactd.policy.plan import plan_partition
from compactd.policy.thresholds import resolve, topic_excluded
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support.examples import examples
from tests.support.partition_cases import view_of

TOPICS = ("a", "b.c")
H = 3_600_000
NOW = 1_800_000_000_000
SCOPES = (
    {},
    {"partition:a/1": {"consumed.retention.ms": 0, "forced.retention.ms": 2 * H}},
    {"topic:b.c": {"dry.run": False}},
    {"topic:b.c": {"topics.exclude": [r"b\.c"]}},
)
GROUPS = ("g1", "g2", "g3")
T, P = st.sampled_from(TOPICS), st.integers(0, 2)

change = st.one_of(
    st.tuples(st.just("segment"), T, P, st.integers(0, 500), st.integers(1, 200)),
    st.tuples(st.just("offset"), T, P, st.sampled_from(GROUPS), st.integers(0, 900)),
    st.tuples(st.just("log_start"), T, P, st.integers(0, 800), st.just(0)),
    st.tuples(st.just("compacted"), T, P, st.integers(0, 800), st.integers(0, 2)),
    st.tuples(st.just("group_delete"), st.sampled_from(TOPICS), st.just(0), st.sampled_from(GROUPS), st.just(0)),
)  # fmt: skip


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(change, min_size=4, max_size=30), min_size=1, max_size=4))
def test_packed_views_equal_the_pipelined_read(redis_url: str, batches: list) -> None:
    state = merged(redis_url, batches)
    keys = [(t, p) for t in TOPICS for p in range(4)]  # partition 3: never written
    assert state.views(keys) == state.views_pipelined(keys)
    assert state.views(keys[::-1]) == state.views_pipelined(keys[::-1])


def merged(redis_url: str, batches: list, first: int = 0) -> RedisState:
    import redis

    if first == 0:
        redis.Redis.from_url(redis_url).flushall()
    state = RedisState.from_url(redis_url, "cd:test")
    for i, batch in enumerate(batches, start=first):
        ch = BatchChanges()
        for kind, topic, p, x, y in batch:
            tc = ch.topic(topic)
            if kind == "segment":
                tc.segments.append((p, Segment(x, x + y, NOW - 4 * H + 60_000 * x, y * 10, NOW - 3 * H + 60_000 * x)))
            elif kind == "offset":
                tc.offsets.append((x, p, y))
            elif kind == "log_start":
                tc.log_start.append((p, x))
            elif kind == "compacted":  # seen y hours ago (0: an event without the time)
                tc.compacted.append((p, x) if y == 0 else (p, x, NOW - y * H))
            else:
                tc.group_deletes.append(x)
        state.merge("s", i, ch, lambda group, topic: group != "g3")  # g3 never counts
    return state


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(change, min_size=4, max_size=30), min_size=1, max_size=4))
def test_partition_numbers_are_the_pipelined_views(redis_url: str, batches: list) -> None:
    """The controller reads partitions as numbers (lua/explain_rank.lua) and builds views from them where it plans
    one by one: the same views the pipelined read gives."""
    state = merged(redis_url, batches)
    for topic in TOPICS:
        for parts in ([2, 0, 3, 1], [1], [2, 0]):  # not in order; partition 3 never written
            nums = state.partition_numbers(topic, parts)
            views = [view_of(nums, topic, row) for row in range(len(parts))]
            assert views == state.views_pipelined([(topic, p) for p in parts])
    chunks = [(topic, [2, 0, 3, 1]) for topic in TOPICS]  # several topics in one pipelined round trip
    for (nums, records), (topic, parts) in zip(state.read_chunks(chunks), chunks, strict=True):
        assert [view_of(nums, topic, row) for row in range(len(parts))] == state.views_pipelined(
            [(topic, p) for p in parts]
        )
        assert records == state.live_records(topic, parts)


def test_offsets_read_whole_or_field_by_field_give_the_same_minimum(redis_url: str) -> None:
    """lua/counted.lua reads a group's bucket whole when it holds few of the partitions asked, else field by field:
    both, and a mix of both in one read, give the pipelined read's minimum."""
    dense = [("offset", "a", p, "g1", 100 + p) for p in range(40)]  # g1 on 40 partitions of bucket 0
    dense += [("offset", "a", p, "g2", 300 - p) for p in range(0, 40, 7)]  # g2 on 6 of them
    dense += [("offset", "a", p, "g1", 5 * p) for p in range(128, 131)]  # bucket 1: few entries
    state = merged(redis_url, [dense])
    for parts in ([0, 7, 9], list(range(0, 40, 3)), list(range(40)), [7, 128, 129, 130, 131, 14, 21]):
        keys = [("a", p) for p in parts]
        assert state.views(keys) == state.views_pipelined(keys)
        nums = state.partition_numbers("a", parts)
        assert [view_of(nums, "a", row) for row in range(len(parts))] == state.views_pipelined(keys)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batches=st.lists(st.lists(change, min_size=4, max_size=30), min_size=2, max_size=3),
    layer=st.fixed_dictionaries(
        {},
        optional={
            "max.compaction.lag.ms": st.sampled_from([1, H, 4 * H]),
            "consumed.retention.ms": st.sampled_from([0, H, 2 * H]),
            "forced.retention.ms": st.sampled_from([3 * H, 6 * H]),
        },
    ),
)
def test_the_controller_plans_every_partition_as_the_pure_plan_does(redis_url: str, batches: list, layer: dict) -> None:
    """A chunk evaluated by the controller (arrays for quiet partitions, the full plan for the rest) leaves in Redis
    and in the metrics what `plan_partition` and `partition_stats` give each partition from the pipelined read."""
    for scoped in SCOPES:  # each on the same state: a sampled one was too rarely the one that matters
        layers = {"global": {"dry.run": True, **layer}, **scoped}
        state = merged(redis_url, batches[:-1])
        clock = [NOW - 60_000]
        ctl = Controller(state, layers, RecordingSink(), None, Metrics(CollectorRegistry()), clock=lambda c=clock: c[0])
        keys = [(t, p) for t in TOPICS for p in range(4)]
        ctl.evaluate(keys, "test")  # a minute earlier: records it leaves are answered by the last batch, or live
        merged(redis_url, batches[-1:], first=len(batches) - 1)
        clock[0] = NOW
        check_controller(state, ctl, layers, keys)


def check_controller(state: RedisState, ctl: Controller, layers: dict, keys: list[tuple[str, int]]) -> None:
    views = state.views_pipelined(keys)
    records = state.records(keys)
    ctl.evaluate(keys, "test")
    for view in views:
        key = (view.topic, view.partition)
        th = resolve(layers, *key)
        why = topic_excluded(view.topic, th)
        plan = plan_partition(view, th, records[key], NOW, True, why)
        assert state.deadline(*key) == plan.deadline, key
        if why:
            assert key not in ctl.metrics.partitions
        else:
            assert ctl.metrics.partitions._stats[key] == partition_stats(view, th, NOW), key
        live = {r.id for r in state.records([key])[key]}
        assert {r.id for r in plan.enqueue} <= live, key
        assert not {r.id for r in plan.answered} & live, key


def test_live_records_and_schedule_equal_the_per_partition_commands(redis_url: str) -> None:
    import redis

    redis.Redis.from_url(redis_url).flushall()
    state = RedisState.from_url(redis_url, "cd:test")
    recs = [
        ActionRecord("x1", "delete_records", "a", 1, "forced_retention", True, NOW, "pending", before_offset=5),
        ActionRecord("x2", "compact", "a", 1, "max_compaction_lag", True, NOW, "sent"),
        ActionRecord("x3", "compact", "a", 7, "max_compaction_lag", True, NOW, "sent"),
        ActionRecord("x4", "compact", "a.b", 1, "max_compaction_lag", True, NOW, "sent"),  # another topic
    ]
    state.enqueue(*recs)
    for parts in ([1, 2, 7], list(range(5000))):  # fewer fields asked than records held, and more
        got = state.live_records("a", parts)
        want = state.records([("a", p) for p in parts])
        assert got == {p: r for (_, p), r in want.items() if r}
        pipelined = [records for _, records in state.read_chunks([("a", parts), ("a.b", [1, 2])])]
        assert pipelined == [got, state.live_records("a.b", [1, 2])] and pipelined[1]
    state.schedule_many([("a", [1, 2, 3], [NOW + 5, -1, NOW + 7]), ("c", [1], [NOW])])
    state.set_deadlines({("b", 1): NOW + 5, ("b", 2): None, ("b", 3): NOW + 7})
    state.schedule("a", [3, 4], [-1, NOW + 3])  # a later chunk removes and adds
    state.set_deadlines({("b", 3): None, ("b", 4): NOW + 3})
    got = {m.decode(): s for m, s in state.r.zrange(state.k_deadlines, 0, -1, withscores=True)}
    a = {k.replace("a/", ""): v for k, v in got.items() if k.startswith("a/")}
    b = {k.replace("b/", ""): v for k, v in got.items() if k.startswith("b/")}
    assert a == b == {"1": NOW + 5, "4": NOW + 3}
