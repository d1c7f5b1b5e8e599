"""Create compactd's own topics when they are missing (operators may pre-create them with their own layout)."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

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


def high_watermarks(settings: Settings, topic: str, timeout_s: float = 30.0) -> dict[str, int]:
    """High watermark per partition (keys as the source's offsets use them); {} if the topic does not exist."""
    consumer = Consumer(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": "compactd-watermarks", **settings.kafka}
    )
    try:
        md = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if md is None or md.error is not None:
            return {}
        return {
            str(p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)[1]
            for p in md.partitions
        }
    finally:
        consumer.close()
