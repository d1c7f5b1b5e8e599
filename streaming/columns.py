"""The fast path, in the JVM: Spark's Kafka rows decoded and reduced in the tasks that read them, so no record crosses
into Python unless the fast path refuses it.

Decoding is compactd's two Java UDFs (`udfs`, `jvm/java/io/compactd/spark/`): `__consumer_offsets` records
(`OffsetsDecode`: offset keys v0/v1, values v0-v4 with v4's compact metadata and topic ID, deletions, skipped key
versions) and JSON events (`JsonDecode`: one pass over the bytes, strict JSON, and the models' constraints). Each
accepts only what the reference accepts and decodes it as the reference does; everything it refuses (and config
events, and any record whose position does not fit the reduction's order) reaches the driver with its bytes, where
the reference (`decode.Decoder.complete`) decides it and names the DLQ reason.

The reduction (`FastPath.reduced`) is the rule of `decode.key_and_order` as a group-by in the tasks (a partial aggregate
per task, then a small shuffle): one row per key, the last by source position (`max_by` over a position packed into a
long), `n` counting the records. Compacted and log-start events, whose order is their value, are reduced on the driver
with the refused rows: they are few (one per clean or retention pass, not one per commit).
`tests/integration/test_columns.py` compares both with the reference, record for record and key for key."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from compactd.codec.events import OFFSET_TYPES, SEGMENT_TYPES
from compactd.streaming.decode import Decoder

# a source position packed into the reduction's order: partition << 44 | offset (rows outside go to the driver)
_POS_BITS = 44
_MAX_SRC_PARTITION = 2**19
# kinds as small ints inside the aggregation (its buffer holds fixed-width values only: a string would turn the hash
# aggregate into a sort), and the JSON decoder's mask of a topic's types (JsonDecode.TYPES: the same order)
KINDS = ("offset_commit", "offset_delete", "group_delete", "segment_rolled", "compacted", "log_start")
DECODED_FAST = ("kind", "topic", "partition", "grp", "base_offset", "end_offset", "first_batch_max_ts", "size_bytes",
                "value_offset", "ts", "tid_hi", "tid_lo")  # fmt: skip


def _kind_code(kind: Column) -> Column:
    out = F.lit(None).cast("int")
    for i, k in reversed(list(enumerate(KINDS))):
        out = F.when(kind == k, F.lit(i)).otherwise(out)
    return out


def _pick(names: tuple[str, ...] | list[str], index: Column) -> Column:
    """`names[index]`, null for a null index. As a CASE: Spark 4.2's `element_at` over a literal array gave the last
    element for an index that was null (seen here: kinds decoded as `log_start`)."""
    out = F.lit(None).cast("string")
    for i, name in reversed(list(enumerate(names))):
        out = F.when(index == i, F.lit(name)).otherwise(out)
    return out


def topic_id(hi: Column, lo: Column) -> Column:
    """A topic ID's two 64-bit halves → its UUID string, as `str(uuid.UUID(...))` spells it (8-4-4-4-12)."""
    digits = F.concat(*(F.lpad(F.lower(F.hex(h)), 16, "0") for h in (hi, lo)))
    spans = ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))
    return F.when(hi.isNotNull(), F.concat_ws("-", *(F.substr(digits, F.lit(a), F.lit(n)) for a, n in spans)))


class FastPath:
    """The fast path's expressions for one decoder, built once: every PySpark Column call is a Py4J round trip, and
    building these for each micro-batch cost it 0.1-0.3 s on the driver (measured), where applying them to the
    batch's rows costs a few calls. Unresolved columns name their inputs, so they apply to any batch's rows."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        src, value = F.col("src_topic"), F.col("value")

        def json(types: frozenset[str]) -> Column:  # the topic's types as a mask over KINDS (JsonDecode.TYPES)
            # a type the fast path does not decode (replica_log: one per change of a replica's log) is refused to the
            # reference, as an unknown one is
            mask = sum(1 << KINDS.index(t) for t in types if t in KINDS)
            return F.call_udf("compactd_json", value, F.lit(mask), F.lit(decoder.max_event_bytes))

        udf = (
            F.when(src == decoder.offsets_topic, F.call_udf("compactd_offsets", F.col("key"), value))
            .when(src == decoder.segments_topic, json(SEGMENT_TYPES))
            .when(src == decoder.commits_topic, json(OFFSET_TYPES))
        )
        kept = ("src_topic", "src_partition", "src_offset", "key", "value")
        self._renamed = {"topic": "src_topic", "partition": "src_partition", "offset": "src_offset"}
        self._udf = [*kept, _stream(src, decoder).alias("stream"), udf.alias("_d")]
        self._fields = [*kept, "stream", F.coalesce(F.col("_d.fast"), F.lit(False)).alias("fast"),
                        *(F.col(f"_d.{c}").alias(c) for c in DECODED_FAST)]  # fmt: skip
        cuts = _superseded(decoder)
        self._kept = None if cuts is None else ~F.coalesce(cuts, F.lit(False))
        self._unreduced = _unreduced()
        self._keyed, self._keys, self._agg, self._out = _reduction(decoder)

    def decoded(self, df: DataFrame) -> DataFrame:
        """Spark's Kafka rows (`decode.KAFKA_COLUMNS`) → one row per record: `src_topic`, `src_partition`,
        `src_offset`, `key`, `value`, `stream`, `fast` (the fast path accepts it) and the decoded columns
        (`DECODED_FAST`: a topic ID as its two 64-bit halves, `topic_id` makes the string)."""
        out = df.withColumnsRenamed(self._renamed).select(*self._udf).select(*self._fields)
        return out if self._kept is None else out.filter(self._kept)

    def unreduced(self, rows: DataFrame) -> DataFrame:
        """`decoded` rows → the columns `reduced` returns, one row per record: a small batch's, reduced on the driver
        instead (the group-by's shuffle costs a small batch more than the reduction saves)."""
        return rows.select(*self._unreduced)

    def reduced(self, rows: DataFrame) -> DataFrame:
        """`decoded` rows → one row per reduction key (`decode.key_and_order`), the last by source position, with `n`
        the records it stands for. Rows the expressions refused (`slow`: `raw_key`/`raw_value` kept for the
        reference), and the forward kinds, stay one row per record. The aggregate's buffer holds fixed-width values
        only (kinds and source topics as indexes into `KINDS` and the source topics): a string there would turn
        Spark's hash aggregate into a sort. Returns `stream`, `src_topic`, ... as `decode.DECODED_DDL` names them,
        plus `slow`."""
        return rows.select(*self._keyed).groupBy(*self._keys).agg(*self._agg).select(*self._out)


def _stream(src_topic: Column, decoder: Decoder) -> Column:
    """The stream a source topic carries, as the reference names it."""
    stream = F.lit("unknown")
    for topic, name in ((decoder.config_topic, "config"), (decoder.offsets_topic, "consumer_offsets"),
                        (decoder.segments_topic, "segments"), (decoder.commits_topic, "commits")):  # fmt: skip
        stream = F.when(src_topic == topic, F.lit(name)).otherwise(stream)
    return stream


def _superseded(decoder: Decoder) -> Column | None:
    """Decoded rows a topic's reset superseded (`Decoder.superseded`), to drop before the reduction (the rows the
    reference decides are dropped there, by the same rule)."""
    old: Column | None = None
    for topic, by_source in decoder.superseded.items():
        for src_topic, parts in by_source.items():
            for part, below in parts.items():
                c = (F.col("fast") & (F.col("topic") == topic) & (F.col("src_topic") == src_topic)
                     & (F.col("src_partition") == int(part)) & (F.col("src_offset") < below))  # fmt: skip
                old = c if old is None else old | c
    return old


def _unreduced() -> list[Column | str]:
    fast = F.col("fast")
    return [
        "stream", "kind", "topic", "partition", "grp", "base_offset", "end_offset", "first_batch_max_ts",
        "size_bytes", "value_offset", "ts", "src_topic", "src_partition", "src_offset",
        F.when(~fast, F.col("key")).alias("raw_key"), F.when(~fast, F.col("value")).alias("raw_value"),
        topic_id(F.col("tid_hi"), F.col("tid_lo")).alias("topic_id"), F.lit(1).cast("long").alias("n"),
        (~fast).alias("slow"),
    ]  # fmt: skip


_LAST = ("_kind", "end_offset", "first_batch_max_ts", "size_bytes", "value_offset", "ts", "_src", "tid_hi", "tid_lo")
_PAYLOAD = ("topic", "partition", "grp", "base_offset", "end_offset", "first_batch_max_ts", "size_bytes",
            "value_offset", "ts", "tid_hi", "tid_lo")  # fmt: skip
_KEYS = ("_k", "topic", "partition", "grp", "base_offset", "_ut", "_up", "_uo", "raw_key", "raw_value")


def _reduction(decoder: Decoder) -> tuple[list[Column], tuple[str, ...], list[Column], list[Column | str]]:
    """`FastPath.reduced`'s expressions: the keyed rows' select, the group-by's keys, its aggregates, the output."""
    kind, fast = F.col("kind"), F.col("fast")
    topics = [decoder.offsets_topic, decoder.segments_topic, decoder.commits_topic]
    packable = (F.col("src_partition") < _MAX_SRC_PARTITION) & F.col("src_offset").between(0, 2**_POS_BITS - 1)
    keyed = fast & packable & ~kind.isin("compacted", "log_start")
    src_index = F.lit(None).cast("int")
    for i, t in enumerate(topics):
        src_index = F.when(F.col("src_topic") == t, F.lit(i)).otherwise(src_index)
    select = [
        # the key kind: `offset` for a (group, partition)'s commits and deletions, else the kind (null: refused)
        F.when(keyed & kind.isin("offset_commit", "offset_delete"), F.lit("offset")).otherwise(kind).alias("_k"),
        F.when(keyed, F.shiftleft(F.col("src_partition").cast("long"), _POS_BITS) + F.col("src_offset")).alias("_pos"),
        F.when(~keyed, F.col("src_topic")).alias("_ut"),
        F.when(~keyed, F.col("src_partition")).alias("_up"),
        F.when(~keyed, F.col("src_offset")).alias("_uo"),
        F.when(~fast, F.col("key")).alias("raw_key"),
        F.when(~fast, F.col("value")).alias("raw_value"),
        _kind_code(kind).alias("_kind"),
        src_index.alias("_src"),
        *(F.col(c) for c in _PAYLOAD),
    ]
    pos = F.coalesce(F.col("_pos"), F.lit(0))
    agg = [*(F.max_by(c, pos).alias(c) for c in _LAST), F.max("_pos").alias("_pos"), F.count(F.lit(1)).alias("n")]
    keyed_out = F.col("_pos").isNotNull()
    src_topic = F.when(keyed_out, _pick(topics, F.col("_src"))).otherwise(F.col("_ut"))
    out = [
        _stream(src_topic, decoder).alias("stream"),
        F.coalesce(_pick(KINDS, F.col("_kind")), F.col("_k")).alias("kind"),
        *(c for c in _PAYLOAD if not c.startswith("tid_")),
        src_topic.alias("src_topic"),
        F.when(keyed_out, F.shiftright(F.col("_pos"), _POS_BITS).cast("int"))
        .otherwise(F.col("_up"))
        .alias("src_partition"),
        F.when(keyed_out, F.col("_pos").bitwiseAND(2**_POS_BITS - 1)).otherwise(F.col("_uo")).alias("src_offset"),
        "raw_key",
        "raw_value",
        topic_id(F.col("tid_hi"), F.col("tid_lo")).alias("topic_id"),
        "n",
        (~keyed_out & F.col("_k").isNull()).alias("slow"),
    ]
    return select, _KEYS, agg, out
