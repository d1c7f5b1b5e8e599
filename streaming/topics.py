"""Create compactd's own topics when they are missing (operators may pre-create them with their own layout)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streaming.kafka_source import list_end_offsets
from streaming.settings import Settings


def ensure_topics(settings: Settings, partitions: int = 1, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, **settings.kafka})
    t = settings.topics
    names = (t.segments, t.commits, t.config, t.actions, t.dlq)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [NewTopic(t, partitions, 1) for t in names if t not in existing]
    if not wanted:
        return
    for topic, fut in admin.create_topics(wanted, request_timeout=timeout_s).items():
        try:
            fut.result(timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"cannot create topic {topic}: {exc.args[0]}") from exc


def high_watermarks(settings: Settings, topic: str) -> dict[str, int]:
    """Where each partition ends for a read_committed reader (keys as the source's offsets use them)."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, **settings.kafka})
    return list_end_offsets(admin, [topic], "high").get(topic, {})
