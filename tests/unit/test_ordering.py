"""The test ordering puts each slow test at the head of a worker's first block, the longest ones apart."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.support.ordering import SLOW, spread


@dataclass
class Item:
    nodeid: str
    fixturenames: tuple[str, ...] = field(default=())


def test_each_block_opens_with_its_share_of_the_slow_tests_and_nothing_is_lost() -> None:
    slow = [Item(f"tests/x/{suffix}") for suffix in SLOW]
    items = (
        [Item(f"tests/a/test_{i}.py::t") for i in range(50)]
        + slow
        + [Item(f"tests/z/test_{i}.py::t") for i in range(40)]
    )
    out = spread(items, 4)  # type: ignore[arg-type]
    assert sorted(i.nodeid for i in out) == sorted(i.nodeid for i in items)
    left, heads = len(out), []
    start = 0
    for k in range(4):
        size = left // (4 - k)
        left -= size
        heads.append(out[start])
        start += size
    longest = sorted(SLOW.values(), reverse=True)[:4]
    assert sorted((SLOW[h.nodeid.split("/", 2)[2]] for h in heads), reverse=True) == longest
    assert spread(items, 1) == items  # type: ignore[arg-type]


def test_the_tests_that_start_no_spark_open_each_block_ahead_of_the_slow_ones() -> None:
    slow = [Item(f"tests/x/{suffix}") for suffix in SLOW]
    quick = [Item(f"tests/unit/test_{i}.py::t") for i in range(30)]
    spark = [Item(f"tests/e2e/test_{i}.py::t") for i in range(30)]
    items = spark + slow + quick
    out = spread(items, 3, first=lambda i: i.nodeid.startswith("tests/unit/"))  # type: ignore[arg-type]
    assert sorted(i.nodeid for i in out) == sorted(i.nodeid for i in items)
    left, start = len(out), 0
    for k in range(3):
        size = left // (3 - k)
        left -= size
        block = out[start : start + size]
        start += size
        kinds = ["quick" if i in quick else "slow" if i in slow else "spark" for i in block]
        assert kinds == sorted(kinds, key=["quick", "slow", "spark"].index)  # quick, then slow, then the rest
        assert kinds.count("quick") == 10 and "slow" in kinds


def blocks(out: list, workers: int) -> list[list]:
    left, start, found = len(out), 0, []
    for k in range(workers):
        size = left // (workers - k)
        left -= size
        found.append(out[start : start + size])
        start += size
    return found


def test_the_tests_of_a_module_sharing_a_three_node_cluster_run_on_one_worker() -> None:
    """kafka3 is module-scoped: spread over two workers, each would start its own three nodes."""
    slow = [Item(f"tests/x/{suffix}") for suffix in SLOW]
    shared = [Item(f"tests/e2e/test_r.py::t{i}", ("kafka3",)) for i in range(4)]
    items = shared[:2] + [Item(f"tests/a/test_{i}.py::t") for i in range(60)] + slow + shared[2:]
    out = spread(items, 3)  # type: ignore[arg-type]
    assert sorted(i.nodeid for i in out) == sorted(i.nodeid for i in items)
    [holder] = [b for b in blocks(out, 3) if any(i in shared for i in b)]
    at = [holder.index(i) for i in shared]
    assert at == list(range(at[0], at[0] + 4))  # together, in collection order
