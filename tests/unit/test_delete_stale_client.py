"""sinks/kafka_admin.py: a DeleteRecords the client could not route makes the next try use new clients.

On three nodes, a rolling restart stopped a node that led partitions: the controller moved their leaders at once, but
the sink's AdminClient kept the stopped node as their leader in its cache. librdkafka answered every DeleteRecords
on them "No leaders found" from that cache, without asking the cluster again, until the entry aged out
(`metadata.max.age.ms`, 30 s): 61 failed tries in one rolling restart, about 25 s of each node's downtime. The
rolling-restart test of tests/e2e/test_replicated_cluster.py proves the fix on the real cluster; here a fake admin
gives the same answers, so that each way out of `_unanswered` is pinned down.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from compactd.kafka.config import KafkaConnection
from compactd.model import ActionRecord
from compactd.sinks.kafka_admin import KafkaAdminSink

TOPIC = "orders"


class Log:
    """A consumer whose watermarks are the log's (low, high)."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return self.low, self.high


class Answering:
    """An AdminClient whose DeleteRecords answers `error` (a KafkaError, or None: no answer at all in time); with
    `deletes`, the leader moves that log's start before the answer is lost."""

    def __init__(self, error: KafkaError | None, deletes: Log | None = None) -> None:
        self.error, self.deletes = error, deletes

    def delete_records(self, partitions: list[Any], request_timeout: float) -> dict[Any, Future]:
        if self.deletes is not None:
            self.deletes.low = partitions[0].offset
        fut: Future = Future()
        if self.error is not None:
            fut.set_exception(KafkaException(self.error))
        return {partitions[0]: fut}  # unanswered: result() times out


def sink_with(admin: Answering, log: Log) -> KafkaAdminSink:
    sink = KafkaAdminSink(KafkaConnection("127.0.0.1:1"), state=None, timeout_s=0.2)  # type: ignore[arg-type]
    sink.admin, sink._watermarks = admin, log
    sink._policies[TOPIC] = (time.monotonic(), "delete")
    return sink


def delete_to(before: int) -> ActionRecord:
    return ActionRecord(
        id="a", action="delete_records", topic=TOPIC, partition=0, reason="consumed_retention",
        dry_run=False, decided_at=0, status="pending", before_offset=before,
    )  # fmt: skip


NO_LEADERS = KafkaError(KafkaError._NOENT, "Failed to query partition leaders: No leaders found")


def test_no_leaders_found_fails_the_try_and_the_next_one_asks_with_new_clients() -> None:
    admin = Answering(NO_LEADERS)
    sink = sink_with(admin, Log(100, 1000))
    out = sink.execute(delete_to(500))
    assert out.status == "failed" and "No leaders found" in out.detail["error"]
    assert out.detail["low_watermark"] == 100  # nothing was deleted
    assert sink.admin is None and sink._watermarks is None  # the next execute() makes new ones


def test_no_leaders_found_over_a_log_already_deleted_past_the_offset_says_so() -> None:
    sink = sink_with(Answering(NO_LEADERS), Log(600, 1000))
    out = sink.execute(delete_to(500))
    assert out.status == "sent" and out.detail["why"] == "already below log start", out.detail


def test_no_answer_at_all_is_judged_by_the_log_start_and_the_clients_are_renewed() -> None:
    log = Log(100, 1000)
    sink = sink_with(Answering(None, deletes=log), log)  # the leader moved its log start; its answer never came
    out = sink.execute(delete_to(500))
    assert out.status == "sent" and "timed out waiting for in-sync followers" in out.detail["why"], out.detail
    assert sink.admin is None


@pytest.mark.parametrize("code", [KafkaError.REQUEST_TIMED_OUT, KafkaError.POLICY_VIOLATION])
def test_an_answer_of_the_broker_itself_keeps_the_clients(code: int) -> None:
    admin = Answering(KafkaError(code))
    sink = sink_with(admin, Log(100, 1000))
    out = sink.execute(delete_to(500))
    assert out.status == "failed" and out.detail["low_watermark"] == 100
    assert sink.admin is admin
