"""The compaction rules as Spark Column expressions (compaction/columns.py) pick, for every key, the winner the pure
rules pick (`reduce.reduce_partition` over `strategy.order_key` and `strategy.replaces`), under every strategy and
both tombstone rules, on generated histories: keys reused and absent, tombstones, timestamps tied and out of order,
version headers missing, null, malformed, out of a long's range, of another name, or given twice."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from compactd.compaction import columns
from compactd.compaction.reduce import Record, reduce_partition
from compactd.compaction.strategy import LONG_MAX, LONG_MIN, Strategy, header_version
from tests.support.examples import examples

pytestmark = pytest.mark.spark

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.timestamp("ms")),
                    ("key", pa.binary()), ("value", pa.binary()), ("headers", HEADERS_TYPE)])  # fmt: skip
STRATEGIES = [
    Strategy.of(kind, "v" if kind == "header" else None, fmt, tombstone)  # type: ignore[arg-type]
    for kind, fmt in (("offset", "long"), ("timestamp", "long"), ("header", "long"), ("header", "decimal"))
    for tombstone in ("version", "latest")
]
ODD_VALUES = [b"12", b" -7 ", b"+5", b"\x1f3\x0b", b"x", b"", b"1e3", b"\xff1", b"007", b"99999999999999999999",
              b"-9223372036854775808", b"9223372036854775808", b"\t+0\r"]  # fmt: skip
header_value = (
    st.none()
    | st.sampled_from(ODD_VALUES)
    | st.integers(LONG_MIN, LONG_MAX).map(lambda v: v.to_bytes(8, "big", signed=True))
    | st.binary(max_size=9)
)
headers = st.none() | st.lists(st.tuples(st.sampled_from(["v", "v", "w"]), header_value), max_size=3)
record = st.tuples(
    st.sampled_from([None, b"a", b"b", b"c", b"d"]),  # key
    st.sampled_from([None, b"x", b"y"]),  # value: None is a tombstone
    st.integers(-5, 5).map(lambda t: 1_700_000_000_000 + t),  # timestamps tie and go back
    headers,
)


def table(history: list[list[tuple]]) -> pa.Table:
    rows = [(p, off, ts, k, v, h) for p, recs in enumerate(history) for off, (k, v, ts, h) in enumerate(recs)]
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMA]
    return pa.table([pa.array(c, f.type) for c, f in zip(cols, SCHEMA, strict=True)], schema=SCHEMA)


def reference(history: list[list[tuple]], strategy: Strategy) -> set[tuple[int, int]]:
    out = set()
    for p, recs in enumerate(history):
        records = [Record(off, ts, k, v, tuple(h or ())) for off, (k, v, ts, h) in enumerate(recs)]
        kept, _ = reduce_partition([], records, strategy, now=0, delete_retention_ms=2**62)
        out |= {(p, r.offset) for r in kept}
    return out


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(st.lists(st.lists(record, max_size=40), min_size=1, max_size=3))
def test_the_columns_pick_the_winners_the_pure_rules_pick(spark: Any, history: list[list[tuple]]) -> None:
    rows = spark.createDataFrame(table(history))
    # every strategy in one Spark job: one branch each, tagged
    tagged = [
        columns.winners(rows, s).select(F.lit(i).alias("s"), "partition", "offset", "n")
        for i, s in enumerate(STRATEGIES)
    ]
    union = tagged[0]
    for t in tagged[1:]:
        union = union.unionByName(t)
    got: dict[int, set[tuple[int, int]]] = {i: set() for i in range(len(STRATEGIES))}
    counted: dict[int, int] = {i: 0 for i in range(len(STRATEGIES))}
    for r in union.toArrow().to_pylist():
        got[r["s"]].add((r["partition"], r["offset"]))
        counted[r["s"]] += r["n"]
    keyed = sum(1 for recs in history for k, *_ in recs if k is not None)
    for i, strategy in enumerate(STRATEGIES):
        assert got[i] == reference(history, strategy), strategy
        assert counted[i] == keyed, strategy  # every record with a key is counted by its key's winner


def test_header_versions_parse_as_the_pure_rule_parses(spark: Any) -> None:
    values = [None, *ODD_VALUES, *(v.to_bytes(8, "big", signed=True) for v in (0, -1, LONG_MIN, LONG_MAX, 7)),
              b"\x00" * 7, b"\x00" * 9]  # fmt: skip
    cases = [[("v", v)] for v in values] + [
        None,
        [],
        [("w", b"5")],
        [("v", b"5"), ("v", b"x")],
        [("v", b"x"), ("v", b"6")],
    ]
    t = pa.table({"headers": pa.array(cases, HEADERS_TYPE)})
    df = spark.createDataFrame(t)
    for fmt in ("long", "decimal"):
        got = [r["h"] for r in df.select(columns.header_version(F.col("headers"), "v", fmt).alias("h")).collect()]
        assert got == [header_version(c or (), "v", fmt) for c in cases], fmt  # type: ignore[arg-type]
