"""A partition's leader that has not applied its new topic yet answers UNKNOWN_TOPIC_OR_PART for a moment: a caller
that just created the topic asks again for `newborn_s`, past which the answer stands (the topic is gone); any other
caller takes it at once. A stand-in consumer answers as that broker did."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from compactd.kafka import watermarks as wm


class Applying:
    """Answers "unknown" until `ready_at` (monotonic), then (0, 10)."""

    def __init__(self, ready_at: float) -> None:
        self.ready_at = ready_at
        self.asked = 0

    def get_watermark_offsets(self, _tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.asked += 1
        if time.monotonic() < self.ready_at:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return 0, 10


def test_a_leader_that_has_not_applied_the_topic_yet_is_asked_again() -> None:
    consumer = Applying(time.monotonic() + 0.3)
    assert wm.watermarks(consumer, "t", 0, 5, newborn_s=wm.NEWBORN_S) == (0, 10)
    assert consumer.asked > 1


def test_unknown_past_the_newborn_window_is_the_answer() -> None:
    consumer = Applying(time.monotonic() + 60)
    t0 = time.monotonic()
    with pytest.raises(KafkaException) as err:
        wm.watermarks(consumer, "t", 0, 30, newborn_s=0.3)
    assert err.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert time.monotonic() - t0 < 5  # the caller's 30 s timeout is not spent on a topic that is gone


def test_a_caller_that_did_not_create_the_topic_takes_unknown_at_once() -> None:
    consumer = Applying(time.monotonic() + 60)
    with pytest.raises(KafkaException):
        wm.watermarks(consumer, "t", 0, 30)
    assert consumer.asked == 1  # a delete aimed at a deleted topic's partition does not wait


def test_other_errors_are_the_callers_at_once() -> None:
    class Refusing:
        asked = 0

        def get_watermark_offsets(self, _tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
            self.asked += 1
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    consumer = Refusing()
    with pytest.raises(KafkaException):
        wm.watermarks(consumer, "t", 0, 30)
    assert consumer.asked == 1
