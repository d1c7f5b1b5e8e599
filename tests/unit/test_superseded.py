"""A rebuild drops the events a topic's reset superseded (streaming/decode.py `Decoder.superseded`): the events of a
re-created topic's old log, read again from the sources' start, must not build its state a second time."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa

from compactd.streaming.decode import Decoder


def seg(topic: str, base: int) -> bytes:
    return json.dumps({
        "type": "segment_rolled", "topic": topic, "partition": 0, "base_offset": base, "end_offset": base + 10,
        "first_batch_max_ts": 1, "size_bytes": 1, "ts": 1,
    }).encode()  # fmt: skip


def commit(group: str, topic: str, offset: int) -> bytes:
    return json.dumps({"type": "offset_commit", "group": group, "topic": topic, "partition": 0, "offset": offset,
                       "ts": 1}).encode()  # fmt: skip


def rows(d: Decoder, topic: str, partition: int, values: list[bytes]) -> list[dict]:
    batch = pa.RecordBatch.from_pylist(
        [{"topic": topic, "partition": partition, "offset": i, "key": None, "value": v} for i, v in enumerate(values)]
    )  # Spark's Kafka connector's rows
    return d.rows(batch)


def test_events_of_a_reset_topic_from_before_its_reset_are_dropped_by_the_reference() -> None:
    # orders was reset when the segments topic's partition 0 stood at offset 2 and the commits topic's at 1
    d = Decoder("seg", "com", superseded={"orders": {"seg": {"0": 2}, "com": {"0": 1}}})
    values = [seg("orders", 0), seg("clicks", 0), seg("orders", 100), seg("orders", 0)]
    assert [(r["topic"], r["src_offset"]) for r in rows(d, "seg", 0, values)] == [
        ("clicks", 1), ("orders", 2), ("orders", 3),
    ]  # fmt: skip
    assert len(rows(d, "seg", 1, [seg("orders", 0)])) == 1  # another source partition: kept
    commits = rows(d, "com", 0, [commit("g", "orders", 5), commit("g", "orders", 7)])
    assert [r["value_offset"] for r in commits] == [7]
    # the rows the fast path refused are decided on the driver by the same rule (the fast path's own: test_columns)
    refused = pa.Table.from_pylist(
        [{"src_topic": "seg", "src_partition": 0, "src_offset": i, "raw_key": None, "raw_value": v, "n": 1,
          "slow": True} for i, v in enumerate(values)]
    )  # fmt: skip
    assert [(r["topic"], r["src_offset"]) for r in d.complete(refused).to_pylist()] == [
        ("clicks", 1), ("orders", 2), ("orders", 3),
    ]  # fmt: skip
    assert pickle.loads(pickle.dumps(d)) == d  # shipped to the reference's tasks in the mapInArrow closure


def test_without_resets_nothing_is_dropped() -> None:
    d = Decoder("seg", "com")
    assert len(rows(d, "seg", 0, [seg("orders", 0), seg("orders", 10)])) == 2
