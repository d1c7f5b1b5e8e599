"""Decode throughput for `__consumer_offsets` records (records/s), through the same Arrow path Spark uses.

Mix: offset commits across value versions 0-4, offset tombstones, group metadata and group tombstones.
Prints one JSON object. Usage: python bench/decode_offsets.py [--records N]
"""

from __future__ import annotations

import argparse
import json
import time

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
from compactd.streaming.decode import KAFKA_SCHEMA, Decoder


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--batch", type=int, default=100_000)
    args = ap.parse_args()
    keys, values = records(args.records)
    n = len(keys)
    batches = []
    for start in range(0, n, args.batch):
        end = min(start + args.batch, n)
        batches.append(
            pa.RecordBatch.from_pydict(
                {
                    "key": keys[start:end],
                    "value": values[start:end],
                    "topic": ["__consumer_offsets"] * (end - start),
                    "partition": [0] * (end - start),
                    "offset": list(range(start, end)),
                },
                schema=KAFKA_SCHEMA,
            )
        )
    decoder = Decoder("compactd.segments", "compactd.commits")
    t0 = time.perf_counter()
    out = sum(b.num_rows for b in decoder(iter(batches)))
    seconds = time.perf_counter() - t0
    assert out == n
    print(
        json.dumps(
            {
                "benchmark": "consumer_offsets_decode",
                "records": n,
                "seconds": round(seconds, 3),
                "records_per_second": round(n / seconds),
                "path": "Decoder (Arrow in/out), one core",
            }
        )
    )


if __name__ == "__main__":
    main()
