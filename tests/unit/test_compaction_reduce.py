"""Phase one as pure rules: an incremental run (previous generation + delta) equals a full run over the whole history,
tombstones live delete.retention.ms in the view and hold the key deleted meanwhile, null keys are counted, and the
horizon stops before records younger than min.compaction.lag.ms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactd.compaction.manifest import appends_winners
from compactd.compaction.reduce import DELETED_AT, Record, horizon, reduce_partition
from compactd.compaction.strategy import Strategy
from compactd.compaction.view import table
from tests.support.compaction import last_record_wins

H = 3_600_000
NOW = 1_800_000_000_000
DAY = 24 * H


def rec(offset: int, key: str | None, value: str | None, ts: int = 0, version: int | None = None) -> Record:
    headers = () if version is None else (("v", version.to_bytes(8, "big", signed=True)),)
    return Record(offset, ts, None if key is None else key.encode(), None if value is None else value.encode(), headers)


def plain(records: list[Record]) -> list[tuple]:
    """A generation without the run-time bookkeeping header."""
    return [(r.offset, r.key, r.value, tuple(h for h in r.headers if h[0] != DELETED_AT)) for r in records]


history = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", None]),
        st.one_of(st.none(), st.sampled_from(["1", "2"])),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(0, 3)),
    ),
    max_size=30,
)
LATEST = [Strategy.of("timestamp", tombstone="latest"), Strategy.of("header", "v", tombstone="latest")]
strategies = st.sampled_from([Strategy.of("offset"), Strategy.of("timestamp"), Strategy.of("header", "v"), *LATEST])


@given(strategies, history, st.data())
def test_an_incremental_run_equals_a_full_run_over_the_whole_history(strategy, events, data) -> None:
    records = [rec(i, k, v, ts, ver) for i, (k, v, ts, ver) in enumerate(events)]
    cut = data.draw(st.integers(0, len(records)))
    first, _ = reduce_partition([], records[:cut], strategy, NOW)
    incremental, counts = reduce_partition(first, records[cut:], strategy, NOW + 1000)
    full, _ = reduce_partition([], records, strategy, NOW)
    assert plain(incremental) == plain(full)
    assert counts.keys == len({r.key for r in full if r.value is not None})
    assert [r.offset for r in incremental] == sorted(r.offset for r in incremental)


def latest_model(records: list[Record], strategy: Strategy) -> dict[bytes, Record]:
    """`tombstone: latest` written out plainly: a key whose last record is a tombstone is deleted; otherwise the
    KIP-280 winner among its records after its last tombstone."""
    from compactd.compaction.strategy import order_key

    out: dict[bytes, Record] = {}
    for key in {r.key for r in records if r.key is not None}:
        mine = [r for r in records if r.key == key]
        tombs = [r.offset for r in mine if r.tombstone]
        after = [r for r in mine if not r.tombstone and r.offset > max(tombs, default=-1)]
        if after:
            out[key] = max(after, key=lambda r: order_key(strategy, r.offset, r.timestamp, r.headers))
        else:
            out[key] = mine[-1]  # the last tombstone
    return out


@given(st.sampled_from(["timestamp", "header"]), history)
def test_latest_tombstones_delete_their_key_whatever_the_versions(kind, events) -> None:
    strategy = Strategy.of(kind, "v", tombstone="latest")  # type: ignore[arg-type]
    records = [rec(i, k, v, ts, ver) for i, (k, v, ts, ver) in enumerate(events)]
    got, _ = reduce_partition([], records, strategy, NOW)
    want = latest_model(records, strategy)
    assert {r.key: r.offset for r in got if r.key is not None} == {k: r.offset for k, r in want.items()}


def test_a_tombstone_without_a_version_deletes_a_versioned_key_only_under_latest() -> None:
    """Debezium's delete: a tombstone with no version header after a versioned row."""
    rows = [rec(0, "a", "1", version=7), rec(1, "a", None)]
    version, _ = reduce_partition([], rows, Strategy.of("header", "v"), NOW)
    latest, _ = reduce_partition([], rows, Strategy.of("header", "v", tombstone="latest"), NOW)
    assert [(r.offset, r.value) for r in version] == [(0, b"1")]  # KIP-280's literal rule: the key stays live
    assert [(r.offset, r.value) for r in latest] == [(1, None)]  # deleted


def test_a_tombstone_stays_for_delete_retention_and_holds_the_key_deleted_meanwhile() -> None:
    s = Strategy.of("header", "v")
    gen1, c1 = reduce_partition([], [rec(0, "k", "x", version=5), rec(1, "k", None, version=8)], s, NOW)
    assert [(r.offset, r.value) for r in gen1] == [(1, None)] and c1.tombstones == 1 and c1.keys == 0
    assert (DELETED_AT, str(NOW).encode()) in gen1[0].headers
    # a late update of a lower version, within delete.retention.ms: the key stays deleted
    gen2, _ = reduce_partition(gen1, [rec(2, "k", "late", version=6)], s, NOW + H, delete_retention_ms=DAY)
    assert [(r.offset, r.value) for r in gen2] == [(1, None)]
    assert gen2[0].headers == gen1[0].headers  # the tombstone's first time in the view is kept
    # past delete.retention.ms the tombstone goes, and with it the key
    gen3, c3 = reduce_partition(gen2, [], s, NOW + DAY, delete_retention_ms=DAY)
    assert gen3 == [] and c3.tombstones_expired == 1


def test_records_without_a_key_are_dropped_and_counted_unless_retained() -> None:
    records = [rec(0, None, "x"), rec(1, "k", "y"), rec(2, None, "z")]
    dropped, counts = reduce_partition([], records, Strategy(), NOW)
    assert [r.offset for r in dropped] == [1] and counts.null_keys == 2 and counts.records_in == 3
    kept, _ = reduce_partition([], records, Strategy(), NOW, retain_null_key=True)
    assert [r.offset for r in kept] == [0, 1, 2]


def test_the_horizon_stops_before_records_younger_than_min_compaction_lag() -> None:
    stamps = [(10, NOW - 5 * H), (11, NOW - 3 * H), (12, NOW - H // 2), (13, NOW - 4 * H)]
    assert horizon(10, 14, stamps, NOW, min_lag_ms=H) == 12  # 12 is too young; 13, older, waits behind it
    assert horizon(10, 14, stamps, NOW, min_lag_ms=0) == 14  # the last stable offset
    assert horizon(10, 12, stamps, NOW, min_lag_ms=H) == 12
    assert horizon(10, 10, stamps, NOW, min_lag_ms=H) == 10  # nothing new: the horizon never moves back


ALL = [*[Strategy.of(k, "v", tombstone=t) for k in ("offset", "timestamp", "header") for t in ("version", "latest")]]
few_keys = st.lists(  # two keys: a key deleted and written again within the delta is a common draw
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.one_of(st.none(), st.sampled_from(["1", "2"])),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(0, 3)),
    ),
    max_size=12,
)


def live(records: list[Record]) -> dict[bytes, bytes]:
    """The live keys of a table, as a plain reader's map."""
    return {r.key: r.value for r in records if r.key is not None and r.value is not None}


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: f"{s.kind}-{s.tombstone}")
@settings(max_examples=400)
@given(events=few_keys, data=st.data())
def test_an_appended_generation_read_last_record_wins_equals_a_full_run_where_the_rule_appends(
    strategy, events, data
) -> None:
    """A delta run writes the delta's winners after the previous generation, unread. A plain reader of the view (the
    last record of a key in log order wins) must then read the full run's live keys, and so must the view's table
    (the strategy over the view in log order). `appends_winners` says for which rules it is."""
    records = [rec(i, k, v, ts, ver) for i, (k, v, ts, ver) in enumerate(events)]
    cut = data.draw(st.integers(0, len(records)))
    base, _ = reduce_partition([], records[:cut], strategy, NOW)
    delta, _ = reduce_partition([], records[cut:], strategy, NOW)
    full, _ = reduce_partition([], records, strategy, NOW)
    if appends_winners(strategy):
        assert last_record_wins(base + delta) == live(table(full, strategy)) == last_record_wins(full)
        assert plain(table(base + delta, strategy)) == plain(table(full, strategy))
    assert [r.offset for r in base + delta] == sorted(r.offset for r in base + delta)  # still in log order


@pytest.mark.parametrize("tombstone", ["version", "latest"])
@pytest.mark.parametrize("kind", ["timestamp", "header"])
def test_a_delta_winner_that_loses_to_the_base_would_be_a_plain_readers_value_so_such_runs_rewrite(
    kind: str, tombstone: str
) -> None:
    """The witnesses `appends_winners` rules out: a late record ranked below the base's winner, and a late
    record for a key the base deleted. Appended, each is the last record of its key: a plain reader reads the wrong
    value, and the deleted key back."""
    strategy = Strategy.of(kind, "v", tombstone=tombstone)  # type: ignore[arg-type]
    records = [rec(0, "a", "a10", ts=10, version=10), rec(1, "b", None, ts=10, version=10)]
    late = [rec(2, "a", "a5", ts=5, version=5), rec(3, "b", "b5", ts=5, version=5)]
    base, _ = reduce_partition([], records, strategy, NOW)
    delta, _ = reduce_partition([], late, strategy, NOW)
    full, _ = reduce_partition([], records + late, strategy, NOW)
    if tombstone == "version":  # KIP-280's rule: the higher versions win, b stays deleted
        assert live(table(full, strategy)) == {b"a": b"a10"} == last_record_wins(full)
    assert last_record_wins(base + delta) == {b"a": b"a5", b"b": b"b5"} != last_record_wins(full)
    assert not appends_winners(strategy)


def test_latest_under_versions_does_not_merge_winners_so_such_runs_rewrite() -> None:
    """`tombstone: latest` under versions: the delta deletes the key and writes it again at a lower version, and even
    the view's table of base + delta would keep the base's higher version."""
    strategy = Strategy.of("header", "v", tombstone="latest")
    records = [rec(0, "a", "v10", version=10), rec(1, "a", None), rec(2, "a", "v5", version=5)]
    base, _ = reduce_partition([], records[:1], strategy, NOW)
    delta, _ = reduce_partition([], records[1:], strategy, NOW)
    full, _ = reduce_partition([], records, strategy, NOW)
    assert plain(full)[0][2] == b"v5" and plain(table(base + delta, strategy))[0][2] == b"v10"
    assert not appends_winners(strategy)
    assert appends_winners(Strategy.of("offset", tombstone="latest")) and appends_winners(Strategy())
