"""The topics compactd creates for itself, as the broker describes them afterwards."""

from __future__ import annotations

from compactd.kafka.admin import ensure_topics
from tests.integration.test_sinks_and_controller import topic_config
from tests.support import kraft


def test_sources_a_rebuild_reads_are_kept_and_the_cluster_picks_the_replicas(cluster, job_settings) -> None:
    s = job_settings()
    ensure_topics(cluster.conn, s.own_topics(), configs=s.own_topic_configs(), replication_factor=-1)
    t = s.topics
    for topic in s.own_topics():  # the broker describes a topic a moment after CreateTopics answered
        kraft.until_visible(cluster.conn, topic)
    # compacted: the last commit per (group, topic, partition) and every nudge not yet put back stay for a rebuild
    assert topic_config(cluster.bootstrap, t.commits, "cleanup.policy")[0] == "compact"
    assert topic_config(cluster.bootstrap, t.nudges, "cleanup.policy")[0] == "compact"
    assert topic_config(cluster.bootstrap, t.config, "retention.ms")[0] == "-1"  # deltas: every one kept
    md = cluster.admin.list_topics(timeout=10).topics
    assert all(t_ in md and md[t_].error is None for t_ in s.own_topics())  # -1: the broker's default replicas
