"""Readers that commit no group offsets, counted like groups (policy/readers.py), their codecs
(codec/share_state.py, codec/spark_checkpoint.py) and their declaration (`readers:`, `reader:<name>` scopes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactd.codec.config_events import ConfigEvent
from compactd.codec.share_state import advance, decode_key, decode_value
from compactd.codec.spark_checkpoint import kafka_positions, latest_batch
from compactd.errors import ConfigError, DecodeError, Rejected
from compactd.model import PartitionNumbers, PartitionView
from compactd.policy.readers import (
    PATTERNS,
    PIN,
    SHARE_GROUP,
    SPARK_CHECKPOINT,
    Bound,
    ReaderHold,
    declared,
    fold_numbers,
    fold_view,
    holds_on,
    incarnation,
    pin_holds,
    readers_say_no,
)
from compactd.policy.runtime_config import apply_event
from compactd.policy.thresholds import parse_scope, resolve, validate_layer
from compactd.settings import Settings

# bytes a live Apache Kafka 4.4 broker wrote to __share_group_state (share group "sg1", one topic)
SNAPSHOT_KEY = "00000003736731bb1d8e214ebc476a9551280f9356dfba00000000"
SNAPSHOT_VALUE = "0000000000000000000200000000ffffffffffffffff000001a2185f76c8000001a2185f76c80100"
UPDATE_VALUE = "00000000000000000000000000000000000002000000000000000000000000000000310200010001000400000032"


def numbers(parts: list[int], counted: int, zcard: list[int], lowest: list[int]) -> PartitionNumbers:
    p = len(parts)
    return PartitionNumbers(
        partitions=np.array(parts, dtype=np.int64), counted=np.full(p, counted, dtype=np.int64),
        cleaned=np.full(p, -1, dtype=np.int64), log_start=np.zeros(p, dtype=np.int64),
        zcard=np.array(zcard, dtype=np.int64), lowest=np.array(lowest, dtype=np.int64),
        nseg=np.zeros(p, dtype=np.int64), segments=np.zeros((0, 5), dtype=np.int64),
    )  # fmt: skip


def known_min(nums: PartitionNumbers) -> list[int | None]:
    ok = (nums.counted > 0) & (nums.zcard == nums.counted) & (nums.lowest >= 0)
    return [int(v) if k else None for v, k in zip(nums.lowest, ok, strict=True)]


def test_a_reader_counts_like_a_group_in_the_arrays() -> None:
    # partition 0: one group at 500; partition 1: the group at 80; partition 2: the group has no offset there
    nums = numbers([0, 1, 2], counted=1, zcard=[1, 1, 0], lowest=[500, 80, -1])
    held = fold_numbers(nums, [ReaderHold("etl", PIN, {0: 300, 1: 900, 2: 40})])
    assert known_min(held) == [300, 80, None]  # the lower of both; partition 2 stays unknown (the group)
    # a reader with no position on a partition makes it unknown there (KIP-68's -1)
    assert known_min(fold_numbers(nums, [ReaderHold("etl", PIN, {0: 300})])) == [300, None, None]
    # a topic no group reads: the reader alone decides
    alone = numbers([0, 1], counted=0, zcard=[0, 0], lowest=[-1, -1])
    assert known_min(fold_numbers(alone, [ReaderHold("sg", SHARE_GROUP, {0: 7, 1: 0})])) == [7, 0]
    # blind: unknown everywhere
    assert known_min(fold_numbers(alone, [ReaderHold("sg", SHARE_GROUP, {0: 7}, blind="no ACL")])) == [None, None]
    assert fold_numbers(nums, []) is nums


@given(
    groups=st.lists(st.one_of(st.none(), st.integers(0, 1000)), min_size=0, max_size=4),
    readers=st.lists(st.one_of(st.none(), st.integers(0, 1000)), min_size=1, max_size=4),
)
def test_arrays_and_view_agree_and_never_pass_any_reader(groups: list[int | None], readers: list[int | None]) -> None:
    known = [g for g in groups if g is not None]
    nums = numbers([3], len(groups), [len(known)], [min(known) if known else -1])
    holds = [ReaderHold(f"r{i}", PIN, {} if r is None else {3: r}) for i, r in enumerate(readers)]
    view = PartitionView("t", 3, min_committed=min(known) if groups and len(known) == len(groups) else None,
                         counted_groups=len(groups))  # fmt: skip
    from_arrays = known_min(fold_numbers(nums, holds))[0]
    assert from_arrays == fold_view(view, holds).min_committed
    every = groups + readers
    assert from_arrays == (None if any(v is None for v in every) else min(every))
    if from_arrays is not None:
        assert readers_say_no(from_arrays, holds, "t", 3) is None
        if min(r for r in readers if r is not None) == from_arrays:  # a reader is the lowest: one past it is refused
            assert readers_say_no(from_arrays + 1, holds, "t", 3) is not None


def test_readers_say_no_names_the_reader() -> None:
    holds = [ReaderHold("etl", PIN, {0: 300}), ReaderHold("sg1", SHARE_GROUP, {})]
    assert readers_say_no(200, holds[:1], "t", 0) is None
    assert readers_say_no(301, holds[:1], "t", 0) == "past reader etl's position 300 on t/0"
    assert "share group sg1 reads t and its position on partition 0 is unknown" in (
        readers_say_no(1, holds, "t", 0) or ""
    )


def test_share_state_records_as_kafka_writes_them() -> None:
    key = decode_key(bytes.fromhex(SNAPSHOT_KEY))
    assert (key.kind, key.group, key.partition) == (0, "sg1", 0)
    assert str(key.topic_id) == "bb1d8e21-4ebc-476a-9551-280f9356dfba"
    snap = decode_value(0, bytes.fromhex(SNAPSHOT_VALUE))
    assert (snap.start_offset, snap.done, snap.state_epoch) == (-1, (), 2)  # not initialized yet
    update = decode_value(1, bytes.fromhex(UPDATE_VALUE))  # start 0, [0, 49] acknowledged
    assert (update.start_offset, update.done) == (0, ((0, 49),))
    assert advance(update.start_offset, list(update.done)) == 50
    with pytest.raises(DecodeError):
        decode_key(b"\x00\x07" + bytes.fromhex(SNAPSHOT_KEY)[2:])  # an unknown key type
    with pytest.raises(DecodeError):
        decode_value(1, bytes.fromhex(UPDATE_VALUE)[:12])


def test_advance_stops_at_the_first_gap() -> None:
    assert advance(10, [(10, 19), (25, 30)]) == 20
    assert advance(10, [(25, 30), (5, 12), (13, 24)]) == 31
    assert advance(10, []) == 10


def test_a_spark_checkpoint_position_is_its_latest_committed_batch() -> None:
    assert latest_batch(["0", "1", ".1.crc", "2.tmp"], ["0", "1", "2"]) == 1  # batch 2 is planned, not done
    assert latest_batch([], ["0"]) is None
    text = "\n".join([
        "v1",
        '{"batchWatermarkMs":0,"batchTimestampMs":1763800000000,"conf":{}}',
        '{"orders":{"1":900,"0":1200}}',
        "-",  # a source with no offset yet
        '{"logOffset":4}',  # a file source
        '{"orders":{"0":1100},"payments":{"0":7}}',  # a second Kafka source of the same query
    ])  # fmt: skip
    assert kafka_positions(text) == {"orders": {0: 1100, 1: 900}, "payments": {0: 7}}
    with pytest.raises(DecodeError):
        kafka_positions("{}")


def test_the_v2_offset_log_is_read_by_source_name_and_what_is_not_read_is_an_error() -> None:
    """Spark 4.2's `formatVersion=2` (as a real query wrote it: tests/e2e/test_declared_readers.py); anything compactd
    cannot read makes the reader blind (an error here), never a reader with no position."""
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1795838401890,"conf":{},"sourceMetadataInfo":{}}'
    v2 = ["v2", meta, 'side_in:{"payments":{"0":50}}', 'orders_in:{"orders":{"0":300,"1":0}}', "rate:-"]
    assert kafka_positions("\n".join(v2)) == {"payments": {0: 50}, "orders": {0: 300, 1: 0}}
    for bad in (["v3", meta, '{"orders":{"0":3}}'],  # a version it does not know
                ["v1", meta, 'orders_in:{"orders":{"0":3}}'],  # a line that is not JSON
                ["v1", meta, '{"orders":{"zero":3}}'],  # a Kafka offset whose partitions are not numbers
                ["v2", meta, '{"orders":{"0":3}}']):  # fmt: skip  # a v2 line with no source name
        with pytest.raises(DecodeError):
            kafka_positions("\n".join(bad))


def test_a_pattern_holds_the_topics_it_matches_where_its_reader_has_no_position() -> None:
    holds = {"orders-1": (ReaderHold("etl", SPARK_CHECKPOINT, {0: 5}),),
             PATTERNS: (ReaderHold("etl", SPARK_CHECKPOINT, pattern=r"orders-\d+"),)}  # fmt: skip
    assert holds_on(holds, "orders-1") == (ReaderHold("etl", SPARK_CHECKPOINT, {0: 5}),)  # its position there
    (new,) = holds_on(holds, "orders-2")  # created after its last batch: held whole
    assert new.position(0) is None and readers_say_no(1, [new], "orders-2", 0) is not None
    assert holds_on(holds, "orders-2x") == () == holds_on(holds, "payments")  # matched whole, as Java's matches()
    with pytest.raises(ValueError, match="not a regex"):
        Settings(readers={"x": {"spark_checkpoint": "/c", "subscribe_pattern": "orders-("}})


def test_a_readers_offsets_count_only_on_the_incarnation_they_were_read_on() -> None:
    def planned() -> int:
        return 7  # the latest batch planned when the new ID is seen

    b, ok = incarnation(None, "A", 3, "/ck", planned)
    assert b == Bound("A", -1, "/ck") and ok  # first seen: bound, no evidence against it (as a commit without an ID)
    assert incarnation(b, "A", 3, "/ck", planned) == (b, True)
    assert incarnation(b, None, 3, "/ck", planned) == (b, True)  # no ID reported: no evidence either way
    b, ok = incarnation(b, "B", 7, "/ck", planned)  # created again: batches planned until now may be the old log's
    assert b == Bound("B", 7, "/ck") and not ok
    assert incarnation(b, "B", 7, "/ck", planned) == (b, False)
    assert incarnation(b, "B", 8, "/ck", planned) == (b, True)  # planned after the new ID was seen
    pin, ok = incarnation(Bound("A", -1, "p1"), "B", 0, "p1", lambda: 0)
    assert not ok and incarnation(pin, "B", 0, "p1", lambda: 0)[1] is False  # a pin: until declared again
    assert incarnation(pin, "B", 0, "p2", lambda: 0) == (Bound("B", -1, "p2"), True)


def test_declared_readers_from_the_file_and_config_events() -> None:
    s = Settings(readers={"nightly": {"pin": {"orders": {0: 5}}, "expires_ms": 10},
                          "etl": {"spark_checkpoint": "/ckpt"}})  # fmt: skip
    specs, bad = declared(s.thresholds)
    assert set(specs) == {"nightly", "etl"} and not bad
    assert resolve(s.thresholds, "orders").consumed_retention_ms is None  # reader scopes resolve no topic
    assert pin_holds("nightly", specs["nightly"], now=9) == {"orders": ReaderHold("nightly", PIN, {0: 5})}
    assert pin_holds("nightly", specs["nightly"], now=10) == {}  # the lease is over
    with pytest.raises(ValueError, match="expires_ms"):
        Settings(readers={"x": {"pin": {"orders": {0: 5}}}})
    with pytest.raises(ValueError, match="exactly one"):
        Settings(readers={"x": {"pin": {"orders": {0: 5}}, "expires_ms": 9, "spark_checkpoint": "/c"}})
    assert parse_scope("reader:nightly") == ("reader", None, None)
    with pytest.raises(ConfigError, match="unknown reader key"):
        validate_layer("reader:x", {"consumed.retention.ms": 5})

    def event(scope: str, set_: dict, version: int) -> ConfigEvent:
        return ConfigEvent.model_validate({"type": "config", "scope": scope, "set": set_, "version": version, "ts": 1})

    change = apply_event(event("reader:ops", {"pin": {"orders": {"0": 3}}, "expires_ms": 99}, 1), "d1", {}, {})
    assert change is not None and change.layer.values["expires_ms"] == 99
    with pytest.raises(Rejected, match="expires_ms"):  # a pin without a lease is refused as a whole
        apply_event(event("reader:ops", {"pin": {"orders": {"0": 3}}}, 1), "d2", {}, {})


def test_readers_report_the_topics_whose_holds_moved_and_a_blind_share_state_holds_every_topic() -> None:
    from compactd.control.readers import Readers
    from compactd.kafka.share_state import SharePositions
    from compactd.policy.readers import EVERY_TOPIC, holds_on

    class Tail:  # the share-state tail's answers, one per read (a unit test: the e2e tests read a real broker)
        def __init__(self, answers: list[SharePositions]) -> None:
            self.answers = answers

        def read(self) -> SharePositions:
            return self.answers.pop(0)

        def close(self) -> None:
            pass

    clock = [0.0]
    tail = Tail([SharePositions({"sg": {"orders": {0: 5, 1: None}}}), SharePositions(blind="no ACL"),
                 SharePositions({"sg": {"orders": {0: 9, 1: None}}})])  # fmt: skip
    readers = Readers(tail, monotonic=lambda: clock[0])  # type: ignore[arg-type]
    first = readers.holds({})
    assert holds_on(first, "orders") == (ReaderHold("sg", SHARE_GROUP, {0: 5}),)  # partition 1: not initialized
    assert readers.take_moved() == ["orders"] and readers.take_moved() == []
    assert readers.holds({}) is first  # within the cache: not read again
    clock[0] += 6
    blind = readers.holds({})
    # share groups that cannot be read may read any topic: every topic is held (blind), whatever it was before
    assert [h.blind for h in holds_on(blind, "payments")] == ["no ACL"] == [h.blind for h in holds_on(blind, "orders")]
    assert readers.take_moved() == [EVERY_TOPIC, "orders"]
    clock[0] += 6
    assert holds_on(readers.holds({}), "orders") == (ReaderHold("sg", SHARE_GROUP, {0: 9}),)
    assert readers.take_moved() == [EVERY_TOPIC, "orders"]  # read again: every topic is evaluated again
    assert EVERY_TOPIC not in readers.holds({})


def test_share_state_topic_ids_are_named_once_and_never_dropped_while_unnamed() -> None:
    """The share-state tail names topic IDs by DescribeTopics: an ID no topic has (a deleted topic) is asked about once,
    not at every read; a round the cluster cannot answer leaves the share groups blind, never without a hold."""
    import uuid

    from compactd.kafka.config import KafkaConnection
    from compactd.kafka.share_state import NAMES_TTL_S, ShareStateTail, _Partition
    from compactd.kafka.topics import TopicsNow

    a, b, gone = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    class Topics:  # DescribeTopics' answers (a unit test: tests/e2e/test_share_groups.py reads a real broker)
        def __init__(self) -> None:
            self.rounds, self.fail, self.created = 0, False, False

        def names(self) -> list[str]:
            return ["a", "b"] if self.created else ["a"]

        def describe(self, names: list[str]) -> TopicsNow:
            self.rounds += 1
            if self.fail:
                return TopicsNow(ids={"a": str(a)}, unknown={"b": "Broker: Request timed out"})
            return TopicsNow(ids={"a": str(a), **({"b": str(b)} if self.created else {})})

    clock = [0.0]
    topics = Topics()
    tail = ShareStateTail(KafkaConnection("unused:9092"), topics, monotonic=lambda: clock[0])  # type: ignore[arg-type]
    tail._state = {("sg", a.bytes, 0): _Partition(10), ("sg", gone.bytes, 0): _Partition(5)}
    assert tail._positions() == {"sg": {"a": {0: 10}}} and topics.rounds == 1
    assert tail._positions() == {"sg": {"a": {0: 10}}} and topics.rounds == 1  # the deleted topic's ID: asked once
    topics.fail = topics.created = True
    tail._state[("sg", b.bytes, 0)] = _Partition(7)  # a new topic's ID, while the cluster cannot answer
    with pytest.raises(RuntimeError, match="cannot name"):
        tail._positions()
    with pytest.raises(RuntimeError, match="cannot name"):  # blind until a round succeeds, not dropped
        tail._positions()
    assert topics.rounds == 2  # the failed round is not repeated before NAMES_TTL_S
    topics.fail = False
    clock[0] += NAMES_TTL_S
    assert tail._positions() == {"sg": {"a": {0: 10}, "b": {0: 7}}} and topics.rounds == 3
