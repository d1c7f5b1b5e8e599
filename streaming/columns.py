"""The fast path, in the JVM: Spark's Kafka rows decoded and reduced in the tasks that read them, so no record crosses
into Python unless the fast path refuses it.

One Java class does it (`jvm/java/io/compactd/spark/FastReduce.java`) over Spark's internal rows: compactd's two
decoders (`OffsetsDecode`: `__consumer_offsets` offset keys v0/v1, values v0-v4 with v4's compact metadata and topic ID,
deletions, skipped key versions; `JsonDecode`: JSON events in one pass over the bytes, strict JSON, and the models'
constraints), then the reduction of `decode.key_and_order` in a hash map per task: one row per key, the last by source
position, `n` counting the records. Each decoder accepts only what the reference accepts and decodes it as the
reference does; everything it refuses (and config events, and records of other topics) reaches the driver with its
bytes, where the reference (`decode.Decoder.complete`) decides it and names the DLQ reason. Compacted and log-start
events, whose order is their value, are reduced on the driver with the refused rows: they are few (one per clean or
retention pass, not one per commit). The driver reduces the tasks' rows again (`decode.reduce_table`): a key's rows from
two source partitions meet there.

Why not Spark's expressions (the path before, measured on the binary benchmark): the decoders were Java UDFs returning
a `Row`, which Spark converted on every record (2.7 times the decoders' own time, JFR), and the group-by after them
hashed strings into nine `max_by` buffers per key. `tests/integration/test_columns.py` compares this path with the
reference, record for record and key for key."""

from __future__ import annotations

from pyspark.sql import DataFrame

from compactd.codec.events import OFFSET_TYPES, SEGMENT_TYPES
from compactd.streaming.decode import Decoder

# the event types in the order of the JSON decoder's type mask (JsonDecode.TYPES)
KINDS = ("offset_commit", "offset_delete", "group_delete", "segment_rolled", "compacted", "log_start")
# the fast path's columns, in FastReduce.SCHEMA's order
FAST_COLUMNS = ("stream", "kind", "topic", "partition", "grp", "base_offset", "end_offset", "first_batch_max_ts",
                "size_bytes", "value_offset", "ts", "src_topic", "src_partition", "src_offset", "raw_key",
                "raw_value", "topic_id", "n", "slow")  # fmt: skip


def _mask(types: frozenset[str]) -> int:
    """A topic's event types as a mask over KINDS; a type the fast path does not decode (replica_log: one per change
    of a replica's log) is refused to the reference, as an unknown one is."""
    return sum(1 << KINDS.index(t) for t in types if t in KINDS)


def _cuts(decoder: Decoder) -> str:
    """`Decoder.superseded` as FastReduce reads it: topic TAB source topic TAB source partition TAB offset, a line
    each."""
    return "".join(
        f"{topic}\t{src}\t{part}\t{below}\n"
        for topic, by_source in decoder.superseded.items()
        for src, parts in by_source.items()
        for part, below in parts.items()
    )


class FastPath:
    """The fast path for one decoder: its Java task object, built once per decoder (each Py4J call costs the driver a
    round trip; the task applies to any batch's rows)."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self._java: dict[bool, object] = {}

    def _task(self, df: DataFrame, reduce: bool) -> object:
        if reduce not in self._java:
            d = self.decoder
            jvm = df.sparkSession._jvm  # type: ignore[attr-defined]
            self._java[reduce] = jvm.io.compactd.spark.FastReduce(
                d.offsets_topic, d.segments_topic, d.commits_topic, d.config_topic, _mask(SEGMENT_TYPES),
                _mask(OFFSET_TYPES), d.max_event_bytes, _cuts(d), reduce,
            )  # fmt: skip
        return self._java[reduce]

    def reduced(self, df: DataFrame) -> DataFrame:
        """Spark's Kafka rows (`decode.KAFKA_COLUMNS`) → one row per reduction key (`decode.key_and_order`) and task,
        the last by source position, with `n` the records it stands for; one row per record for the forward kinds and
        for the records the decoders refuse (`slow`, `raw_key`/`raw_value` kept for the reference). Columns:
        `FAST_COLUMNS` (`decode.DECODED_DDL`'s names, plus `slow`)."""
        return self._apply(df, True)

    def decoded(self, df: DataFrame) -> DataFrame:
        """The same rows, one per record (`n` = 1): what the equivalence tests compare with the reference, record for
        record."""
        return self._apply(df, False)

    def _apply(self, df: DataFrame, reduce: bool) -> DataFrame:
        return DataFrame(self._task(df, reduce).apply(df._jdf), df.sparkSession)  # type: ignore[attr-defined]
