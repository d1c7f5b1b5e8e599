"""Decode + reduce throughput of the fast path (compactd's Java decoders, then the reduction as a group-by, the refused
records decided by the reference on the driver), over cached rows in Spark local[2], no Kafka fetch: what a
micro-batch does with its records once they are read. Beside it, the reference decoder (record by record, one core)
over a slice of the same records.

Mixes: `--format binary`: `__consumer_offsets` records, offset commits across value versions 0-4 (v4 with topic IDs),
offset tombstones, group metadata and group tombstones (the last two go to the reference on the driver); `--format
json`: offset commits, 30 % segment events. Prints one JSON object.
Usage: python bench/decode.py [--records N] [--format binary|json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import pyarrow as pa

from compactd.codec.offsets import (
    GroupValue,
    Member,
    OffsetValue,
    encode_assignment,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from compactd.streaming import columns
from compactd.streaming.aggregate import keyed
from compactd.streaming.decode import KAFKA_SCHEMA, Decoder, reduce_table
from compactd.streaming.session import spark_session, stop_spark


def records(n: int) -> tuple[list[bytes], list[bytes | None]]:
    member = Member("m-1", "client", "/10.0.0.1", 45000, b"", encode_assignment({"orders": [0, 1, 2]}), 300000)
    group_value = encode_group_value(GroupValue(4, "consumer", 7, "range", "m-1", 1763800000000, (member,)))
    keys, values = [], []
    for i in range(n):
        group, kind = f"group-{i % 500}", i % 20
        if kind < 16:
            keys.append(encode_offset_key(group, f"topic-{i % 50}", i % 12))
            values.append(
                encode_offset_value(
                    OffsetValue(kind % 5, i, "", 1763800000000 + i, leader_epoch=3 if kind % 5 >= 3 else -1)
                )
            )
        elif kind == 16:
            keys.append(encode_offset_key(group, "topic-0", 0))
            values.append(None)
        elif kind < 19:
            keys.append(encode_group_key(group))
            values.append(group_value)
        else:
            keys.append(encode_group_key(group))
            values.append(None)
    return keys, values


def json_records(n: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        if i % 10 < 3:
            ev = {"type": "segment_rolled", "topic": f"data-{i % 4}", "partition": i % 50, "base_offset": i * 10,
                  "end_offset": i * 10 + 10, "first_batch_max_ts": 1763800000000 + i, "size_bytes": 1 << 20,
                  "ts": 1763800000000 + i}  # fmt: skip
            out.append(("compactd.segments", json.dumps(ev).encode()))
        else:
            ev = {"type": "offset_commit", "group": f"group-{i % 20}", "topic": f"data-{i % 4}", "partition": i % 50,
                  "offset": i, "ts": 1763800000000}  # fmt: skip
            out.append(("compactd.commits", json.dumps(ev).encode()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--format", choices=("binary", "json"), default="binary")
    args = ap.parse_args()
    n = args.records
    if args.format == "binary":
        keys, values = records(n)
        topics = ["__consumer_offsets"] * n
    else:
        pairs = json_records(n)
        topics, values, keys = [t for t, _ in pairs], [v for _, v in pairs], [None] * n
    table = pa.table(
        {"topic": topics, "partition": [i % 16 for i in range(n)], "offset": list(range(n)), "key": keys,
         "value": values},
        schema=KAFKA_SCHEMA,
    )  # fmt: skip
    decoder = Decoder("compactd.segments", "compactd.commits")
    spark = spark_session()
    rows = spark.createDataFrame(table).repartition(16).persist()
    rows.count()
    fast = columns.FastPath(decoder)
    decoded = fast.decoded(rows)  # a row per record

    def timed(run: Callable[[], object]) -> float:
        run()  # the JIT's warm-up
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0

    decode_s = timed(lambda: decoded.write.format("noop").mode("overwrite").save())
    reduced = fast.reduced(rows)
    reduce_s = timed(lambda: keyed(reduce_table(decoder.complete(reduced.toArrow()))))
    ref_n = min(n, 100_000)
    t0 = time.perf_counter()
    decoder.rows(table.slice(0, ref_n).to_batches()[0])
    stop_spark(spark)  # compactd's stop: the first JVM on a machine keeps its class-data archive
    reference_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "benchmark": f"decode_{args.format}",
                "records": n,
                "decode_records_per_second": round(n / decode_s),
                "decode_reduce_collect_records_per_second": round(n / reduce_s),
                "reference_one_core_records_per_second": round(ref_n / reference_s),
                "path": "Java decoders + reduction in the tasks, refused records on the driver, local[2], cached rows",
            }
        )
    )


if __name__ == "__main__":
    main()
