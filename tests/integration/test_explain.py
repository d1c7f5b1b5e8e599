"""`compactd explain` against real Redis: state built by the merge and the controller, one test per blocking cause."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from compactd.app.cli import main
from compactd.app.explain_cli import explain
from compactd.control.controller import Controller
from compactd.control.metrics import Metrics
from compactd.local.servers import Service, redis_cluster
from compactd.model import ActionRecord, Segment
from compactd.settings import Settings
from compactd.sinks.recording import RecordingSink
from compactd.state.changes import BatchChanges
from compactd.state.redis_store import RedisState

H = 3_600_000
T0 = 1_800_000_000_000
LIVE = {"dry.run": False, "consumed.retention.ms": H}


def everyone(group: str, topic: str) -> bool:
    return True


def settings(redis_url: str, thresholds: dict[str, dict[str, Any]]) -> Settings:
    return Settings(redis_url=redis_url, thresholds=thresholds)


def state(rclient: redis.Redis) -> RedisState:
    return RedisState(rclient, prefix=Settings().key_prefix)  # the prefix `compactd explain` reads


def segments(topic: str, partitions: int = 1, closed_h: tuple[int, ...] = (4, 3, 1)) -> BatchChanges:
    """Per partition, closed segments of 100 offsets and 1000 bytes each, closed `closed_h` hours before T0."""
    c = BatchChanges()
    for p in range(partitions):
        for i, h in enumerate(closed_h):
            c.topic(topic).segments.append((p, Segment(100 * i, 100 * (i + 1), T0 - h * H, 1000, T0 - h * H)))
    return c


def commits(topic: str, *items: tuple[str, int, int, int], into: BatchChanges | None = None) -> BatchChanges:
    """(group, partition, offset, commit ts), added to `into` when given."""
    c = into if into is not None else BatchChanges()
    for group, p, offset, ts in items:
        c.topic(topic).offsets.append((group, p, offset))
        c.topic(topic).commit_ts[group] = max(ts, c.topic(topic).commit_ts.get(group, ts))
    return c


def controller(st: RedisState, sink: RecordingSink, clock: list[int], layers: dict, **kw: Any) -> Controller:
    return Controller(st, layers, sink, None, Metrics(CollectorRegistry()), clock=lambda: clock[0], **kw)


def one(rclient: redis.Redis, redis_url: str, target: str, thresholds: dict, now: int = T0) -> dict[str, Any]:
    [e] = explain(state(rclient), settings(redis_url, thresholds), target, now)
    return e


def test_lowest_group_is_named_with_its_last_commit_time(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    st.merge("s", 0, segments("orders"), everyone)
    st.merge("s", 1, commits("orders", ("billing", 0, 150, T0 - 2 * H), ("search", 0, 250, T0 - 60_000)), everyone)
    # a later batch moves search on; billing's commit time is the latest it made, whatever came later for others
    st.merge("s", 2, commits("orders", ("search", 0, 260, T0 - 1000)), everyone)
    e = one(rclient, redis_url, "orders/0", {"global": LIVE})
    r = e["rules"]["consumed_retention"]
    [lowest] = [b for b in r["blocked_by"] if b["cause"] == "lowest_group"]
    assert (lowest["group"], lowest["offset"], lowest["last_commit"]) == ("billing", 150, T0 - 2 * H)
    assert r["now"]["min_committed"] == 150 and r["now"]["counted_groups"] == 2
    assert r["frees"] == {"from": 0, "to": 100, "offsets": 100, "bytes": 1000}  # read by everyone, old enough
    assert r["held_back"] == {"from": 100, "to": 200, "offsets": 100, "bytes": 1000}  # old enough, billing behind


def test_group_delete_forgets_its_commit_time(rclient: redis.Redis) -> None:
    st = state(rclient)
    st.merge("s", 0, commits("orders", ("billing", 0, 150, T0)), everyone)
    assert st.topic_groups("orders").commit_ts == {"billing": T0}
    c = BatchChanges()
    c.group_deletes = ["billing"]
    st.merge("s", 1, c, everyone)
    assert st.topic_groups("orders").commit_ts == {}
    assert rclient.exists(st.keys.commit_times("orders")) == 0  # nothing left behind


def test_counted_group_without_a_position_is_named(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    st.merge("s", 0, segments("orders", partitions=2), everyone)
    st.merge("s", 1, commits("orders", ("billing", 0, 300, T0), ("billing", 1, 300, T0)), everyone)
    member = BatchChanges()
    member.assignments = {"new-app": {"orders": [0, 1]}}  # members assigned, nothing committed yet
    st.merge("s", 2, member, everyone)
    st.merge("s", 3, commits("orders", ("late", 1, 300, T0 - H)), everyone)  # committed on partition 1 only
    r = one(rclient, redis_url, "orders/0", {"global": LIVE})["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and [b["cause"] for b in r["blocked_by"]] == ["group_without_position"]
    named = {g["group"]: g for g in r["blocked_by"][0]["groups"]}
    assert set(named) == {"late", "new-app"}
    assert named["new-app"]["assigned"] and named["new-app"]["last_commit"] is None
    assert named["late"]["last_commit"] == T0 - H and not named["late"]["assigned"]
    assert r["frees"] is None and r["held_back"]["to"] == 200


def test_closed_readiness_gate_is_the_cause_for_deletes(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    clock = [T0]
    ctl = controller(st, RecordingSink(), clock, {"global": LIVE}, deletes_allowed=lambda: False)
    batch = commits("orders", ("billing", 0, 300, T0), into=segments("orders"))
    ctl.on_batch("s", 0, batch)
    gate = {"open": False, "why": "offsets not caught up", "since": T0 - 600_000}
    rclient.hset(st.keys.state_health, "gate", json.dumps(gate))  # as the running job writes it
    e = one(rclient, redis_url, "orders/0", {"global": LIVE})
    r = e["rules"]["consumed_retention"]
    assert e["gate"] == gate and r["state"] == "blocked"
    causes = {b["cause"]: b for b in r["blocked_by"]}
    assert causes["gate_closed"]["since"] == T0 - 600_000 and "offsets not caught up" in causes["gate_closed"]["why"]
    assert causes["skipped"]["why"] == "skipped at send time: offsets not caught up"  # the controller's record
    assert "gate_closed" not in {b["cause"] for b in e["rules"]["max_compaction_lag"]["blocked_by"]}


def test_gate_not_written_by_any_job_is_unknown(rclient: redis.Redis, redis_url: str) -> None:
    state(rclient).merge("s", 0, segments("orders"), everyone)
    e = one(rclient, redis_url, "orders/0", {"global": LIVE})
    assert e["gate"] == {"open": None, "why": "unknown (no job has written it)", "since": None}


def test_overdue_compaction_names_the_dirty_segment_and_its_age(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    batch = segments("orders")
    batch.topic("orders").compacted.append((0, 100))  # the cleaner has done [0, 100): [100, 200) is the oldest dirty
    st.merge("s", 0, batch, everyone)
    e = one(rclient, redis_url, "orders/0", {"global": {"max.compaction.lag.ms": H}})
    r = e["rules"]["max_compaction_lag"]
    dirty, dry = r["blocked_by"]
    assert (dirty["cause"], dirty["base_offset"], dirty["end_offset"], dirty["overdue_ms"]) == (
        "dirty_segment",
        100,
        200,
        2 * H,
    )
    assert dry["cause"] == "dry_run" and "(default)" in dry["why"] and r["state"] == "blocked"  # nothing is sent
    assert r["now"]["dirty_segment"]["dirty_for_ms"] == 3 * H and r["now"]["dirty_segments"] == 2
    assert r["threshold"] == {"value": H, "scope": "global (file)"} and e["worst"]["overdue_ms"] == 2 * H


def test_topic_excluded_by_a_config_event_blocks_every_rule(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    st.merge("s", 0, segments("orders"), everyone)
    st.save_config_layer("topic:orders", {"values": {"topics.exclude": ["ord.*"]}, "version": 2, "ts": T0})
    st.save_config_layer("global", {"values": {"max.compaction.lag.ms": H}, "version": 3, "ts": T0})
    e = one(rclient, redis_url, "orders/0", {"global": {"dry.run": False, "forced.retention.ms": 2 * H}})
    assert e["excluded"] == "excluded by topics.exclude" and e["next"] is None
    for name in ("max_compaction_lag", "forced_retention"):
        r = e["rules"][name]
        assert r["state"] == "blocked" and r["blocked_by"][-1]["cause"] == "topic_excluded"
    # the file's base layer and the job's applied layers, each key reported with where it comes from
    assert e["rules"]["max_compaction_lag"]["threshold"]["scope"] == "global (config v3)"
    assert e["rules"]["forced_retention"]["threshold"]["scope"] == "global (file)"


def test_refused_send_is_reported_in_backoff_until_its_retry(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    clock = [T0]
    sink = RecordingSink(lambda rec: rec.with_status("failed", error="timed out"))
    layers = {"global": {**LIVE, "action.backoff.ms": 5000}}
    batch = commits("orders", ("billing", 0, 300, T0), into=segments("orders"))
    controller(st, sink, clock, layers).on_batch("s", 0, batch)
    clock[0] += 1000
    r = one(rclient, redis_url, "orders/0", layers, now=clock[0])["rules"]["consumed_retention"]
    assert r["state"] == "blocked" and [b["cause"] for b in r["blocked_by"]] == ["backoff"]
    assert r["blocked_by"][0]["retry_at"] == T0 + 5000 and "timed out" in r["blocked_by"][0]["why"]
    assert r["next"]["at"] == T0 + 5000 and r["action"]["detail"]["try"] == 1


def test_compaction_held_by_the_concurrency_cap(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    clock = [T0]
    layers = {"global": {"dry.run": False, "max.compaction.lag.ms": H, "compaction.max.concurrent": 1}}
    controller(st, RecordingSink(), clock, layers).on_batch("s", 0, segments("orders", partitions=2))
    es = {e["partition"]: e for e in explain(st, settings("", layers), "orders", T0)}
    sent, held = es["orders/0"]["rules"]["max_compaction_lag"], es["orders/1"]["rules"]["max_compaction_lag"]
    assert sent["state"] == "acting" and sent["action"]["status"] == "sent"
    assert held["state"] == "blocked" and held["blocked_by"][-1]["cause"] == "held_by_cap"
    assert "compaction.max.concurrent: 1 of 1 nudges in flight" in held["blocked_by"][-1]["why"]


def test_freed_offsets_and_bytes_and_the_next_deadline(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    clock = [T0]
    layers = {"global": {"dry.run": True, "consumed.retention.ms": 2 * H}}
    batch = commits("orders", ("billing", 0, 300, T0), into=segments("orders"))
    controller(st, RecordingSink(), clock, layers).on_batch("s", 0, batch)
    e = one(rclient, redis_url, "orders/0", layers)
    r = e["rules"]["consumed_retention"]
    # [0,200) is old enough and read by everyone: decided, as a dry run; [200,300) closed an hour ago is too young
    assert r["frees"] == {"from": 0, "to": 200, "offsets": 200, "bytes": 2000} and r["held_back"] is None
    assert r["action"]["status"] == "dry_run" and r["action"]["before_offset"] == 200
    assert [b["cause"] for b in r["blocked_by"]] == ["dry_run"]
    # the dry run is decided again after action.retry.ms: the job's deadline and explain's next step agree
    assert e["deadline"] == st.deadline("orders", 0) == T0 + 300_000
    assert e["next"] == {"at": T0 + 300_000, "what": "delete_records <200 decided again"}
    assert e["last_action"]["status"] == "dry_run" and e["worst"]["blocked_bytes"] == 2000


def test_topic_is_explained_worst_first(rclient: redis.Redis, redis_url: str) -> None:
    st = state(rclient)
    batch = segments("orders", partitions=3, closed_h=(5,))
    batch.topic("orders").segments.append((2, Segment(100, 200, T0 - 9 * H, 10, T0 - 9 * H)))  # dirtiest: p2
    st.merge("s", 0, batch, everyone)
    st.merge("s", 1, commits("orders", ("g", 0, 0, T0), ("g", 1, 100, T0), ("g", 2, 100, T0)), everyone)
    got = explain(st, settings(redis_url, {"global": {"max.compaction.lag.ms": H}}), "orders", T0)
    assert [e["partition"] for e in got] == ["orders/2", "orders/0", "orders/1"]


def test_cli_prints_text_and_json_and_exits_2_for_what_it_does_not_know(
    rclient: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    st = state(rclient)
    st.merge("s", 0, segments("orders", partitions=2), everyone)
    assert main(["explain", "orders/1", "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("orders/1 — ") and "consumed retention" in out and "next" in out
    assert main(["explain", "orders", "--json", "--redis-url", redis_url]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["partition"] for r in rows) == ["orders/0", "orders/1"]
    assert main(["explain", "orders", "--json", "--limit", "1", "--redis-url", redis_url]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    for target in ("orders/7", "nope", "nope/0"):
        assert main(["explain", target, "--redis-url", redis_url]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("compactd: error: unknown ") and "\n" not in err


def test_cli_redis_unreachable_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "orders/0", "--redis-url", "redis://127.0.0.1:1/0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("compactd: error: Redis unreachable at redis://127.0.0.1:1/0") and "\n" not in err


def test_live_record_is_read_back_as_the_controller_wrote_it(rclient: redis.Redis) -> None:
    st = state(rclient)
    st.merge("s", 0, segments("orders"), everyone)
    rec = ActionRecord("i", "compact", "orders", 0, "max_compaction_lag", False, T0, "pending", delay_ms=1)
    st.enqueue(rec)
    [d] = st.partition_details("orders", [0], st.topic_groups("orders"))
    assert d.records == (rec,) and d.last is None and d.deadline is None


def varied_topic(st: RedisState, partitions: int, layers: dict[str, Any]) -> None:
    """A topic whose partitions differ in every way the ranking reads: segment ages and sizes, what the cleaner did,
    the log start, the groups' offsets (one group without a position on some), and the records the controller
    decided and sent, refused or skipped."""
    batch = BatchChanges()
    tc = batch.topic("orders")
    for p in range(partitions):
        for i in range(p % 5):
            closed = T0 - (i * 7 + p % 3) * H // 2
            tc.segments.append(
                (p, Segment(100 * i, 100 * (i + 1), closed - (p % 4) * H, 1000 * (1 + (p * i) % 3), closed))
            )
        if p % 3 == 0:
            tc.compacted.append((p, 100 * (p % 4)))
        if p % 7 == 6:
            tc.log_start.append((p, 100))
        commits("orders", ("billing", p, 50 * (p % 9), T0 - H), into=batch)
        if p % 4:
            commits("orders", ("search", p, 400 - 30 * (p % 6), T0 - 60_000), into=batch)
    st.merge("s", 0, commits("orders", ("search", 1, 10, T0), into=BatchChanges()), everyone)
    refuse_odd = RecordingSink(lambda rec: rec.with_status("failed" if rec.partition % 2 else "sent", error="no"))
    controller(st, refuse_odd, [T0], layers).on_batch("s", 1, batch)


@pytest.mark.parametrize("gate_open", [True, False])
def test_the_worst_partitions_shown_are_the_worst_of_all_explanations(rclient: redis.Redis, gate_open: bool) -> None:
    """What the ranking picks (a few numbers per partition, over arrays) is what sorting every explanation gives."""
    st = state(rclient)
    layers = {"global": {**LIVE, "max.compaction.lag.ms": 3 * H, "forced.retention.ms": 3 * H}}
    varied_topic(st, 60, layers)
    rclient.hset(st.keys.state_health, "gate", json.dumps({"open": gate_open, "why": "", "since": T0}))
    cfg = settings("", {"global": {**layers["global"], "dry.run": True}})  # a config change since: dry.run again
    every = explain(st, cfg, "orders", T0 + H)
    assert len({json.dumps(e["worst"]) for e in every}) > 10  # varied enough to order
    for limit in (1, 7, 20, 59):
        assert explain(st, cfg, "orders", T0 + H, limit=limit) == every[:limit]


def test_default_shows_the_20_worst_then_says_how_many_more_and_how_to_see_them(
    rclient: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state(rclient).merge("s", 0, segments("orders", partitions=23), everyone)
    assert main(["explain", "orders", "--redis-url", redis_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("orders/") for line in lines) == 20
    assert (
        lines[-1]
        == "... 3 more partition(s) of orders rank below these 20: --limit 0 shows all 23, --limit N the N worst"
    )
    assert main(["explain", "orders", "--limit", "0", "--redis-url", redis_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("orders/") for line in lines) == 23 and "more partition" not in lines[-1]
    assert main(["explain", "orders", "--json", "--redis-url", redis_url]) == 0
    out = capsys.readouterr()
    assert len([json.loads(line) for line in out.out.splitlines()]) == 20  # stdout stays one object per line
    assert out.err.strip().startswith("... 3 more partition(s) of orders")
    for args in (["orders", "--limit", "23"], ["orders/4"]):
        assert main(["explain", *args, "--redis-url", redis_url]) == 0
        assert "more partition" not in capsys.readouterr().out


def test_in_flight_count_is_the_sent_compactions_of_every_topic(rclient: redis.Redis) -> None:
    st = state(rclient)
    recs = []
    for p in range(1500):  # several scan pages
        status = ("sent", "pending", "dry_run", "skipped")[p % 4]
        recs.append(ActionRecord(f"c{p}", "compact", f"t{p % 3}", p, "max_compaction_lag", False, T0, status))
    recs.append(ActionRecord("d", "delete_records", "t0", 0, "forced_retention", False, T0, "sent", before_offset=1))
    recs.append(
        ActionRecord("x", "compact", "t0", 9999, "max_compaction_lag", False, T0, "pending", detail={"was": "sent"})
    )
    st.enqueue(*recs)
    assert st.compactions_in_flight() == 375
    st.answer(T0, recs[0])
    assert st.compactions_in_flight() == 374


def test_live_deletes_are_the_topics_own(rclient: redis.Redis) -> None:
    st = state(rclient)
    mine = ActionRecord("a", "delete_records", "orders", 3, "consumed_retention", False, T0, "pending", before_offset=1)
    st.enqueue(
        mine,
        ActionRecord("b", "delete_records", "orders2", 3, "consumed_retention", False, T0, "sent", before_offset=1),
        ActionRecord("c", "compact", "orders", 4, "max_compaction_lag", False, T0, "pending"),
    )
    assert st.live_deletes("orders") == {3: mine}


@pytest.fixture(scope="module")
def cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Service]]:
    nodes = redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield nodes
    for node in nodes:
        node.stop()


def test_same_explanations_on_a_cluster_as_on_one_server(cluster_nodes: list[Service], rclient: redis.Redis) -> None:
    """The read script stays within its topic's slot, records and deadlines are read from theirs."""
    layers = {"global": {**LIVE, "max.compaction.lag.ms": H, "compaction.max.concurrent": 1}}

    def scenario(st: RedisState) -> list[dict[str, Any]]:
        batch = commits("orders", ("billing", 0, 150, T0 - H), ("billing", 1, 300, T0 - H), into=segments("orders", 3))
        controller(st, RecordingSink(), [T0], layers).on_batch("s", 0, batch)
        st.r.hset(st.keys.state_health, "gate", json.dumps({"open": True, "why": "", "since": T0}))
        return explain(st, settings("", layers), "orders", T0)

    single = scenario(state(rclient))
    on_cluster = Settings(redis_url=f"redis://127.0.0.1:{cluster_nodes[0].port}/0", redis_cluster=True).redis_state()
    on_cluster.start()
    on_cluster.r.flushall()
    assert scenario(on_cluster) == single
    # equally overdue; then by bytes held back: p2 (no position, all of [0,200)), p0 (billing at 150), p1 (none)
    assert [e["partition"] for e in single] == ["orders/2", "orders/0", "orders/1"]


def test_explaining_every_partition_into_a_file_counts_them_on_the_terminal(
    rclient: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`explain TOPIC --limit 0 > file` on a terminal: a progress line on stderr counts the partitions written, and
    stdout holds exactly what it holds without one."""
    import functools
    import io

    from rich.console import Console

    from compactd.app import explain_cli as explain_mod
    from compactd.app.progress import progress

    state(rclient).merge("s", 0, segments("orders", partitions=1200), everyone)
    assert main(["explain", "orders", "--limit", "0", "--json", "--redis-url", redis_url]) == 0
    plain = capsys.readouterr().out
    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=120)
    monkeypatch.setattr(explain_mod, "progress", functools.partial(progress, enabled=True, console=console))
    assert main(["explain", "orders", "--limit", "0", "--json", "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out

    def partitions(text: str) -> list[str]:
        return [json.loads(line)["partition"] for line in text.splitlines()]

    assert partitions(out) == partitions(plain) and len(partitions(plain)) == 1200
    drawn = terminal.getvalue()
    assert "explain orders: explaining" in drawn and "1,200/1,200 partitions" in drawn
