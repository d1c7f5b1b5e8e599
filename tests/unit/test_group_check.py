"""Which groups the cluster check reads for a topic, and which failures hold that topic back (kafka/groups.py, pure
parts; tests/integration/test_cluster_offsets_check.py runs the whole check against the real broker)."""

from __future__ import annotations

from compactd.kafka.groups import _Fetched, failure_for, to_fetch


def fetched(at: float, topics: dict[str, int] | None, error: str = "", held: frozenset[str] = frozenset()) -> _Fetched:
    return _Fetched(at, None if topics is None else {(t, 0): o for t, o in topics.items()}, error, held)


def test_only_the_topics_holders_and_never_fetched_groups_are_read_once_per_ttl() -> None:
    known = {"billing": fetched(0, {"orders": 5}), "audit": fetched(0, {"payments": 1}), "idle": fetched(9, {})}
    listed = {"billing", "audit", "idle", "brand-new"}
    # within the ttl only the group never fetched is read
    assert to_fetch("orders", set(), listed, known, now=4, ttl_s=5) == ["brand-new"]
    # past it: the groups holding `orders` (by their last fetch, or by compactd's state) and the new one
    assert to_fetch("orders", {"idle"}, listed, known, now=10, ttl_s=5) == ["billing", "brand-new"]
    assert to_fetch("orders", {"ghost"}, listed, known, now=10, ttl_s=5) == ["billing", "brand-new"]  # not listed


def test_a_groups_failure_holds_only_the_topics_it_holds() -> None:
    known = {
        "billing": fetched(0, {"orders": 5}),
        "audit": fetched(1, None, "GROUP_AUTHORIZATION_FAILED", held=frozenset({"payments"})),
    }
    assert failure_for("orders", set(), known) is None
    assert failure_for("payments", set(), known) == "group audit: GROUP_AUTHORIZATION_FAILED"
    assert failure_for("orders", {"audit"}, known) is not None  # compactd's state says audit holds orders too
    known["never-read"] = fetched(1, None, "COORDINATOR_NOT_AVAILABLE")  # its topics are unknown: it may hold any
    assert failure_for("orders", set(), known) == "group never-read: COORDINATOR_NOT_AVAILABLE"
