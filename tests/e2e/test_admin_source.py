"""The whole loop where compactd is only a client of the cluster: no log-dir agent, no `__consumer_offsets`.

Real consumer groups consume and commit on a topic; the admin agent (the code `compactd agent --admin` runs) polls
the Admin API and publishes; the Structured Streaming job runs with `offsets_source: admin`. Ground truth at each step
is the broker's low watermark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import ConsumerGroupType

from compactd.agent.admin_agent import AdminAgent, AdminPublisher, run_admin_agent
from compactd.agent.admin_poll import AdminPoll, Event
from compactd.app.explain_cli import explain
from compactd.clock import now_ms
from compactd.control.agent_watch import AGENT_WAIT
from compactd.daemon import gate
from compactd.daemon.application import Application
from compactd.kafka.config import KafkaConnection
from compactd.policy.plan import NOT_CAUGHT_UP
from tests.support.groups import consume_and_commit
from tests.support.waiting import holds_for

RETENTION_MS = 1000
GRACE_MS = 3000


class HeldMarks(AdminPublisher):
    """The agent's publisher, with its poll marks held back until `marking` is set: the job sees the agent's events
    but not yet a complete poll."""

    marking = threading.Event()

    def mark(self, ev: Event) -> None:
        if self.marking.is_set():
            super().mark(ev)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.spark
def test_deletes_follow_the_slower_real_group_and_a_deleted_group_stops_holding(spark, cluster, job_settings) -> None:
    topic = cluster.name("orders")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    fast, slow = cluster.name("fast"), cluster.name("slow")
    # max.compaction.lag.ms too: every slice is "dirty" to a cleaner nobody sees, and no nudge may follow
    rules = {"consumed.retention.ms": RETENTION_MS, "max.compaction.lag.ms": RETENTION_MS}
    settings = job_settings(
        offsets_source="admin",
        trigger_interval_ms=300,
        thresholds={"global": {"dry.run": False}, f"topic:{topic}": rules},
    )
    t = settings.topics
    for name in (t.segments, t.commits, t.agent):
        cluster.create(name, 1)
    conn = KafkaConnection(cluster.bootstrap)
    poll = AdminPoll(slice_ms=60_000, group_grace_ms=GRACE_MS, counts=lambda g: g in (fast, slow))
    agent = AdminAgent(conn, poll, frozenset(settings.own_topics()))
    HeldMarks.marking.clear()
    publisher = HeldMarks(conn, t.segments, t.commits, t.agent)
    state = settings.redis_state()
    stop = threading.Event()

    def slices() -> list[tuple[int, int]]:
        return [(s.base_offset, s.end_offset) for s in state.view(topic, 0).segments]

    def low() -> int:
        return cluster.watermarks(topic)[0]

    with Application(settings, spark=spark) as job:
        threads = [
            threading.Thread(target=job.run, kwargs={"stop": stop}),
            threading.Thread(
                target=run_admin_agent, args=(agent, publisher, 0.4, stop), kwargs={"cluster": settings.cluster}
            ),
        ]
        for th in threads:
            th.start()
        try:
            # three bursts of records, each closed by the agent as one time slice once its partition goes quiet
            for end in (40, 80, 100):
                cluster.fill(topic, end - (slices()[-1][1] if slices() else 0))
                wait_for(lambda e=end: slices() and slices()[-1][1] == e, f"slice ending at {end} not merged")
            consume_and_commit(cluster.bootstrap, fast, topic, 100, "consumer")  # a KIP-848 group: listed too
            consume_and_commit(cluster.bootstrap, slow, topic, 40)
            kinds = {g.group_id: g.type for g in cluster.admin.list_consumer_groups().result(10).valid}
            assert (kinds[fast], kinds[slow]) == (ConsumerGroupType.CONSUMER, ConsumerGroupType.CLASSIC)
            wait_for(lambda: state.view(topic, 0).min_committed == 40, "the groups' commits not merged")

            # the agent's events are all there, but no poll of it is marked complete: deletes wait
            def held() -> bool:
                return any(
                    a["action"] == "delete_records" and a["status"] == "skipped" and a["detail"]["why"] == NOT_CAUGHT_UP
                    for a in cluster.read_all(t.actions)
                )

            wait_for(held, "a due delete was not held by the gate")
            assert (state.gate() or {}).get("why") == AGENT_WAIT
            assert low() == 0

            HeldMarks.marking.set()  # the next poll is marked: the gate is armed, the delete goes
            wait_for(lambda: low() == 40, "no delete below the slower group's commit after the mark")

            consume_and_commit(cluster.bootstrap, slow, topic, 90)  # mid-slice: [80, 100) is not all read
            wait_for(lambda: low() == 80, "the next delete did not follow the slower group")
            holds_for("the log start at the slower group's commit", low, lambda lw: lw == 80, 2 * RETENTION_MS / 1000)

            cluster.admin.delete_consumer_groups([slow])[slow].result(10)
            wait_for(lambda: low() == 100, "a deleted group still held the topic after the grace", GRACE_MS / 1000 + 30)
        finally:
            stop.set()
            for th in threads:
                th.join(120)
    actions = cluster.read_all(t.actions)
    sent = [(a["action"], a["before_offset"], a["reason"]) for a in actions if a["status"] == "sent"]
    assert sent == [("delete_records", n, "consumed_retention") for n in (40, 80, 100)]
    assert not [a for a in actions if a["action"] == "compact"]  # the cleaner cannot be seen: no nudge decided


@pytest.mark.spark
def test_a_job_whose_sources_nothing_writes_says_so_in_one_line_and_explain_names_it(
    spark, cluster, job_settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gate, "NO_SOURCE_S", 1.0)
    topic, group = cluster.name("orders"), cluster.name("billing")
    settings = job_settings(
        offsets_source="admin",
        trigger_interval_ms=300,
        thresholds={"global": {"dry.run": False}, f"topic:{topic}": {"consumed.retention.ms": RETENTION_MS}},
    )
    t = settings.topics
    for name in (t.segments, t.commits, t.agent):
        cluster.create(name, 1)
    commit = {"type": "offset_commit", "group": group, "topic": topic, "partition": 0, "offset": 5, "ts": 1}
    cluster.send(t.commits, [commit])  # some writer of commits, and no agent at all
    cluster.flush()
    state = settings.redis_state()
    stop = threading.Event()
    caplog.set_level(logging.INFO, "compactd")
    with Application(settings, spark=spark) as job:
        runner = threading.Thread(target=job.run, kwargs={"stop": stop})
        runner.start()
        try:
            wait_for(lambda: any("is an agent running?" in r.getMessage() for r in caplog.records), "no line said it")
            wait_for(lambda: state.view(topic, 0).min_committed == 5, "the commit not merged")
        finally:
            stop.set()
            runner.join(120)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("no segment events on" in m for m in lines) == 1
    assert sum("no complete poll from the admin agent" in m for m in lines) == 1
    assert (state.gate() or {}).get("why") == AGENT_WAIT
    [e] = explain(state, settings, f"{topic}/0", now_ms())
    rule = e["rules"]["consumed_retention"]
    assert rule["state"] == "blocked" and rule["blocked_by"][0]["cause"] == "no_segment_source"
