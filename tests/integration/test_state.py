"""Redis state against a real Redis server: idempotent merges, incremental minimum, pruning, outbox."""

from __future__ import annotations

from dataclasses import replace

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactd.model import ActionRecord, PartitionView, ReplicaReport, ReplicaState, Segment
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState
from tests.support.fixtures import dump_redis


def everyone(group: str, topic: str) -> bool:
    return True


def commits(*items: tuple[str, str, int, int | None], deletes: tuple[str, ...] = ()) -> BatchChanges:
    c = BatchChanges()
    for group, topic, partition, offset in items:
        c.topic(topic).offsets.append((group, partition, offset))
    c.group_deletes = list(deletes)
    return c


def test_replayed_batch_changes_nothing(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    c = BatchChanges()
    c.topic("orders").segments.append((0, Segment(0, 100, 5, 10, 6)))
    c.topic("orders").offsets.append(("g", 0, 50))
    touched, replayed = st.merge("s1", 0, c, everyone)
    assert touched == {"orders": {0}} and not replayed
    before = dump_redis(rclient)
    # the same batch id again, even with different content (a replay never re-applies)
    c.topic("orders").offsets[0] = ("g", 0, 7)
    _, replayed = st.merge("s1", 0, c, everyone)
    assert replayed and dump_redis(rclient) == before
    # an older batch id is also a replay; a new stream id is not
    assert st.merge("s1", -1, c, everyone)[1]
    assert not st.merge("s2", 0, c, everyone)[1]
    assert st.view("orders", 0).min_committed == 7


def test_minimum_is_unknown_until_every_counted_group_has_an_offset(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    st.merge("s", 0, commits(("a", "orders", 0, 300), ("a", "orders", 1, 400)), everyone)
    assert st.view("orders", 0).min_committed == 300
    # group b commits only on partition 1: it counts for the whole topic, so partition 0 becomes unknown
    st.merge("s", 1, commits(("b", "orders", 1, 350)), everyone)
    assert st.view("orders", 0).min_committed is None
    assert st.view("orders", 1).min_committed == 350
    # rewind lowers the minimum
    st.merge("s", 2, commits(("a", "orders", 1, 100)), everyone)
    assert st.view("orders", 1).min_committed == 100


def test_offset_tombstones_and_group_deletes_let_the_minimum_advance(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    st.merge(
        "s",
        0,
        commits(
            ("slow", "orders", 0, 10), ("fast", "orders", 0, 900), ("slow", "clicks", 0, 5), ("fast", "clicks", 0, 50)
        ),
        everyone,
    )
    assert st.view("orders", 0).min_committed == 10
    st.merge("s", 1, commits(("slow", "orders", 0, None)), everyone)
    assert st.view("orders", 0).min_committed == 900
    touched, _ = st.merge("s", 2, commits(deletes=("slow",)), everyone)
    assert touched == {"clicks": {0}}
    assert st.view("clicks", 0).min_committed == 50
    assert rclient.smembers("cd:gt:slow") == set()


def test_uncounted_groups_do_not_hold_data_back(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    st.merge(
        "s",
        0,
        commits(("console-1", "orders", 0, 1), ("billing", "orders", 0, 500)),
        lambda g, t: not g.startswith("console"),
    )
    assert st.view("orders", 0).min_committed == 500


def test_log_start_prunes_segments_and_large_offsets_keep_every_digit(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    big = 2**53 - 10
    c = BatchChanges()
    c.topic("t").segments += [
        (0, Segment(0, 100, 1, 1, 1)),
        (0, Segment(100, 200, 2, 1, 2)),
        (0, Segment(big - 5, big, 1_763_800_000_123, 1, 1_763_800_000_456)),
    ]
    c.topic("t").offsets.append(("g", 0, big))
    c.topic("t").compacted.append((0, big - 7))
    st.merge("s", 0, c, everyone)
    v = st.view("t", 0)
    assert v.min_committed == big and v.cleaned_up_to == big - 7
    assert v.segments[-1] == Segment(big - 5, big, 1_763_800_000_123, 1, 1_763_800_000_456)
    c2 = BatchChanges()
    c2.topic("t").log_start.append((0, 150))
    c2.topic("t").segments.append((0, Segment(50, 120, 9, 1, 9)))  # arrives late, already deleted
    st.merge("s", 1, c2, everyone)
    assert [s.base_offset for s in st.view("t", 0).segments] == [100, big - 5]
    assert st.view("t", 0).log_start == 150


def test_a_segments_last_epoch_lives_as_long_as_the_segment_and_a_report_without_one_drops_it(
    rclient: redis.Redis,
) -> None:
    """The epochs the send-time check reads (`segment_epochs`): kept per (partition, base) with the segment, replaced
    by a new report of the same base (without an epoch: none, never the older log's), dropped with the segment below
    the log start, and with the topic's reset."""
    st = RedisState(rclient)
    c = BatchChanges()
    tc = c.topic("t")
    tc.segments += [(0, Segment(0, 100, 1, 1, 1)), (0, Segment(100, 200, 2, 1, 2)), (1, Segment(0, 50, 1, 1, 1))]
    tc.segment_epochs.update({(0, 0): 3, (0, 100): 4, (1, 0): 7})
    st.merge("s", 0, c, everyone)
    assert st.segment_epochs("t", 0, [0, 100, 200]) == {0: 3, 100: 4}
    assert st.segment_epochs("t", 1, [0]) == {0: 7}
    c2 = BatchChanges()
    c2.topic("t").log_start.append((0, 100))  # [0, 100) gone from disk
    c2.topic("t").segments.append((0, Segment(100, 200, 2, 1, 5)))  # re-reported by an agent that gave no epoch
    c2.topic("t").segments.append((0, Segment(200, 300, 2, 1, 5)))
    c2.topic("t").segment_epochs[(0, 200)] = 6
    st.merge("s", 1, c2, everyone)
    assert st.segment_epochs("t", 0, [0, 100, 200]) == {200: 6}
    assert st.reset_topic("t", "re-created", 1) == [0, 1]
    assert st.segment_epochs("t", 0, [200]) == {} and st.segment_epochs("t", 1, [0]) == {}


def test_outbox_lifecycle(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    r = ActionRecord("x1", "delete_records", "t", 0, "consumed_retention", False, 1, "pending", before_offset=9)
    st.enqueue(r)
    assert [o.id for o in st.outbox()] == ["x1"] and st.outbox_depth() == 1
    st.complete(r.with_status("sent"))
    assert st.outbox() == [] and st.records([("t", 0)])[("t", 0)][0].status == "sent"
    st.answer(5, r)
    assert st.records([("t", 0)])[("t", 0)] == [] and st.last_actions()["t/0"].detail["answered_at"] == 5


def test_settle_answers_and_decides_in_one_transaction_as_answer_then_enqueue_would(rclient: redis.Redis) -> None:
    """A chunk's answered records and new decisions go in one transaction; a slot answered and decided again is only
    overwritten. The state must be what `answer` then `enqueue` leave, slot by slot, outbox scores included."""

    def rec(rid: str, n: int, at: int) -> ActionRecord:
        return ActionRecord(rid, "compact", "t", n, "max_compaction_lag", True, at, "pending", earliest_ts=at)

    def seed(prefix: str) -> RedisState:
        st = RedisState(rclient, prefix)
        st.enqueue(rec("old0", 0, 1), rec("old1", 1, 1), rec("old2", 2, 1), rec("old4", 4, 1))
        st.complete(rec("old2", 2, 1).with_status("dry_run"))  # left the outbox, still live
        return st

    answered = [rec("old0", 0, 1), rec("old1", 1, 1), rec("old2", 2, 1)]  # old1 is not decided again
    queued = [rec("new0", 0, 7), rec("new2", 2, 7), rec("new3", 3, 7)]
    one, two = seed("one"), seed("two")
    one.settle(9, answered, queued)
    two.answer(9, *answered)
    two.enqueue(*queued)
    for state in (one, two):
        live = {k[1]: [r.id for r in v] for k, v in state.records([("t", n) for n in range(5)]).items()}
        assert live == {0: ["new0"], 1: [], 2: ["new2"], 3: ["new3"], 4: ["old4"]}
        assert {k: v.id for k, v in state.last_actions().items()} == {"t/0": "old0", "t/1": "old1", "t/2": "old2"}
        assert state.last_actions()["t/0"].detail["answered_at"] == 9
    assert [(r.id, r.decided_at) for r in one.outbox()] == [(r.id, r.decided_at) for r in two.outbox()]
    assert [r.id for r in one.outbox()] == ["old4", "new0", "new2", "new3"]
    assert rclient.hgetall(one.k_rec) == rclient.hgetall(two.k_rec)


def membership(group: str, assigned: dict[str, list[int]]) -> BatchChanges:
    c = BatchChanges()
    c.assignments[group] = assigned
    return c


def test_assigned_group_without_a_commit_blocks_until_it_commits_or_leaves(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    st.merge("s", 0, commits(("a", "orders", 0, 300), ("a", "orders", 1, 300)), everyone)
    assert st.view("orders", 0).min_committed == 300
    # group n's members get partitions 0 and 1 but commit nothing yet: its position is unknown
    touched, _ = st.merge("s", 1, membership("n", {"orders": [0, 1]}), everyone)
    assert touched == {"orders": {0, 1}}
    assert st.view("orders", 0).min_committed is None and st.view("orders", 1).min_committed is None
    st.merge("s", 2, commits(("n", "orders", 0, 10)), everyone)
    assert st.view("orders", 0).min_committed == 10 and st.view("orders", 1).min_committed is None
    # a rebalance moves n off the topic entirely; with its one offset it still counts on partition 0 ...
    st.merge("s", 3, membership("n", {"other": [0]}), everyone)
    assert st.view("orders", 1).min_committed is None
    # ... and once that offset expires (tombstone) the topic is free of n, while "other" is held back by it
    st.merge("s", 4, commits(("n", "orders", 0, None)), everyone)
    assert st.view("orders", 0).min_committed == 300 and st.view("orders", 1).min_committed == 300
    assert "n" in st.groups("other")
    # deleting the group (its metadata tombstone) releases every topic it was assigned to
    st.merge("s", 5, commits(("a", "other", 0, 5), deletes=("n",)), everyone)
    assert st.view("other", 0).min_committed == 5 and st.groups("other") == ["a"]
    assert rclient.exists("cd:ga:n") == 0


def test_empty_group_releases_its_assignment_and_filters_apply(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    st.merge("s", 0, commits(("a", "orders", 0, 300)), everyone)
    st.merge("s", 1, membership("n", {"orders": [0]}), lambda g, t: g != "n")  # excluded: does not count
    assert st.view("orders", 0).min_committed == 300
    st.recount(everyone)  # groups.exclude dropped at runtime: n counts now, and has no position
    assert st.view("orders", 0).min_committed is None
    st.merge("s", 2, membership("n", {}), everyone)  # every member left: the group is Empty
    assert st.view("orders", 0).min_committed == 300 and st.groups("orders") == ["a"]


def test_offsets_over_several_buckets_and_a_group_delete_across_them(rclient: redis.Redis) -> None:
    st = RedisState(rclient)
    parts = [0, 127, 128, 1000]  # three buckets of 128 partitions
    st.merge("s", 0, commits(*[(g, "orders", n, 10 + n) for g in ("a", "b") for n in parts]), everyone)
    assert st.group_offsets("orders") == {(g, n): 10 + n for g in ("a", "b") for n in parts}
    assert [st.view("orders", n).min_committed for n in parts] == [10 + n for n in parts]
    assert rclient.object("encoding", st.keys.offset_bucket("orders", "1", 7)) == b"listpack"
    touched, _ = st.merge("s", 1, commits(deletes=("a",)), everyone)
    assert touched["orders"] >= set(parts)
    assert st.group_offsets("orders") == {("b", n): 10 + n for n in parts}
    assert st.groups("orders") == ["b"] and st.view("orders", 1000).counted_groups == 1
    st.merge("s", 2, commits(("b", "orders", 128, None)), everyone)
    assert st.view("orders", 128).min_committed is None and st.view("orders", 127).min_committed == 137


def test_state_of_the_previous_layout_is_moved_on_the_first_merge(rclient: redis.Redis) -> None:
    """Offsets written by earlier versions (one `off` hash, gp:<group> sets, group names in cz) keep their meaning."""
    st = RedisState(rclient)
    base = st.keys.topic_base("orders")
    rclient.hset(f"{base}:off", mapping={"0|a": 5, "0|b": 9, "1|a": 7, "300|b": 2})
    rclient.sadd(f"{base}:gp:a", 0, 1)
    rclient.sadd(f"{base}:gp:b", 0, 300)
    rclient.sadd(f"{base}:groups", "a", "b")
    rclient.sadd(f"{base}:counted", "a")  # b is excluded by groups.exclude
    rclient.sadd(f"{base}:parts", 0, 1, 300)
    rclient.zadd(f"{base}:cz:0", {"a": 5})  # that layout's per-partition minimum
    rclient.zadd(f"{base}:cz:1", {"a": 7})
    assert st.view("orders", 0).min_committed is None  # unknown before the move: nothing deleted on it
    st.merge("s", 0, commits(("a", "orders", 1, 8)), lambda g, _t: g == "a")
    assert not rclient.exists(f"{base}:cz:0", f"{base}:cz:1")
    assert st.group_offsets("orders") == {("a", 0): 5, ("b", 0): 9, ("a", 1): 8, ("b", 300): 2}
    assert [st.view("orders", n).min_committed for n in (0, 1, 300)] == [5, 8, None]
    assert not rclient.exists(f"{base}:off", f"{base}:gp:a", f"{base}:gp:b")
    st.recount(everyone)  # b counts from now on
    assert [st.view("orders", n).min_committed for n in (0, 1, 300)] == [5, None, None]


def test_partition_state_of_the_layout_before_packing_is_moved_at_start_and_on_merge(rclient: redis.Redis) -> None:
    """Partitions written as a p:<n> hash and a seg:<n> zset (before the packed records of lua/part.lua), with a
    cz:<n> zset of counted offsets (before lua/counted.lua), read the same after the move, whether `start` moves them
    or the first merge of the topic does; the old keys are gone."""
    st = RedisState(rclient)
    want = {}
    for topic in ("orders", "payments"):
        base = st.keys.topic_base(topic)
        rclient.sadd(f"{base}:parts", 0, 1, 300)
        rclient.hset(f"{base}:p:0", mapping={"cleaned": 150, "log_start": 100})
        rclient.zadd(
            f"{base}:seg:0", {"100:200:1700000000000:4096:1700000360000": 100, "200:350:-1:10:1700000720000": 200}
        )
        rclient.hset(f"{base}:p:1", mapping={"log_start": 0})
        rclient.zadd(f"{base}:seg:300", {f"{2**52}:{2**52 + 9}:1700000000000:1:1700000000001": 2**52})
        rclient.zadd(f"{base}:cz:0", {"1": 120})  # the counted minimum before it was derived from the offsets
        rclient.hset(f"{base}:gid", "a", 1)
        rclient.hset(f"{base}:o:1:0", 0, 120)
        rclient.sadd(f"{base}:counted", "a")
        rclient.sadd("cd:topics", topic)
        want[topic] = [
            PartitionView(topic, 0, (Segment(100, 200, 1700000000000, 4096, 1700000360000),
                                     Segment(200, 350, -1, 10, 1700000720000)), 150, 100, 120, 1),
            PartitionView(topic, 1, (), None, 0, None, 1),
            PartitionView(topic, 300, (Segment(2**52, 2**52 + 9, 1700000000000, 1, 1700000000001),), None, 0, None, 1),
        ]  # fmt: skip
    st.merge("s", 0, commits(("a", "orders", 5, 1)), everyone)  # moves "orders" on its first merge
    assert not rclient.exists(*(f"cd:{{orders}}:{k}:{n}" for k in ("p", "seg", "cz") for n in (0, 1, 300)))
    assert rclient.exists("cd:{payments}:seg:0", "cd:{payments}:cz:0") == 2
    assert st.upgrade() == 3  # "payments": its three partitions; "orders" is marked done
    assert not rclient.exists(*(f"cd:{{payments}}:{k}:{n}" for k in ("p", "seg", "cz") for n in (0, 1, 300)))
    for topic in ("orders", "payments"):
        keys = [(topic, n) for n in (0, 1, 300)]
        assert st.views_pipelined(keys) == st.views(keys) == want[topic]
    assert st.upgrade() == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.lists(
            st.one_of(
                st.tuples(st.just("segment"), st.integers(0, 2), st.sampled_from([0, 100, 200, 300, 400]),
                          st.sampled_from([50, 100]), st.integers(0, 3)),
                st.tuples(st.just("log_start"), st.integers(0, 2), st.sampled_from([0, 120, 200, 350])),
                st.tuples(st.just("compacted"), st.integers(0, 2), st.sampled_from([0, 150, 300]),
                          st.sampled_from([None, 7, 8, 9])),
            ),
            max_size=12,
        ),
        min_size=1,
        max_size=5,
    )
)  # fmt: skip
def test_segment_merges_follow_the_rules_batch_after_batch(rclient: redis.Redis, batches: list) -> None:
    """Any mix of segment, log-start and cleaner events, in batches, leaves what the rules say: within a batch the
    cleaner's and log-start events first, then segments by (partition, base), a later one replacing an earlier one and
    one ending at or below the log start only removing it; segments wholly below a new log start dropped. A clean's
    time (None: an event without one) moves only with cleaned_up_to, or fills a time not known for it."""
    rclient.flushdb()
    st_ = RedisState(rclient)
    model: dict[int, dict] = {n: {"segs": {}, "log_start": 0, "cleaned": None, "at": None} for n in range(3)}
    for i, events in enumerate(batches):
        c = BatchChanges()
        tc = c.topic("t")
        for ev in events:
            n = ev[1]
            if ev[0] == "segment":
                tc.segments.append((n, Segment(ev[2], ev[2] + ev[3], 1000 + ev[4], ev[4], 2000 + ev[4])))
            elif ev[0] == "log_start":
                tc.log_start.append((n, ev[2]))
            else:
                tc.compacted.append((n, ev[2]) if ev[3] is None else (n, ev[2], 1_800_000_000_000 + ev[3]))
        for ev in events:  # the model, in the order the rules give
            if ev[0] == "compacted":
                m, at = model[ev[1]], None if ev[3] is None else 1_800_000_000_000 + ev[3]
                if m["cleaned"] is None or ev[2] > m["cleaned"]:
                    m["cleaned"], m["at"] = ev[2], at
                elif ev[2] == m["cleaned"] and m["at"] is None:
                    m["at"] = at
        for ev in events:
            if ev[0] == "log_start" and ev[2] > model[ev[1]]["log_start"]:
                m = model[ev[1]]
                m["log_start"] = ev[2]
                m["segs"] = {b: s for b, s in m["segs"].items() if s.end_offset > ev[2]}
        for ev in events:
            if ev[0] == "segment":
                m, seg = model[ev[1]], Segment(ev[2], ev[2] + ev[3], 1000 + ev[4], ev[4], 2000 + ev[4])
                m["segs"].pop(ev[2], None)
                if seg.end_offset > m["log_start"]:
                    m["segs"][ev[2]] = seg
        st_.merge("s", i, c, everyone)
        touched = sorted({ev[1] for ev in events})
        views = st_.views([("t", n) for n in touched])
        want = [
            (tuple(sorted(model[n]["segs"].values())), model[n]["log_start"], model[n]["cleaned"], model[n]["at"])
            for n in touched
        ]
        assert [(v.segments, v.log_start, v.cleaned_up_to, v.cleaned_at) for v in views] == want


def test_a_clean_keeps_its_time_which_moves_only_with_cleaned_up_to_and_every_read_has_it(rclient: redis.Redis) -> None:
    """The `compacted` event's ts is when the clean was seen (KIP-534's delete horizon starts there): kept with the
    cleaned_up_to it moved to. Re-sent (a replayed batch, the agent's full re-announce with a later ts) or older, an
    event changes nothing; one without a time makes it unknown until a time for that cleaned_up_to comes. Every read
    path (views, the pipelined reference, the controller's numbers, explain's details) reads the same."""
    st = RedisState(rclient)
    t1 = 1_800_000_000_000
    batch = [0]

    def changes(*events: tuple[int, ...]) -> BatchChanges:
        c = BatchChanges()
        c.topic("t").segments.append((0, Segment(0, 500, 1, 1, 2)))
        c.topic("t").compacted.extend(events)
        return c

    def clean(*events: tuple[int, ...]) -> PartitionView:
        st.merge("s", batch[0], changes(*events), everyone)
        batch[0] += 1
        return st.view("t", 0)

    assert clean((0, 100, t1)).cleaned_at == t1
    key = st.keys.partition_records("t", 0)
    record = rclient.hget(key, "0")
    assert st.merge("s", 0, changes((0, 400, t1 + 5)), everyone)[1]  # batch 0 replayed: changes nothing
    v = clean((0, 100, t1))  # the same event again
    assert (v.cleaned_up_to, v.cleaned_at) == (100, t1) and rclient.hget(key, "0") == record
    assert clean((0, 100, t1 + 60_000)).cleaned_at == t1  # the agent's re-announce, seen later: the clean's time stays
    assert (clean((0, 50, t1 + 70_000)).cleaned_at, st.view("t", 0).cleaned_up_to) == (t1, 100)  # older: nothing
    assert (clean((0, 200, t1 + 80_000)).cleaned_at, st.view("t", 0).cleaned_up_to) == (t1 + 80_000, 200)
    assert clean((0, 300)).cleaned_at is None  # moved without a time: the old time is not this clean's
    assert clean((0, 300, t1 + 90_000), (0, 300, t1 + 95_000)).cleaned_at == t1 + 90_000  # the first time given
    keys = [("t", 0)]
    assert st.views(keys) == st.views_pipelined(keys) == [replace(v, cleaned_up_to=300, cleaned_at=t1 + 90_000)]
    assert st.partition_numbers("t", [0]).cleaned_at.tolist() == [t1 + 90_000]
    [detail] = st.partition_details("t", [0], st.topic_groups("t", 0))
    assert detail.view.cleaned_at == t1 + 90_000


def test_a_record_with_a_clean_time_reads_as_before_to_a_build_that_does_not_know_it(rclient: redis.Redis) -> None:
    """The time follows the record's MessagePack array as a second value (lua/part.lua): the decoding of the builds
    before it takes the array alone, so a rollback reads every field it knows; a record without the time (written by
    such a build) reads as an unknown time."""
    st = RedisState(rclient)
    c = BatchChanges()
    c.topic("t").segments += [(0, Segment(0, 100, 5, 10, 6)), (0, Segment(100, 250, 7, 20, 8))]
    c.topic("t").compacted.append((0, 100, 1_800_000_000_000))
    st.merge("s", 0, c, everyone)
    key = st.keys.partition_records("t", 0)
    old_read = "local a = cmsgpack.unpack(redis.call('HGET', KEYS[1], '0'))"  # part.lua's decode before it
    assert rclient.eval(f"{old_read} return a", 1, key) == [100, 0, 0, 100, 1, 10, 6, 0, 150, 1, 20, 2]
    rclient.eval(f"{old_read} redis.call('HSET', KEYS[1], '0', cmsgpack.pack(a))", 1, key)  # its write: no time
    v = st.view("t", 0)
    assert (v.cleaned_up_to, v.cleaned_at, len(v.segments)) == (100, None, 2)
    assert st.views_pipelined([("t", 0)]) == [v]


def test_a_groups_deletion_and_commits_read_in_separate_batches_go_by_event_time(rclient: redis.Redis) -> None:
    """From the JSON commits topic a group's deletion and its commits come from different partitions, so a later
    batch can hold the older event. A deletion older than a commit already merged leaves it; a commit older than a
    deletion already merged never counts."""
    state = RedisState(rclient)

    def commit(batch_id: int, group: str, topic: str, offset: int, ts: int) -> None:
        c = BatchChanges()
        c.topic(topic).offsets.append((group, 0, offset))
        c.topic(topic).offset_ts[(group, 0)] = ts
        c.topic(topic).commit_ts[group] = ts
        state.merge("s", batch_id, c, everyone)

    def delete(batch_id: int, group: str, ts: int) -> None:
        state.merge("s", batch_id, BatchChanges(group_deletes=[group], group_delete_ts={group: ts}), everyone)

    commit(0, "new", "b", 500, ts=2_000)  # case B: the new group's commit is read first ...
    delete(1, "new", ts=1_000)  # ... its older deletion after: the commit stays
    assert state.group_offsets("b") == {("new", 0): 500}
    delete(2, "gone", ts=2_000)  # case A: the deletion is read first ...
    commit(3, "gone", "a", 500, ts=1_000)  # ... the older commit after: it never counts
    assert state.group_offsets("a") == {}
    commit(4, "gone", "a", 700, ts=3_000)  # a commit after the deletion: the group is back
    assert state.group_offsets("a") == {("gone", 0): 700}
    delete(1, "new", ts=1_000)  # a replayed batch changes nothing
    assert state.group_offsets("b") == {("new", 0): 500}


def replica_log(c: BatchChanges, partition: int, replica: int, cleaned: int | None, local: int | None, ts: int,
                replicas: list[int]) -> BatchChanges:  # fmt: skip
    c.topic("orders").replicas.append(ReplicaReport(partition, replica, cleaned, local, ts, replicas))
    return c


def test_every_replicas_log_is_kept_apart_from_the_leaders_and_read_by_every_path(rclient: redis.Redis) -> None:
    """`replica_log` reports (lua/replicas.lua): each replica's cleaner checkpoint, the time a report first gave it,
    and its local log start; the assignment the latest report gave; older reports change nothing; a replica that left
    the assignment is dropped; the partition's own `cleaned_up_to` (the leader's log) never moves by them; the views,
    explain's details and the controller's bulk read see the same; a topic's reset forgets them."""
    st = RedisState(rclient)
    c = BatchChanges()
    c.topic("orders").segments.append((0, Segment(0, 100, 5, 10, 6)))
    replica_log(c, 0, 1, 100, 0, 1_000, [1, 2, 3])
    replica_log(c, 0, 2, None, 0, 1_000, [1, 2, 3])
    touched, _ = st.merge("s", 0, c, everyone)
    assert touched == {"orders": {0}}
    v = st.view("orders", 0)
    assert v.cleaned_up_to is None  # a replica's report is not the leader's clean
    assert v.replicas == (
        ReplicaState(1, 100, 1_000, 0, reported=True), ReplicaState(2, None, None, 0, reported=True), ReplicaState(3)
    )  # fmt: skip
    # the same checkpoint later keeps its first time; a moved one takes the report's; an older report is ignored
    st.merge("s", 1, replica_log(replica_log(BatchChanges(), 0, 1, 100, 10, 2_000, [1, 2, 3]), 0, 2, 100, 0, 2_000,
                                 [1, 2, 3]), everyone)  # fmt: skip
    st.merge("s", 2, replica_log(BatchChanges(), 0, 2, 50, 0, 1_500, [1, 2, 3]), everyone)
    assert st.view("orders", 0).replicas == (
        ReplicaState(1, 100, 1_000, 10, True), ReplicaState(2, 100, 2_000, 0, True), ReplicaState(3)
    )  # fmt: skip
    # reassigned: replica 1 left, 4 joined; 1's log is forgotten
    st.merge("s", 3, replica_log(BatchChanges(), 0, 4, None, 0, 3_000, [2, 3, 4]), everyone)
    expected = (ReplicaState(2, 100, 2_000, 0, True), ReplicaState(3), ReplicaState(4, None, None, 0, True))
    assert st.view("orders", 0).replicas == expected
    assert st.views_pipelined([("orders", 0)])[0].replicas == expected
    groups = st.topic_groups("orders")
    assert st.partition_details("orders", [0], groups)[0].view.replicas == expected
    nums, _ = st.read_chunks([("orders", [0])])[0]
    assert nums.replicas.tolist() == [[0, 2, 100, 2_000, 1], [0, 3, -1, -1, 0], [0, 4, -1, -1, 1]]
    two = st.read_chunks([("orders", [1, 0]), ("clicks", [0])])  # the pipelined read: rows in the order asked
    assert two[0][0].replicas[:, 0].tolist() == [1, 1, 1] and len(two[1][0].replicas) == 0
    st.reset_topic("orders", "test", 4_000)
    assert st.view("orders", 0).replicas == ()
