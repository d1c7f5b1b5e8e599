"""The one reduction (`reduce_table`, run by the source's tasks, the driver and the evaluation slices' tasks): reducing
each input partition and then the union (as the source's tasks and the driver, or a share's task, do together) gives
the same rows and counts as one reduction of every record, and that equals a plain group-by with max-by written
independently here."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.streaming.decode import DECODED_SCHEMA, reduce_table
from tests.support.examples import examples

KINDS = ("offset_commit", "offset_delete", "segment_rolled", "compacted", "log_start", "group_delete", "config")


@st.composite
def records(draw: st.DrawFn) -> list[dict]:
    """Decoded rows of several source partitions, in log order per partition (what a Kafka read yields)."""
    out: list[dict] = []
    forward = iter(range(10**6))  # distinct cleaner/log-start offsets (ties: test_equal_order_keeps_the_last_by_...)
    # the JSON commits topic (a group's deletion and commits in different partitions: event times order them) or
    # another stream (log order)
    stream = draw(st.sampled_from(["commits", "x"]))
    for src_partition in range(draw(st.integers(1, 4))):
        for src_offset in range(draw(st.integers(0, 40))):
            kind = draw(st.sampled_from(KINDS))
            row: dict = {"stream": stream, "kind": kind, "src_partition": src_partition, "src_offset": src_offset}
            if stream == "commits" and kind in ("offset_commit", "offset_delete", "group_delete"):
                row["ts"] = draw(st.integers(0, 5))  # few values: ties between a commit and a deletion happen
            if draw(st.integers(0, 9)) == 0:
                row.update(kind=None, error="malformed_json")
            elif kind in ("offset_commit", "offset_delete"):
                row.update(grp=draw(st.sampled_from("abc")), topic="t", partition=draw(st.integers(0, 2)))
                row["value_offset"] = src_offset if kind == "offset_commit" else None
            elif kind == "segment_rolled":
                row.update(topic="t", partition=draw(st.integers(0, 2)), base_offset=draw(st.sampled_from([0, 100])))
            elif kind in ("compacted", "log_start"):
                row.update(topic="t", partition=draw(st.integers(0, 2)), value_offset=next(forward) * 7 % 1000)
                row["ts"] = 1_800_000_000_000 + src_offset  # a clean's time goes with its cleaned_up_to
            elif kind == "group_delete":
                row.update(grp=draw(st.sampled_from("abc")))
            out.append(row)
    return out


def reference(rows: list[dict]) -> tuple[dict, list]:
    """Group by state key, max by order, count — written from the rules, not from reduce_table."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    singles = []
    for r in rows:
        if r.get("error") or r["kind"] == "config":
            singles.append(r)
            continue
        k = "offset" if r["kind"] in ("offset_commit", "offset_delete") else r["kind"]
        groups[(k, r.get("topic"), r.get("partition"), r.get("grp"), r.get("base_offset"))].append(r)

    def order(r: dict) -> tuple:
        if r["kind"] in ("compacted", "log_start"):
            return (r["value_offset"], 0)
        return (r["src_partition"], r["src_offset"])

    return {key: (max(rs, key=order), len(rs)) for key, rs in groups.items()}, singles


def reduced(rows: list[dict]) -> tuple[dict, list]:
    out, singles = {}, []
    for r in rows:
        if r.get("error") or r["kind"] == "config":
            singles.append(r)
            continue
        k = "offset" if r["kind"] in ("offset_commit", "offset_delete") else r["kind"]
        key = (k, r.get("topic"), r.get("partition"), r.get("grp"), r.get("base_offset"))
        assert key not in out, "one row per key"
        out[key] = ({f: v for f, v in r.items() if f != "n" and v is not None}, r["n"])
    return out, singles


def positions(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted((r["src_partition"], r["src_offset"]) for r in rows)


def reduce(rows: list[dict]) -> list[dict]:
    table = pa.Table.from_pylist([{"n": 1, **r} for r in rows], schema=DECODED_SCHEMA)
    return reduce_table(table).to_pylist()


def plain(rows: list[dict]) -> list[dict]:
    return [{f: v for f, v in r.items() if v is not None} for r in rows]


@settings(max_examples=examples(300), deadline=None)
@given(records())
def test_per_partition_then_union_equals_one_reduction_and_the_reference(rows: list[dict]) -> None:
    expected, expected_singles = reference(plain(rows))

    got, singles = reduced(plain(reduce(rows)))
    assert got == expected and positions(singles) == positions(expected_singles)

    per_partition: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        per_partition[r["src_partition"]].append(r)
    tasks = [row for part in per_partition.values() for row in reduce(part)]  # what each source task does
    union = reduce(tasks)  # what the driver does with their output (it sums n)
    got, singles = reduced(plain(union))
    assert got == expected and positions(singles) == positions(expected_singles)
    assert sum(r["n"] for r in union) == len(rows)


def test_equal_order_keeps_the_last_by_source_position() -> None:
    """Two cleaner checkpoints at the same offset: the later record of the source wins, whatever order the rows come
    in (the fast path's tasks and the driver see them in different orders, and must pick the same one)."""
    a = {"stream": "x", "kind": "compacted", "topic": "t", "partition": 0, "value_offset": 5, "ts": 1,
         "src_partition": 0, "src_offset": 0}  # fmt: skip
    b = {**a, "ts": 2, "src_offset": 1}
    assert [r["ts"] for r in reduce([a, b])] == [2]
    assert [r["ts"] for r in reduce([b, a])] == [2]
