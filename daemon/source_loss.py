"""Records of compactd's sources deleted before the stream read them, said in one line.

Spark's Kafka connector reads with `failOnDataLoss` off (streaming/job.py says why): it goes on from the log start and
logs in the JVM's log, which nobody reads. This check runs before a batch's records are read: a source partition whose
log start is already past where the batch starts (the previous batch's end, from Spark's offset log) has lost the
records in between, to the topic's retention or a deleteRecords. What they said only ever held deletes back, so the job
goes on; the line names the topic and the setting that would have kept them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from compactd.control.metrics import Metrics
from compactd.kafka.admin import admin_client
from compactd.kafka.config import KafkaConnection
from compactd.kafka.watermarks import list_offsets
from compactd.streaming.checkpoint import batch_end_offsets

log = logging.getLogger("compactd.source")
TIMEOUT_S = 5.0


class SourceLoss:
    """Callable before each batch's read (`StreamSpec.before_read`)."""

    def __init__(self, conn: KafkaConnection, spark_checkpoint: Path, metrics: Metrics) -> None:
        self.conn = conn
        self.checkpoint = spark_checkpoint
        self.metrics = metrics
        self._admin: Any = None

    def __call__(self, batch_id: int) -> None:
        start = batch_end_offsets(self.checkpoint, batch_id - 1) if batch_id > 0 else {}
        if not start:
            return
        try:
            lows = self._log_starts(start)
        except Exception as exc:  # the broker is away: the batch's own read will meet it; nothing to say here
            log.debug("source loss check skipped: %s", exc)
            return
        for topic, parts in sorted(lows.items()):
            lost = {p: (start[topic][p], low) for p, low in parts.items() if low > start[topic][p]}
            if not lost:
                continue
            n = sum(low - at for at, low in lost.values())
            self.metrics.source_records_lost.labels(topic).inc(n)
            ordered = sorted(lost.items(), key=lambda item: int(item[0]))
            spans = ", ".join(f"{topic}/{p} [{at}, {low})" for p, (at, low) in ordered)
            log.warning(
                "%d records of %s were deleted before compactd read them (%s): their events are lost, which only holds "
                "deletes back; raise retention.ms on %s above the time compactd may be stopped",
                n, topic, spans, topic,
            )  # fmt: skip

    def _log_starts(self, start: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if self._admin is None:
            self._admin = admin_client(self.conn)
        request = {TopicPartition(t, int(p)): OffsetSpec.earliest() for t, parts in start.items() for p in parts}
        out: dict[str, dict[str, int]] = {}
        for tp, offset in list_offsets(self._admin, request, IsolationLevel.READ_UNCOMMITTED, TIMEOUT_S).items():
            out.setdefault(tp.topic, {})[str(tp.partition)] = offset
        return out
