"""Events on the broker → the Spark job (available-now) → Redis state → action records and a real deleteRecords."""

from __future__ import annotations

import time

import pytest

from compactd.daemon.application import Application
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.spark
HOUR = 3_600_000


@pytest.mark.versions
def test_once_run_deletes_consumed_segments_and_compacts_overdue(spark, cluster, job_settings, redis_url) -> None:
    now = int(time.time() * 1000)
    orders, ctopic = cluster.name("orders"), cluster.name("ctopic")
    cluster.create(orders, 1, {"cleanup.policy": "delete"})
    cluster.create(ctopic, 1, {"cleanup.policy": "compact"})
    cluster.fill(orders, 3000)
    from compactd.local.servers import free_port

    metrics_port = free_port()
    settings = job_settings(
        metrics_port=metrics_port,
        thresholds={
            "global": {"dry.run": False},
            f"topic:{orders}": {"consumed.retention.ms": HOUR},
            f"topic:{ctopic}": {"max.compaction.lag.ms": HOUR},
        },
    )
    seg = settings.topics.segments
    cluster.send(
        seg,
        [
            {
                "type": "segment_rolled",
                "topic": orders,
                "partition": 0,
                "base_offset": 0,
                "end_offset": 1000,
                "first_batch_max_ts": now - 3 * HOUR,
                "size_bytes": 10,
                "ts": now - 2 * HOUR,
            },
            {
                "type": "segment_rolled",
                "topic": orders,
                "partition": 0,
                "base_offset": 1000,
                "end_offset": 2000,
                "first_batch_max_ts": now - 2 * HOUR,
                "size_bytes": 10,
                "ts": now - 90 * 60_000,
            },
            {
                "type": "segment_rolled",
                "topic": orders,
                "partition": 0,
                "base_offset": 2000,
                "end_offset": 3000,
                "first_batch_max_ts": now - HOUR,
                "size_bytes": 10,
                "ts": now - 60_000,
            },
            {
                "type": "segment_rolled",
                "topic": ctopic,
                "partition": 0,
                "base_offset": 0,
                "end_offset": 100,
                "first_batch_max_ts": now - 2 * HOUR,
                "size_bytes": 10,
                "ts": now - HOUR,
            },
        ],
    )
    cluster.send(
        settings.topics.commits,
        [
            {"type": "offset_commit", "group": "billing", "topic": orders, "partition": 0, "offset": 1500, "ts": now},
            {"type": "offset_commit", "group": "analytics", "topic": orders, "partition": 0, "offset": 2500, "ts": now},
        ],
    )

    with Application(settings, spark=spark) as job:
        job.run(once=True)

    actions = {a["action"]: a for a in cluster.read_all(settings.topics.actions)}
    delete = actions["delete_records"]
    assert (delete["topic"], delete["partition"], delete["before_offset"]) == (orders, 0, 1000)
    assert (delete["reason"], delete["status"], delete["dry_run"]) == ("consumed_retention", "sent", False)
    compact = actions["compact"]
    assert (compact["topic"], compact["reason"], compact["status"]) == (ctopic, "max_compaction_lag", "sent")
    assert compact["delay_ms"] >= HOUR - 5_000
    assert cluster.watermarks(orders) == (1000, 3000)
    view = settings.redis_state().view(orders, 0)
    assert view.min_committed == 1500
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
    }
    sent = {"action": "delete_records", "reason": "consumed_retention", "status": "sent", "cluster": "default"}
    assert ("compactd_actions_total", tuple(sorted(sent.items()))) in samples
    rolled = {"kind": "segment_rolled", "stream": "segments", "cluster": "default"}
    assert ("compactd_input_records_total", tuple(sorted(rolled.items()))) in samples
    assert [s.base_offset for s in view.segments] == [0, 1000, 2000]

    # the checkpoint Spark wrote covers everything: a second `run --once` does not start the stream
    with Application(settings.model_copy(update={"metrics_port": 0}), spark=spark) as again:
        again.run(once=True)
        assert again.job is None


def test_bad_input_goes_to_dlq_and_changes_nothing(spark, cluster, job_settings, rclient) -> None:
    settings = job_settings(max_event_bytes=1024)
    seg, com = settings.topics.segments, settings.topics.commits
    cluster.create(seg)
    cluster.create(com)
    bad = [
        (seg, b"{definitely not json", "malformed_json"),
        (seg, b'{"type":"segment_rolled","pad":"' + b"x" * 2000 + b'"}', "oversized"),
        (seg, b'{"type":"segment_merged","topic":"t","partition":0,"ts":1}', "unknown_type"),
        (seg, b'{"type":"log_start","topic":"t","partition":0,"log_start_offset":-5,"ts":1}', "invalid_field"),
        (com, b'{"type":"offset_commit","group":"g","topic":"t","partition":0,"offset":1e30,"ts":1}', "invalid_field"),
        (com, None, "null_value"),
    ]
    for topic, value, _ in bad:
        cluster.send_raw(topic, value, key=b"bad-key")
    cluster.flush()

    with Application(settings, spark=spark) as job:
        job.run(once=True)
        rejected = job.metrics.dlq_records

    dlq = cluster.read_all(settings.topics.dlq)
    assert sorted(d["reason"] for d in dlq) == sorted(r for _, _, r in bad)
    first = next(d for d in dlq if d["reason"] == "malformed_json")
    import base64

    assert base64.b64decode(first["value_b64"]) == b"{definitely not json"
    assert base64.b64decode(first["key_b64"]) == b"bad-key" and first["source_topic"] == seg
    assert rejected.labels("segments", "oversized")._value.get() >= 1
    assert cluster.read_all(settings.topics.actions) == []
    # no compactd state was written: only the job's own bookkeeping is absent too
    # only the job's own bookkeeping (state epoch, delete gate): nothing derived from the input
    assert [k for k in rclient.keys("cd:*") if b"{state}" not in k] == []


SEGMENT = {"type": "segment_rolled", "partition": 0, "base_offset": 0, "end_offset": 50, "size_bytes": 1}


def test_deadline_fires_without_new_events_within_one_trigger(spark, cluster, job_settings, redis_url) -> None:
    import threading

    lag, interval = 8_000, 1_000
    ctopic = cluster.name("ct")
    settings = job_settings(
        trigger_interval_ms=interval, thresholds={f"topic:{ctopic}": {"max.compaction.lag.ms": lag}}
    )
    warm = cluster.name("warm")  # a first segment event, on a topic without rules: the job's first batch
    cluster.create(warm)
    cluster.create(settings.topics.segments)
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    cluster.send(settings.topics.segments, [dict(SEGMENT, topic=warm, first_batch_max_ts=an_hour_ago, ts=an_hour_ago)])
    state = settings.redis_state()
    stop = threading.Event()
    with Application(settings, spark=spark) as job:
        runner = threading.Thread(target=job.run, kwargs={"stop": stop})
        runner.start()
        try:
            # the segment is sent once the job has merged a first batch: a started job merges it within a trigger or
            # two, well before its deadline, however long Spark took to start the query on this machine
            wait_for("the job's first batch merged", lambda: state.view(warm, 0).segments, 180)
            first_batch_max_ts = int(time.time() * 1000)
            deadline = first_batch_max_ts + lag + 1
            cluster.send(settings.topics.segments, [dict(SEGMENT, topic=ctopic, first_batch_max_ts=first_batch_max_ts,
                                                         ts=first_batch_max_ts)])  # fmt: skip
            # the merge and the deadline it schedules are two writes of one batch: wait for the second
            while state.deadline(ctopic, 0) is None:
                assert time.time() * 1000 < deadline, "segment event not merged and scheduled before its deadline"
                time.sleep(0.1)
            assert state.view(ctopic, 0).segments
            assert state.deadline(ctopic, 0) == deadline
            assert state.records([(ctopic, 0)])[(ctopic, 0)] == []  # not due yet
            while not state.records([(ctopic, 0)])[(ctopic, 0)]:
                assert time.time() * 1000 < deadline + 10_000, "no decision after the deadline passed"
                time.sleep(0.05)
        finally:
            stop.set()
            runner.join(120)
    rec = state.records([(ctopic, 0)])[(ctopic, 0)][0]
    assert rec.action == "compact" and rec.status == "dry_run" and rec.dry_run
    assert deadline <= rec.decided_at <= deadline + interval + 500
    audit = cluster.read_all(settings.topics.actions)
    assert [(a["action"], a["status"]) for a in audit] == [("compact", "dry_run")]


def test_a_dlq_the_broker_cannot_take_holds_the_batch_and_the_job_goes_on(spark, cluster, job_settings, caplog) -> None:
    """Issue 64, item 11: Kafka I/O on the batch path that is not retried ended `compactd run` (only Redis errors
    were). Here the DLQ refuses every write (its `max.message.bytes` below a DLQ record, as a broker refuses a write
    for an ACL taken away or too few in-sync replicas) until the operator fixes the topic. The batch waits, one line
    says why, and it is done once the DLQ takes writes again; nothing is lost. Before the fix: the query failed on
    DeliveryTimeout and `run --once` raised."""
    import logging
    import threading

    settings = job_settings()
    seg, dlq = settings.topics.segments, settings.topics.dlq
    cluster.create(seg)
    cluster.create(dlq, 1, {"max.message.bytes": "200"})  # a DLQ record is larger: refused, MESSAGE_TOO_LARGE
    cluster.send_raw(seg, b"{definitely not json", key=b"bad-key")
    cluster.flush()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with Application(settings, spark=spark) as job:
                job.run(once=True)
        except BaseException as exc:  # the test reports it
            failed.append(exc)

    with caplog.at_level(logging.WARNING):
        worker = threading.Thread(target=run)
        worker.start()
        waiting = wait_until("the batch waiting on Kafka", lambda: ([r.getMessage() for r in caplog.records
                             if r.getMessage().startswith("Kafka unavailable")] or failed), bool, 120)  # fmt: skip
        assert failed == []
        cluster.alter(dlq, {"max.message.bytes": None})  # the broker's default again
        worker.join(180)
    assert not worker.is_alive() and failed == [], failed
    assert len(waiting) == 1 and "batch" in waiting[0] and "retrying" in waiting[0], waiting
    assert [d["reason"] for d in cluster.read_all(dlq)][:1] == ["malformed_json"]
