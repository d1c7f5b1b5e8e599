"""A Spark streaming source for Kafka built on confluent-kafka (Python data source API).

Rows have the shape of Spark's own Kafka source (key, value, topic, partition, offset, timestamp,
timestampType), so a cluster with the spark-sql-kafka jar can switch with `format("kafka")`.
Source offsets are `{"topic": {"partition": next_offset}}`: Spark's checkpoint owns progress.

Options: `kafka.bootstrap.servers`, `subscribe` (comma list), `startingOffsets` (earliest|latest),
`maxOffsetsPerTrigger` (record cap per micro-batch), `kafka.<any librdkafka key>`, `readTimeoutMs`, and `decoder`
(a `Decoder.to_option()`): with it, each task decodes its records and pre-aggregates them (`reduce_table`) and the rows
have the decoded shape (`DECODED_DDL`) — Spark then handles one row per state key and input partition, not per record.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from compactd.errors import SourceReadError
from compactd.kafka.admin import Offsets, admin_client, list_end_offsets
from compactd.kafka.config import KafkaConnection, KafkaValue
from compactd.kafka.watermarks import LEADER_MOVING

if TYPE_CHECKING:
    from compactd.streaming.decode import Decoder

KAFKA_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, timestampType int"
)
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)


# Reader tuning: a broker may answer a fetch with a large part of a partition's backlog, so the receive
# limit is raised; reads are bounded ranges, not long polls (short broker waits, deep prefetch queue, no refetch
# backoff); offsets written inside transactions only count once committed. Users' `kafka.*` options override
# each of these.
READER_DEFAULTS: dict[str, KafkaValue] = {
    "receive.message.max.bytes": 1_000_000_000,
    "fetch.wait.max.ms": 10,
    "queued.min.messages": 1_000_000,
    # librdkafka backs off 1 s (default) before refetching once its queue is "full enough": a stall per range read
    "fetch.queue.backoff.ms": 10,
    "isolation.level": "read_committed",
}


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


def split_limit(start: Offsets, available: Offsets, max_rows: int) -> Offsets:
    """Cap a micro-batch at max_rows, shared fairly across partitions (no partition starves)."""
    pending = {
        (t, p): hi - start.get(t, {}).get(p, 0)
        for t, parts in available.items()
        for p, hi in parts.items()
        if hi > start.get(t, {}).get(p, 0)
    }
    take = {k: 0 for k in pending}
    budget = max_rows
    while budget > 0 and pending:
        share = max(budget // len(pending), 1)
        for k in sorted(pending):
            n = min(share, pending[k] - take[k], budget)
            take[k] += n
            budget -= n
            if take[k] == pending[k]:
                del pending[k]
            if budget == 0:
                break
    out: Offsets = {t: dict(parts) for t, parts in start.items()}
    for (t, p), n in take.items():
        out.setdefault(t, {})[p] = start.get(t, {}).get(p, 0) + n
    return out


# What a cluster that is down, or between leaders, answers; anything else (authorization, a bad config) fails the query
UNREACHABLE = (
    frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "REQUEST_TIMED_OUT", "_RESOLVE"}) | LEADER_MOVING
)


def cluster_unreachable(exc: BaseException) -> bool:
    """Whether a failed offsets request only says the cluster cannot answer right now (a broker restarting)."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from confluent_kafka import KafkaException

    if isinstance(exc, FutureTimeout | TimeoutError):
        return True
    return isinstance(exc, KafkaException) and exc.args[0].name() in UNREACHABLE


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options
        self.topics = [t.strip() for t in options["subscribe"].split(",") if t.strip()]
        self.conn = KafkaConnection.from_spark_options(options)
        self.conf = self.conn.client("consumer", READER_DEFAULTS)
        self.max_rows = int(options.get("maxOffsetsPerTrigger", "0"))
        self.starting = options.get("startingOffsets", "earliest")
        self._admin: Any = None
        self._target: Offsets | None = None
        self._decoder: Decoder | None = None

    @property
    def decoder(self) -> Decoder | None:
        """Built where records are read: Spark's planning processes (offsets, partitions) never import the decoder
        and what it imports (pydantic, pandas through pyarrow), each of them a second on a cold start."""
        if self._decoder is None and self.options.get("decoder"):
            from compactd.streaming.decode import Decoder

            self._decoder = Decoder.from_option(self.options["decoder"])
        return self._decoder

    def _watermarks(self, which: str) -> Offsets:
        if self._admin is None:
            self._admin = admin_client(self.conn)
        return list_end_offsets(self._admin, self.topics, which, str(self.conf["isolation.level"]))

    def initialOffset(self) -> dict:
        return self._watermarks("low" if self.starting == "earliest" else "high")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows > 0 else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._watermarks("high")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self._target is not None and isinstance(limit, ReadAllAvailable):
            # Spark passes ReadAllAvailable to Python sources under Trigger.AvailableNow; Spark's own Kafka
            # source still splits by maxOffsetsPerTrigger there, and so do we (bounded batches on catch-up).
            limit = self.getDefaultReadLimit()
        try:
            high = self._target if self._target is not None else self._watermarks("high")
            low = (
                self._watermarks("low") if any(p not in start.get(t, {}) for t, ps in high.items() for p in ps) else {}
            )
        except Exception as exc:
            if self._target is None and start and cluster_unreachable(exc):
                # the broker is down or its leaders are moving: nothing new this trigger, and the query lives on
                # (a failed query would take the job down with it); the next trigger asks again
                return start
            raise
        # new partitions (or topics) start from their earliest offset
        base: Offsets = {t: dict(ps) for t, ps in start.items()}
        for t, ps in high.items():
            for p in ps:
                base.setdefault(t, {}).setdefault(p, low.get(t, {}).get(p, 0))
        if isinstance(limit, ReadMaxRows):
            return split_limit(base, high, limit.max_rows)
        end = {t: dict(ps) for t, ps in base.items()}
        for t, ps in high.items():
            for p, hi in ps.items():
                end[t][p] = max(end[t][p], hi)
        return end

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        out: list[InputPartition] = []
        for topic, parts in end.items():
            for p, hi in parts.items():
                lo = start.get(topic, {}).get(p, 0)
                if hi > lo:
                    out.append(KafkaRange(topic, int(p), lo, hi))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        timeout_ms = int(self.options.get("readTimeoutMs", "60000"))
        decoder = self.decoder
        if decoder is None:
            yield from read_range(self.conf, partition, timeout_ms)
            return
        from compactd.streaming.decode import reduce_table

        reduced = []
        for msgs in read_messages(self.conf, partition, timeout_ms):
            decoded = decoder.table(
                partition.topic,
                partition.partition,
                [m.offset() for m in msgs],
                [m.key() for m in msgs],
                [m.value() for m in msgs],
            )
            reduced.append(reduce_table(decoded))
        if reduced:
            yield from (reduce_table(pa.concat_tables(reduced)) if len(reduced) > 1 else reduced[0]).to_batches()

    def commit(self, end: dict) -> None:
        pass  # progress lives in Spark's checkpoint, not in a consumer group

    def stop(self) -> None:
        self._admin = None


def read_messages(
    conf: dict[str, Any], rng: KafkaRange, timeout_ms: int, chunk: int = 100_000, strict: bool = False
) -> Iterator[list]:
    """Read offsets [start, end) of one partition: lists of up to `chunk` confluent-kafka messages, in log order.

    Offsets may be missing inside the range (compaction, transaction markers), so the loop ends on the
    consumer position, not on a message count. A range that cannot be read in time fails the task:
    Spark retries it, and nothing is silently skipped. Per message only what Kafka itself costs: callers take the
    fields they need with one comprehension each.

    `strict`: offsets of the range deleted before they are read fail the read (a compaction must never skip records
    the source's retention took: what they replaced or deleted would come back); otherwise the read goes on from the
    log start, as a stream does.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # a private group id: progress lives in Spark's checkpoint, nothing is committed
    consumer = Consumer(
        {
            **conf,
            "group.id": f"compactd-read-{uuid.uuid4()}",
            "auto.offset.reset": "error" if strict else "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    pending: list = []
    deadline = time.monotonic() + timeout_ms / 1000
    position = rng.start
    try:
        while position < rng.end:
            if time.monotonic() > deadline:
                raise SourceReadError(
                    f"{rng.topic}/{rng.partition}: read stalled at {position} of [{rng.start},{rng.end})"
                )
            # consume() waits for num_messages or the timeout: never ask for more than the range still holds (an
            # end-of-partition event also counts), or every task pays the whole timeout on its last call
            msgs = consumer.consume(num_messages=max(1, min(10_000, rng.end - position)), timeout=0.5)
            good = [m for m in msgs if m.error() is None]
            if len(good) != len(msgs):
                for m in msgs:
                    err = m.error()
                    if err is None:
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise SourceReadError(
                            f"{rng.topic}/{rng.partition}: offsets from {position} were deleted before they were read "
                            "(the topic's retention, or a deleteRecords)"
                        )
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise SourceReadError(f"{rng.topic}/{rng.partition}: {err.str()}")
                    position = max(position, m.offset())
            if good:
                if good[-1].offset() >= rng.end:
                    good = [m for m in good if m.offset() < rng.end]
                    position = rng.end
                else:
                    position = good[-1].offset() + 1
                pending.extend(good)
                if len(pending) >= chunk:
                    yield pending
                    pending = []
            if not msgs:
                pos = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
                if pos >= 0:
                    position = max(position, pos)
        if pending:
            yield pending
    finally:
        consumer.close()


def read_range(
    conf: dict[str, Any], rng: KafkaRange, timeout_ms: int, batch_rows: int = 100_000
) -> Iterator[pa.RecordBatch]:
    """Read offsets [start, end) of one partition as Arrow batches of Spark's Kafka-source shape."""
    for msgs in read_messages(conf, rng, timeout_ms, batch_rows):
        stamps = [m.timestamp() for m in msgs]
        cols = {
            "key": [m.key() for m in msgs],
            "value": [m.value() for m in msgs],
            "topic": [rng.topic] * len(msgs),
            "partition": [rng.partition] * len(msgs),
            "offset": [m.offset() for m in msgs],
            "timestamp": [ts * 1000 if ts and ts > 0 else None for _, ts in stamps],
            "timestampType": [t for t, _ in stamps],
        }
        yield pa.RecordBatch.from_pydict(cols, schema=ARROW_SCHEMA)


class KafkaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "compactd-kafka"

    def schema(self) -> str:
        if self.options.get("decoder"):
            from compactd.streaming.decode import DECODED_DDL

            return DECODED_DDL
        return KAFKA_SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # Spark's options are case-insensitive (keys arrive lowercased): keep the mapping as it is.
        return KafkaStreamReader(self.options)
