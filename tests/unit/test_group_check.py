"""Which groups the cluster check reads for a topic, and which failures hold that topic back (kafka/groups.py, pure
parts; tests/integration/test_cluster_offsets_check.py runs the whole check against the real broker)."""

from __future__ import annotations

from compactd.kafka.groups import _Fetched, failure_for, to_fetch


def fetched(at: float, topics: dict[str, int] | None, error: str = "", held: frozenset[str] = frozenset()) -> _Fetched:
    return _Fetched(at, None if topics is None else {(t, 0): o for t, o in topics.items()}, error, held)


def test_every_listed_group_is_read_once_its_answer_is_older_than_the_ttl_whatever_its_topics() -> None:
    known = {"billing": fetched(0, {"orders": 5}), "audit": fetched(0, {"payments": 1}), "idle": fetched(9, {})}
    listed = {"billing", "audit", "idle", "brand-new"}
    # within the ttl only the group never fetched is read
    assert to_fetch("orders", set(), listed, known, now=4, ttl_s=5) == ["brand-new"]
    # past it: every listed group whose answer is that old, `audit` too (read for payments, it may have committed
    # on orders since: issue 64); `idle` was read within the ttl; `ghost` is not listed
    assert to_fetch("orders", {"ghost"}, listed, known, now=10, ttl_s=5) == ["audit", "billing", "brand-new"]
    # fresh (a cached answer held the delete): the groups that may hold orders are read again within the ttl too
    assert to_fetch("orders", {"idle"}, listed, known, now=4, ttl_s=5, fresh=True) == ["billing", "brand-new", "idle"]


def test_a_listed_groups_failure_holds_every_topic() -> None:
    known = {
        "billing": fetched(0, {"orders": 5}),
        "audit": fetched(1, None, "GROUP_AUTHORIZATION_FAILED", held=frozenset({"payments"})),
    }
    # audit's last good fetch showed payments only, but it may have committed on orders since
    assert failure_for({"billing", "audit"}, known) == "group audit: GROUP_AUTHORIZATION_FAILED"
    assert failure_for({"billing"}, known) is None  # a group the cluster no longer lists holds nothing
