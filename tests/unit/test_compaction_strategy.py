"""KIP-280's winner per key, exactly: highest offset, timestamp or header version; ties to the highest offset; a record
with the header beats one without; the same winner whatever order or grouping the records are reduced in."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from compactd.compaction.strategy import Strategy, header_version, order_key, winner

V = "v"


def long(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def test_offset_keeps_the_highest_offset_whatever_the_timestamps() -> None:
    s = Strategy.of("offset")
    assert winner(s, [(5, 900, ()), (7, 100, ()), (6, 999, ())]) == (7, 100, ())


def test_timestamp_keeps_the_newest_record_and_ties_go_to_the_highest_offset() -> None:
    s = Strategy.of("timestamp")
    assert winner(s, [(5, 900, ()), (7, 100, ()), (6, 999, ())])[0] == 6
    assert winner(s, [(5, 900, ()), (9, 900, ()), (6, 100, ())])[0] == 9


def test_header_keeps_the_highest_version_with_the_header_and_ties_go_to_the_highest_offset() -> None:
    s = Strategy.of("header", V)
    recs = [(1, 0, [(V, long(10))]), (2, 0, [(V, long(3))]), (3, 0, [(V, long(10))]), (4, 0, [])]
    assert winner(s, recs)[0] == 3  # 10 twice: the later one; the newest record has no header and loses
    assert winner(s, [(1, 0, []), (2, 0, [("other", long(5))])])[0] == 2  # neither carries it: highest offset


def test_a_header_that_does_not_parse_counts_as_no_header() -> None:
    s = Strategy.of("header", V)
    assert winner(s, [(1, 0, [(V, long(-5))]), (2, 0, [(V, b"\x01\x02")]), (3, 0, [(V, None)])])[0] == 1
    assert header_version([(V, b"42")], V, "decimal") == 42 and header_version([(V, b"-7")], V, "decimal") == -7
    assert header_version([(V, b"4x")], V, "decimal") is None
    assert header_version([(V, b"99999999999999999999")], V, "decimal") is None  # beyond a long
    assert header_version([(V, long(1)), (V, long(9))], V) == 9  # the last header of that name


def test_header_strategy_without_a_header_name_is_offset() -> None:
    assert Strategy.of("header", "") == Strategy.of("header") == Strategy("offset")
    assert winner(Strategy.of("header"), [(1, 0, [(V, long(99))]), (2, 0, [])])[0] == 2


def test_a_winning_tombstone_keeps_its_version_so_a_late_lower_version_does_not_resurrect_the_key() -> None:
    s = Strategy.of("header", V)
    tombstone = (10, 0, [(V, long(8))])  # the delete, version 8, still in the view
    late = (11, 0, [(V, long(5))])  # an older update arriving after it
    assert winner(s, [tombstone, late]) == tombstone


records = st.lists(
    st.tuples(
        st.integers(0, 50),  # timestamp, often equal
        st.one_of(
            st.just([]),
            st.lists(st.tuples(st.sampled_from([V, "x"]), st.one_of(st.none(), st.binary(min_size=8, max_size=8)))),
        ),
    ),
    min_size=1,
    max_size=12,
)
kinds = st.sampled_from([Strategy.of("offset"), Strategy.of("timestamp"), Strategy.of("header", V)])


@given(kinds, records, st.randoms())
def test_the_winner_does_not_depend_on_order_or_grouping(strategy: Strategy, recs, rnd: random.Random) -> None:
    numbered = [(offset, ts, headers) for offset, (ts, headers) in enumerate(recs)]
    expected = winner(strategy, numbered)
    shuffled = numbered[:]
    rnd.shuffle(shuffled)
    cut = rnd.randint(0, len(shuffled))
    partial = [w for w in (winner(strategy, shuffled[:cut]), winner(strategy, shuffled[cut:])) if w is not None]
    assert winner(strategy, shuffled) == expected == winner(strategy, partial)
    # and it is the record KIP-280's rules name, written out plainly
    if strategy.kind == "offset":
        assert expected[0] == max(r[0] for r in numbered)
    elif strategy.kind == "timestamp":
        top = max(r[1] for r in numbered)
        assert expected[0] == max(r[0] for r in numbered if r[1] == top)
    else:
        versions = {r[0]: header_version(r[2], V) for r in numbered}
        carrying = [o for o, v in versions.items() if v is not None]
        if carrying:
            top = max(versions[o] for o in carrying)
            assert expected[0] == max(o for o in carrying if versions[o] == top)
        else:
            assert expected[0] == max(versions)
    assert order_key(strategy, *expected) == max(order_key(strategy, *r) for r in numbered)


def test_the_compaction_service_keys_are_config_keys_with_the_contracts_defaults() -> None:
    from compactd.errors import ConfigError
    from compactd.policy.thresholds import Thresholds, resolve, validate_layer

    th = Thresholds()
    assert (th.compaction_service, th.compaction_strategy, th.delete_retention_ms) == (False, "offset", 86_400_000)
    assert (th.compaction_strategy_header_format, th.compaction_retain_null_key) == ("long", False)
    layer = {"compaction.service": True, "compaction.strategy": "header", "compaction.strategy.header": "lsn"}
    validate_layer("topic:cdc", layer)
    th = resolve({"topic:cdc": layer}, "cdc", 0)
    rule = Strategy.of(th.compaction_strategy, th.compaction_strategy_header, th.compaction_strategy_header_format)
    assert rule == Strategy("header", "lsn", "long") and th.compaction_strategy_tombstone == "version"
    validate_layer("topic:cdc", {"compaction.strategy.tombstone": "latest"})
    try:
        validate_layer("topic:cdc", {"compaction.strategy.tombstone": "newest"})
    except ConfigError as exc:
        assert "compaction.strategy.tombstone" in str(exc)
    else:
        raise AssertionError("an unknown tombstone rule was accepted")
    for bad in ({"compaction.strategy": "lsn"}, {"delete.retention.ms": -1}, {"compaction.threshold.bytes": -5}):
        try:
            validate_layer("topic:cdc", bad)
        except ConfigError:
            continue
        raise AssertionError(f"accepted {bad}")
