"""The evidence that a state describes another incarnation of its topic (policy/identity.py), and what the lifecycle
does with a topic ID that changed (the test broker reports none: tests/integration/test_topic_lifecycle.py covers the
log's own evidence against a real broker)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Mapping, Sequence

import pytest
from prometheus_client import CollectorRegistry

from compactd.control.identity import TRUNCATION_GRACE_MS, BehindHighWatermark, Lifecycle
from compactd.control.metrics import Metrics
from compactd.kafka.topics import TopicsNow
from compactd.model import ActionRecord, PartitionView, Segment
from compactd.policy.identity import (
    ZERO_ID,
    LogFacts,
    behind_high_watermark,
    commit_outlived,
    identity_changed,
    other_incarnation,
    report_outlived,
    topic_id_bytes,
    view_outlived,
    written_after,
)

VIEW = PartitionView("t", 0, (Segment(0, 1000, 1, 1, 1), Segment(1000, 2000, 1, 1, 1)), 500, 100)


def test_the_same_log_gives_no_evidence() -> None:
    assert identity_changed(VIEW, LogFacts("id1", 100, 2500), "id1", 2000) is None
    assert identity_changed(VIEW, LogFacts(None, 150, 2000), None, 2000) is None  # retention moved the start on
    assert identity_changed(VIEW, LogFacts(ZERO_ID, 100, 2000), "id1") is None  # no ID now: nothing compared
    # a broker killed before it checkpointed a deleteRecords starts again with the older log start: same ID, same log
    assert identity_changed(VIEW, LogFacts("id1", 0, 2500), "id1") is None


def test_the_same_topic_id_makes_a_high_watermark_below_the_state_no_evidence_of_another_log() -> None:
    """A replicated partition's high watermark trails the leader's log end, where its segments roll: under the same
    ID that is a follower catching up (or a truncation), which `behind_high_watermark` tells, not a new log."""
    assert identity_changed(VIEW, LogFacts("id1", 100, 1500), "id1", 2000) is None
    assert identity_changed(VIEW, LogFacts(None, 100, 1500), None, 2000) is not None  # no ID: only the log tells
    assert behind_high_watermark(VIEW, LogFacts("id1", 100, 1500), 2000) == (
        "a delete to offset 2000 is past the high watermark 1500"
    )
    assert behind_high_watermark(VIEW, LogFacts("id1", 100, 1500), 1000) == (
        "the high watermark 1500 is below offset 2000 compactd holds"
    )
    assert behind_high_watermark(VIEW, LogFacts("id1", 100, 2000), 2000) is None


def test_each_kind_of_evidence() -> None:
    assert identity_changed(VIEW, LogFacts("id2", 100, 9000), "id1") == "topic ID id1 is now id2"
    assert "past the log end 2500" in str(identity_changed(VIEW, LogFacts(None, 100, 2500), None, 2600))
    assert "below offset 2000" in str(identity_changed(VIEW, LogFacts(None, 100, 1999), None))
    assert "below the log start 100" in str(identity_changed(VIEW, LogFacts(None, 0, 5000), None))
    cleaned = PartitionView("t", 0, (), 3000, 0)
    assert "below offset 3000" in str(identity_changed(cleaned, LogFacts(None, 0, 2000), None))


class Reader:
    def __init__(self) -> None:
        self.ids: dict[str, str] = {}
        self.missing: set[str] = set()

    def describe(self, topics: Iterable[str]) -> TopicsNow:
        return TopicsNow({t: self.ids[t] for t in topics if t in self.ids}, set(topics) & self.missing)

    def facts(self, topic: str, partition: int) -> LogFacts | None:
        return None if topic in self.missing else LogFacts(self.ids.get(topic), 0, 10**9)


class Store:
    def __init__(self) -> None:
        self.ids: dict[str, str] = {}
        self.known = {"a", "b"}
        self.resets: list[str] = []
        self.forgotten: list[str] = []

    def topics(self) -> list[str]:
        return sorted(self.known)

    def topic_id(self, topic: str) -> str | None:
        return self.ids.get(topic)

    def topic_ids(self, topics: Sequence[str]) -> list[str | None]:
        return [self.ids.get(t) for t in topics]

    def set_topic_ids(self, ids: Mapping[str, str]) -> None:
        self.ids.update(ids)

    def reset_topic(self, topic: str, why: str, now: int) -> list[int]:
        self.resets.append(topic)
        self.ids.pop(topic, None)
        return [0]

    def forget_topic(self, topic: str) -> list[int]:
        self.forgotten.append(topic)
        self.known.discard(topic)
        return [0]


def lifecycle() -> tuple[Lifecycle, Reader, Store, list[tuple[str, list[int]]]]:
    reader, store, changed = Reader(), Store(), []
    lc = Lifecycle(store, reader, Metrics(CollectorRegistry()), lambda t, p: changed.append((t, p)))
    return lc, reader, store, changed


def test_sweep_records_ids_then_resets_a_topic_whose_id_changed() -> None:
    lc, reader, store, changed = lifecycle()
    reader.ids = {"a": "A1", "b": ZERO_ID}
    lc.sweep(0)
    assert store.ids == {"a": "A1"} and store.resets == []  # first seen; a zero ID is no ID
    reader.ids["a"] = "A2"  # deleted and created again between two sweeps
    lc.sweep(1)
    assert store.resets == ["a"] and store.ids == {"a": "A2"} and changed == [("a", [0])]


def test_a_topic_is_forgotten_only_when_missing_twice_in_a_row() -> None:
    lc, reader, store, _ = lifecycle()
    reader.missing = {"b"}
    lc.sweep(0)
    assert store.forgotten == []
    reader.missing = set()  # re-created meanwhile
    lc.sweep(1)
    reader.missing = {"b"}
    lc.sweep(2)
    assert store.forgotten == []
    lc.sweep(3)
    assert store.forgotten == ["b"]


def test_an_action_on_a_changed_topic_is_stale_and_its_topic_reset_once() -> None:
    lc, reader, store, _ = lifecycle()
    store.ids = {"a": "A1"}
    reader.ids = {"a": "A2"}
    rec = ActionRecord("x", "compact", "a", 0, "max_compaction_lag", False, 0, "pending")
    why = lc.check(rec, None, 0)
    assert why == "stale state: a/0: topic ID A1 is now A2"
    assert lc.check(ActionRecord("y", "compact", "a", 1, "max_compaction_lag", False, 0, "pending"), None, 0)
    assert store.resets == []  # only at settle: after the round's records are written
    lc.settle(5)
    lc.settle(6)
    assert store.resets == ["a"]
    reader.missing = {"b"}
    assert "no longer exists" in str(lc.check(ActionRecord("z", "compact", "b", 0, "r", False, 0, "pending"), None, 0))
    lc.settle(7)
    assert store.forgotten == ["b"]


def test_ids_are_bound_when_a_topic_is_first_merged() -> None:
    """A topic re-created after its first events were merged but before any action: the ID recorded at the merge
    gives it away; recorded only at the first action, the new topic's ID would have been taken for the old one's."""
    lc, reader, store, _ = lifecycle()
    reader.ids = {"a": "A1"}
    lc.learn(["a", "b"])
    assert store.ids == {"a": "A1"}
    reader.ids = {"a": "A2"}
    lc.learn(["a"])  # learned once per process: no request, nothing overwritten
    assert store.ids == {"a": "A1"}
    rec = ActionRecord("x", "compact", "a", 0, "max_compaction_lag", False, 0, "pending")
    assert lc.check(rec, None, 0) == "stale state: a/0: topic ID A1 is now A2"


def test_a_delete_past_the_high_watermark_waits_and_a_gap_that_lasts_is_a_truncation() -> None:
    """Under the same topic ID: a delete past the high watermark waits (held, the state kept), one below it goes, and
    a high watermark below the state for TRUNCATION_GRACE_MS resets the topic as a truncated log."""
    lc, reader, store, _ = lifecycle()
    store.ids = reader.ids = {"a": "A1"}
    reader.facts = lambda topic, partition: LogFacts("A1", 0, 1500)  # type: ignore[method-assign]

    def delete(before: int) -> ActionRecord:
        return ActionRecord("d", "delete_records", "a", 0, "forced_retention", False, 0, "pending", before)

    with pytest.raises(BehindHighWatermark, match="past the high watermark 1500"):
        lc.check(delete(2000), VIEW, 10)
    assert lc.check(delete(1000), VIEW, 20) is None  # below it: goes, the segment past it notwithstanding
    lc.settle(30)
    assert store.resets == []
    reader.facts = lambda topic, partition: LogFacts("A1", 0, 2000)  # type: ignore[method-assign]
    assert lc.check(delete(2000), VIEW, 40) is None  # caught up: the gap's clock starts again at the next one
    reader.facts = lambda topic, partition: LogFacts("A1", 0, 1500)  # type: ignore[method-assign]
    assert lc.check(delete(1000), VIEW, 50) is None
    why = lc.check(delete(1000), VIEW, 50 + TRUNCATION_GRACE_MS)
    assert why == (
        "stale state: a/0: the high watermark 1500 is below offset 2000 compactd holds for 120 s: the log was "
        "truncated (a failover with acks=1, an unclean leader election)"
    )
    lc.settle(60 + TRUNCATION_GRACE_MS)
    assert store.resets == ["a"]


class Ledger:
    """The records beyond Redis (sinks/nudge_ledger.py); `down`: writes fail as a broker that does not answer."""

    def __init__(self) -> None:
        self.ids: dict[str, str | None] = {}
        self.resets: list[str] = []
        self.down = False

    def record_reset(self, topic: str, why: str, now: int) -> None:
        self.resets.append(topic)

    def forget_nudges(self, topic: str) -> None:
        self.resets.append(f"nudges of {topic}")

    def record_ids(self, ids: Mapping[str, str | None]) -> None:
        if self.down:
            raise RuntimeError("broker unavailable")
        self.ids.update(ids)


def test_a_stale_topic_is_reset_bound_to_its_id_now_and_a_ledger_that_fails_keeps_the_reset() -> None:
    reader, store, ledger = Reader(), Store(), Ledger()
    lc = Lifecycle(store, reader, Metrics(CollectorRegistry()), lambda t, p: None, ledger)
    store.ids, reader.ids = {"a": "A1", "b": "B1"}, {"a": "A2", "b": "B2"}
    for topic in ("a", "b"):
        assert lc.check(ActionRecord("x", "compact", topic, 0, "max_compaction_lag", False, 0, "pending"), None, 0)
    ledger.down = True  # a's new ID cannot be recorded: b is reset all the same
    lc.settle(5)
    assert store.resets == ["a", "b"] and ledger.resets == ["a", "b"] and store.ids == {}
    ledger.down = False
    assert lc.check(ActionRecord("y", "compact", "a", 0, "max_compaction_lag", False, 0, "pending"), None, 0) is None
    assert store.ids == {"a": "A2"} and ledger.ids == {"a": "A2"}  # bound at the next check, beyond Redis first


def test_a_topic_id_is_the_same_whichever_way_it_is_written() -> None:
    raw = bytes(range(1, 17))
    b64 = base64.b64encode(raw).decode().rstrip("=")  # the Admin API's way: AQIDBAUGBwgJCgsMDQ4PEA
    url = base64.urlsafe_b64encode(bytes(range(240, 256))).decode().rstrip("=")  # Kafka's tools: URL-safe
    assert topic_id_bytes(b64) == raw == topic_id_bytes(str(uuid.UUID(bytes=raw)))
    assert topic_id_bytes(url) == bytes(range(240, 256)) == topic_id_bytes(str(uuid.UUID(bytes=bytes(range(240, 256)))))
    assert topic_id_bytes(ZERO_ID) is None and topic_id_bytes(None) is None and topic_id_bytes("not an id") is None


def test_a_commit_of_another_incarnation_is_told_only_by_two_known_ids() -> None:
    old, new = str(uuid.UUID(bytes=bytes(range(16)))), base64.b64encode(bytes(range(1, 17))).decode()[:22]
    assert other_incarnation(old, new)
    assert not other_incarnation(str(uuid.UUID(bytes=bytes(range(1, 17)))), new)  # the same ID, written as a UUID
    assert not other_incarnation(None, new)  # a commit without an ID (value v0-v3): no evidence
    assert not other_incarnation(old, None)  # no ID recorded for the topic: no evidence
    assert not other_incarnation(old, ZERO_ID)  # a broker that reports none


def test_a_commit_the_log_was_truncated_and_written_again_under_is_told_by_its_epoch_or_the_log_end() -> None:
    # read up to 200 in epoch 3; an unclean election cut the log at 100 and epoch 4 wrote it again
    why = commit_outlived("billing", 200, 3, 250, (199, 4))
    assert why is not None and "offset 199" in why and "epoch 4" in why and "billing" in why
    assert commit_outlived("billing", 200, 3, 250, (199, 3)) is None  # the record the group read is still there
    assert commit_outlived("billing", 200, 3, 250, (150, 2)) is None  # an older record below (a marker between)
    # not yet written again up to the commit: the commit is past the log end, whatever its epoch
    why = commit_outlived("billing", 200, -1, 120)
    assert why is not None and "past the log end 120" in why
    # no epoch given (Spark, a hand-made commit) or no record below to read: nothing but the log end to judge by
    assert commit_outlived("spark", 200, -1, 250, (199, 9)) is None
    assert commit_outlived("billing", 200, 3, 250, None) is None  # no record below at all: nothing to delete
    assert commit_outlived("billing", 250, 3, 250, (249, 3)) is None  # at the log end: read everything
    # a record below with no epoch (magic 0/1): nothing says it is the one the group read, so it holds (issue 64)
    why = commit_outlived("billing", 200, 3, 250, (40, -1))
    assert why is not None and "carries no leader epoch" in why and "offset 40" in why


def test_a_record_written_in_a_later_epoch_than_the_segment_holding_it_outlives_the_report() -> None:
    """The old leader reported [0, 1000) and [1000, 2000), each last written in epoch 0; the new leader's log holds
    offset 1999 written in epoch 2 (an unclean election wrote the offsets from 1200 again). Judged by the segment
    that holds the record: a record in its epoch or an earlier one says nothing; a segment without a reported epoch
    says nothing; nothing read says nothing."""
    segs = [Segment(0, 1000, 0, 1, 0), Segment(1000, 2000, 0, 1, 0)]
    epochs = {0: 0, 1000: 0}
    why = report_outlived((1999, 2), segs, epochs)
    assert why is not None and "offset 1999" in why and "epoch 2" in why and "[1000, 2000)" in why
    assert report_outlived((1999, 0), segs, epochs) is None  # the record the report described
    assert report_outlived((999, 2), segs, {1000: 0}) is None  # its segment's epoch unknown
    assert report_outlived(None, segs, epochs) is None
    # overlapping reports: any segment holding the offset in an earlier epoch than the record's says so
    assert report_outlived((1500, 1), [*segs, Segment(1200, 1600, 0, 1, 0)], {1200: 1, 1000: 0}) is not None
    assert report_outlived((1500, 1), [*segs, Segment(1200, 1600, 0, 1, 0)], {1200: 1}) is None


def test_a_delete_under_a_view_is_held_when_the_record_below_it_was_written_after_the_view_read_the_log() -> None:
    assert written_after(4, (99, 5)) and not written_after(4, (99, 4)) and not written_after(-1, (99, 5))
    assert not written_after(4, None) and not written_after(4, (99, -1))
    why = view_outlived(4, 100, (99, 5))
    assert why is not None and "record at 99" in why and "epoch 5" in why and "epoch 4" in why
    assert view_outlived(4, 100, (99, 4)) is None
