"""groups.required: a group that always counts, even when it has no offset on a topic (a weekly job whose offsets
expired after offsets.retention.minutes): real broker, real Redis, the real controller and admin sink."""

from __future__ import annotations

from compactd.model import Segment
from compactd.state.changes import BatchChanges
from tests.integration.test_sinks_and_controller import T0, H, make_controller, segment_batch


def test_a_required_group_without_offsets_holds_consumed_retention(cluster, rclient) -> None:
    topic = cluster.name("weekly")
    cluster.create(topic, 1, {"cleanup.policy": "delete"})
    cluster.fill(topic, 400)
    clock = [T0]
    layers = {
        "global": {"dry.run": False},
        f"topic:{topic}": {"consumed.retention.ms": H, "groups.required": ["etl-weekly"]},
    }
    ctl, actions = make_controller(cluster, rclient, clock, layers)
    old = T0 - 2 * H
    c = segment_batch(topic, Segment(0, 100, 0, 1, old), Segment(100, 200, 0, 1, old))
    c.topic(topic).offsets.append(("billing", 0, 250))
    ctl.on_batch("s", 0, c)
    assert cluster.read_all(actions) == []  # etl-weekly has never committed on the topic: nothing is deleted
    view = ctl.state.view(topic, 0)
    assert (view.counted_groups, view.min_committed) == (2, None)

    c = BatchChanges()
    c.topic(topic).offsets.append(("etl-weekly", 0, 150))
    ctl.on_batch("s", 1, c)
    assert [(a["before_offset"], a["status"]) for a in cluster.read_all(actions)] == [(100, "sent")]

    # the weekly job's offsets expire (tombstones): it still counts, so nothing more goes while it has none
    c = segment_batch(topic, Segment(200, 300, 0, 1, old))
    c.topic(topic).offsets.append(("etl-weekly", 0, None))
    c.topic(topic).log_start.append((0, 100))
    ctl.on_batch("s", 2, c)
    assert len(cluster.read_all(actions)) == 1 and cluster.watermarks(topic) == (100, 400)
    assert ctl.state.view(topic, 0).min_committed is None

    # no longer required: the minimum is billing's alone, and the delete it allows goes
    layers[f"topic:{topic}"] = {"consumed.retention.ms": H}
    ctl.set_layers(layers)
    ctl.evaluate(ctl.recount_groups(), "config")
    assert [(a["before_offset"], a["status"]) for a in cluster.read_all(actions)][1:] == [(200, "sent")]
    assert cluster.watermarks(topic) == (200, 400)
