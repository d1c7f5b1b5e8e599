"""A Redis that is not the state the checkpoint assumes is named as lost; the delete gate waits on every source."""

from __future__ import annotations

from compactd.policy.health import state_loss
from compactd.policy.readiness import Readiness

E = "a" * 32


def test_matching_epoch_and_batch_is_not_a_loss() -> None:
    assert state_loss(E, {"epoch": E, "batch:s": "7"}, "s", 7, True) is None
    assert state_loss(E, {"epoch": E, "batch:s": "8"}, "s", 7, True) is None  # merged, not yet committed by Spark


def test_a_redis_without_the_epoch_is_a_loss() -> None:
    assert "no state epoch" in (state_loss(E, {}, "s", 3, False) or "")
    assert "no state epoch" in (state_loss(E, {"batch:s": "4"}, "s", 3, True) or "")  # a write after a FLUSHALL


def test_another_epoch_is_a_loss() -> None:
    assert "expects aaaaaaaa" in (state_loss(E, {"epoch": "b" * 32}, "s", None, True) or "")


def test_an_older_merged_batch_means_lost_writes() -> None:
    why = state_loss(E, {"epoch": E, "batch:s": "5"}, "s", 7, True)
    assert why is not None and "lost writes" in why
    assert state_loss(E, {"epoch": E}, "s", 0, True) is not None


def test_a_checkpoint_from_before_epochs_adopts_a_redis_with_state_but_not_an_empty_one() -> None:
    assert state_loss(None, {}, "s", 12, has_state=True) is None
    assert state_loss(None, {}, "s", None, has_state=False) is None  # first start
    assert "holds no state" in (state_loss(None, {}, "s", 12, has_state=False) or "")


def test_the_gate_waits_for_every_topic_it_was_armed_on() -> None:
    gate = Readiness({"commits": {"0": 10}, "config": {"0": 3}}, why="state rebuilding after a loss")
    assert not gate.ready()
    assert not gate.observe({"commits": {"0": 10}, "config": {"0": 2}})
    assert gate.observe({"commits": {"0": 11}, "config": {"0": 3}})
    assert gate.ready() and not gate.observe({})
    assert Readiness(None).ready() and Readiness({"t": {"0": 0}}).ready()
