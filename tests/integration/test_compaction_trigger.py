"""The controller's side of the compaction service against the real broker and Redis: which topics it watches, the
dry-run record instead of a run, and the delete cap it gives the controller (from the manifest mirror, refreshed from
the manifest topic when Redis has none)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from compactd.compaction.manifest import Manifest, ViewPartition
from compactd.compaction.service import Compactor
from compactd.compaction.takeover import Takeovers
from compactd.compaction.trigger import CompactionTrigger
from compactd.control.metrics import Metrics
from compactd.model import ActionRecord
from compactd.policy.thresholds import resolve
from tests.support.compaction import history, produce


def trigger(job_settings, redis_url: str, layers: dict[str, dict[str, Any]], known: list[str], ledger: Any = None):
    """`ledger`: the retention takeovers are made, recorded there (segment events taken as known)."""
    s = job_settings()
    published: list[ActionRecord] = []

    def no_spark() -> Any:
        pytest.fail("a dry-run topic must not start a run")

    comp = Compactor(s, redis.Redis.from_url(redis_url), lambda: layers, no_spark)
    from prometheus_client import CollectorRegistry

    takeovers = None if ledger is None else Takeovers(comp.cluster, ledger, comp.clock)
    t = CompactionTrigger(
        comp, Metrics(CollectorRegistry()), lambda: layers, lambda: known, published.append, comp.clock,
        takeovers=takeovers, segments_known=None if ledger is None else lambda _topic: True,
    )  # fmt: skip
    return t, published


def test_watched_topics_and_a_dry_run_record_instead_of_a_run(cluster, job_settings, redis_url) -> None:
    topic, other = cluster.name("dry"), cluster.name("other")
    cluster.create(topic, 1)
    produce(cluster, topic, history(seed=3, n=20, keys=5, partitions=1), partitions=1)
    layers = {f"topic:{topic}": {"compaction.service": True}}  # dry.run: the default
    own = job_settings().topics.segments
    t, published = trigger(job_settings, redis_url, layers, [topic, other, own, "__consumer_offsets"])
    assert t.topics() == [topic]
    everywhere = {"global": {"compaction.service": True}}
    t2, _ = trigger(
        job_settings, redis_url, everywhere, [topic, other, own, "__consumer_offsets", f"{topic}.compacted"]
    )
    assert t2.topics() == sorted([topic, other])  # never internal topics, compactd's own, or views

    t.tick(now=True)
    t.tick(now=True)  # said once, not on every check
    assert [(r.action, r.status, r.reason, r.dry_run) for r in published] == [
        ("compact_view", "dry_run", "first_generation", True)
    ]
    assert t.running == {}


def test_the_delete_cap_comes_from_the_published_manifest(cluster, job_settings, redis_url) -> None:
    topic = cluster.name("capped")
    cluster.create(topic, 2)
    on = {f"topic:{topic}": {"compaction.service": True}}
    t, _ = trigger(job_settings, redis_url, on, [topic])
    th = resolve(on, topic)
    now = t.clock()
    assert t.caps.cap(topic, 0, th, now, fresh=True) == 0  # on, nothing published: nothing may be deleted
    assert t.caps.cap(topic, 0, resolve({}, topic), now, fresh=True) is None  # no view, no cap

    parts = {"0": ViewPartition(40, 0, 10), "1": ViewPartition(7, 0, 3)}
    manifest = Manifest(topic, f"{topic}.compacted", 1, partitions=parts, finished_at=now)
    t.compactor.log.write(manifest)  # published on the manifest topic only: Redis has no mirror yet
    t2, _ = trigger(job_settings, redis_url, on, [topic])  # a new job: refreshes the mirror from the topic
    assert t2.caps.cap(topic, 0, th, now) == 40 and t2.caps.cap(topic, 1, th, now) == 7
    assert t2.compactor.state.manifest(topic) == manifest
    # a topic whose service was turned off keeps its cap while its view exists
    assert t2.caps.cap(topic, 0, resolve({}, topic), now, fresh=True) == 40


def test_a_recreated_source_caps_deletes_at_zero_until_a_new_view_is_published(
    cluster, job_settings, redis_url
) -> None:
    """The view describes the old log: nothing of the new one is in it, so nothing of it may be deleted, whoever then
    publishes the new view (here: a manifest written as `compactd compact` would)."""
    topic = cluster.name("reborn")
    cluster.create(topic, 1)
    cluster.create(f"{topic}.compacted", 1)
    produce(cluster, topic, history(seed=4, n=50, keys=5, partitions=1), partitions=1)
    on = {f"topic:{topic}": {"compaction.service": True, "dry.run": True}}
    t, published = trigger(job_settings, redis_url, on, [topic])
    th, now = resolve(on, topic), t.clock()
    old = Manifest(topic, f"{topic}.compacted", 1, partitions={"0": ViewPartition(50, 0, 5)}, finished_at=now, run="a")
    t.compactor.log.write(old)
    t.compactor.state.mirror(old)
    t.tick(now=True)
    assert t.caps.cap(topic, 0, th, now, fresh=True) == 50  # the same log: its horizon caps

    cluster.recreate(topic, 1)
    produce(cluster, topic, history(seed=5, n=10, keys=5, partitions=1), partitions=1)  # ends below the horizon
    t.tick(now=True)
    assert t.caps.cap(topic, 0, th, now, fresh=True) == 0
    assert published[-1].reason == "first_generation" and published[-1].status == "dry_run"

    new = Manifest(topic, f"{topic}.compacted", 2, partitions={"0": ViewPartition(10, 5, 9)}, finished_at=now, run="b")
    t.compactor.log.write(new)
    t.compactor.state.mirror(new)
    t.tick(now=True)
    assert t.caps.cap(topic, 0, th, now, fresh=True) == 10


def test_explain_shows_when_the_sources_retention_reaches_past_the_horizon(cluster, job_settings, redis_url) -> None:
    """The job reads the source's retention.ms from the cluster (DescribeConfigs) and mirrors it; `explain`, which
    reads Redis only, shows the time left before that retention may delete what the view does not hold yet."""
    from compactd.app.explain_cli import explain
    from compactd.explain.text import format_text
    from compactd.model import Segment
    from compactd.state.changes import BatchChanges
    from compactd.state.redis_store import RedisState

    day = 86_400_000
    topic = cluster.name("aging")
    cluster.create(topic, 1, {"retention.ms": str(day)})
    cluster.create(f"{topic}.compacted", 1)
    produce(cluster, topic, history(seed=6, n=30, keys=5, partitions=1), partitions=1)
    on = {f"topic:{topic}": {"compaction.service": True, "dry.run": True}}
    t, _ = trigger(job_settings, redis_url, on, [topic])
    now = t.clock()
    parts = {"0": ViewPartition(20, 0, 5, beyond_since=now - 3_600_000)}
    published = Manifest(topic, f"{topic}.compacted", 1, partitions=parts, finished_at=now, run="a")
    t.compactor.log.write(published)
    t.compactor.state.mirror(published)
    t.tick(now=True)
    assert t.compactor.state.retention(topic)["retention_ms"] == day  # read from the broker's topic config

    s = job_settings()
    st = RedisState(redis.Redis.from_url(redis_url), s.key_prefix)
    changes = BatchChanges()
    changes.topic(topic).segments.append((0, Segment(0, 30, now - 3_600_000, 100, now - 3_000_000)))
    st.merge("s", 0, changes, lambda g, tp: True)
    [e] = explain(st, s, f"{topic}/0", now)
    assert e["compacted_view"]["generation"] == 1 and e["compacted_view"]["retention_left_ms"] == day - 3_600_000
    assert "reaches past the horizon in 23h00m at the earliest" in format_text(e)


def test_a_retention_takeover_sets_minus_one_and_always_puts_the_original_back(
    cluster, job_settings, redis_url
) -> None:
    """Ground truth is the broker's topic config. Taken over: retention.ms -1 on the topic, the original recorded on
    the ledger first, applied as forced retention; the key turned off — by a new job after Redis was flushed — puts
    the original back; a value someone set meanwhile is left as it is."""
    from compactd.sinks.nudge_ledger import NudgeLedger

    day = 86_400_000
    topic = cluster.name("taken")
    cluster.create(topic, 1, {"retention.ms": str(day)})
    cluster.create(f"{topic}.compacted", 1)
    produce(cluster, topic, history(seed=7, n=30, keys=5, partitions=1), partitions=1)
    s = job_settings()
    on = {f"topic:{topic}": {"compaction.service": True, "compaction.retention.takeover": True, "dry.run": False}}
    published = Manifest(topic, f"{topic}.compacted", 1, partitions={"0": ViewPartition(30, 0, 5)}, run="a")

    def job(layers: dict[str, dict[str, Any]]):
        return trigger(job_settings, redis_url, layers, [topic], NudgeLedger(s.kafka_connection(), s.topics.nudges))

    def broker_retention() -> tuple[str | None, int | None, str]:
        return job(on)[0].compactor.cluster.topic_config(topic)

    t, records = job(on)
    t.compactor.log.write(published)
    t.compactor.state.mirror(published)
    t.tick(now=True)
    assert broker_retention()[:2] == ("-1", None)
    assert [(r.action, r.reason, r.detail["original"]) for r in records] == [
        ("take_retention", "retention_takeover", str(day))
    ]
    # compactd applies it now, capped at the horizon
    assert resolve(t.takeovers.overlay(on), topic).forced_retention_ms == day
    assert t.compactor.state.retention(topic)["takeover"]["original"] == str(day)  # what `explain` shows
    t.tick(now=True)
    assert len(records) == 1  # taken once

    redis.Redis.from_url(redis_url).flushall()  # a state loss: the ledger still knows the original
    off = {f"topic:{topic}": {"compaction.service": True, "dry.run": False}}
    t2, records2 = job(off)
    t2.tick(now=True)
    assert broker_retention()[:2] == (str(day), day)
    assert [(r.action, r.reason) for r in records2] == [("restore_config", "takeover_ended")]
    assert NudgeLedger(s.kafka_connection(), s.topics.nudges).load_takeovers() == {}

    t3, _ = job(on)  # taken again, then someone sets a value of their own: it is theirs, left as it is
    t3.tick(now=True)
    assert broker_retention()[0] == "-1"
    t3.compactor.cluster.set_retention(topic, str(2 * day))
    t3.layers = lambda: {}  # the service turned off for the topic
    t3.tick(now=True)
    assert broker_retention()[:2] == (str(2 * day), 2 * day)
    assert topic not in t3.takeovers.current()
