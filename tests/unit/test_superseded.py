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


def test_events_of_a_reset_topic_from_before_its_reset_are_dropped_on_every_path() -> None:
    # orders was reset when the segments topic's partition 0 stood at offset 2 and the commits topic's at 1
    d = Decoder("seg", "com", superseded={"orders": {"seg": {"0": 2}, "com": {"0": 1}}})
    values = [seg("orders", 0), seg("clicks", 0), seg("orders", 100), seg("orders", 0)]
    t = d.table("seg", 0, [0, 1, 2, 3], [None] * 4, values)
    assert list(zip(t.column("topic").to_pylist(), t.column("src_offset").to_pylist(), strict=True)) == [
        ("clicks", 1), ("orders", 2), ("orders", 3),
    ]  # fmt: skip
    assert d.table("seg", 1, [0], [None], [seg("orders", 0)]).num_rows == 1  # another source partition: kept
    commits = d.table("com", 0, [0, 1], [None, None], [commit("g", "orders", 5), commit("g", "orders", 7)])
    assert commits.column("value_offset").to_pylist() == [7]
    kafka_rows = pa.RecordBatch.from_pylist(
        [{"topic": "seg", "partition": 0, "offset": i, "key": None, "value": v} for i, v in enumerate(values)]
    )  # Spark's Kafka connector's rows: the reference path
    assert [(r["topic"], r["src_offset"]) for r in d.rows(kafka_rows)] == [("clicks", 1), ("orders", 2), ("orders", 3)]
    fast = pa.Table.from_batches(list(d(iter([kafka_rows]))))  # the fast path over the same rows
    assert [(r["topic"], r["src_offset"]) for r in fast.to_pylist()] == [("clicks", 1), ("orders", 2), ("orders", 3)]
    assert pickle.loads(pickle.dumps(d)) == d  # shipped to the decode tasks in the mapInArrow closure


def test_without_resets_nothing_is_dropped() -> None:
    d = Decoder("seg", "com")
    assert d.table("seg", 0, [0, 1], [None, None], [seg("orders", 0), seg("orders", 10)]).num_rows == 2
