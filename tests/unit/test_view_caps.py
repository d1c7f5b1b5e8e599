"""What the compaction trigger records for the controller (compaction/view_caps.py): data, read once."""

from __future__ import annotations

from typing import Any

from compactd.compaction.view_caps import ViewCaps


def caps() -> ViewCaps:
    nothing: Any = None  # neither the mirror nor the manifest topic is read by what is tested here
    return ViewCaps(nothing, nothing)


def test_a_moved_cap_is_taken_once_and_in_order() -> None:
    c = caps()
    c.moved("b")
    c.moved("a")
    c.moved("b")
    assert c.take_moved() == ["a", "b"]
    assert c.take_moved() == []


def test_another_log_moves_the_cap_only_when_it_changes() -> None:
    c = caps()
    assert not c.another_log("orders", False)  # it was not another log: nothing moved
    assert c.take_moved() == []
    assert c.another_log("orders", True) and "orders" in c.changed
    assert not c.another_log("orders", True)  # said once
    assert c.take_moved() == ["orders"]
    assert c.another_log("orders", False) and "orders" not in c.changed  # a new view of the new log caps again
    assert c.take_moved() == ["orders"]
