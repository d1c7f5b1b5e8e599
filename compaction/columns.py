"""KIP-280's rules as Spark Column expressions over Spark's Kafka rows: the JVM side of a compaction run's phase 1.

Spark's Kafka reader (`includeHeaders`) gives each record's `partition`, `offset`, `timestamp` (a timestamp; the
rules read its epoch milliseconds), `key`, `value` and `headers` (`array<struct<key string, value binary>>`, null
when the record has none). From those, `order_key` builds the same three-long order key as the pure rule
(`strategy.order_key`), and `winners` reduces each (partition, key) to its winner as `reduce.reduce_partition` does,
under both tombstone rules, with no record crossing into Python. The pure rules stay the reference:
`tests/integration/test_compaction_columns.py` shows both pick the same winner for every key, under every strategy,
on generated histories whose headers are missing, null, malformed or given twice.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from compactd.compaction.strategy import LONG_MAX, LONG_MIN, Strategy

# what Python's str.strip() removes from an ASCII header value (`strategy.header_version`, format `decimal`)
_WS = r"[\t\n\x0b\x0c\r\x1c-\x1f ]*"
_DECIMAL = rf"^{_WS}([+-]?[0-9]+){_WS}$"


def header_version(headers: Column, name: str, fmt: str = "long") -> Column:
    """The version a record's header `name` carries (bigint), null when it has none that parses: the last header of
    that name counts, as a Kafka header lookup returns it. `long`: exactly 8 bytes, big-endian signed; `decimal`: an
    ASCII integer in a long's range, surrounding whitespace allowed."""
    same = F.filter(headers, lambda h: h["key"] == F.lit(name))  # null when the record has no headers
    raw = F.when(F.size(same) > 0, F.element_at(same, -1)["value"])
    if fmt == "long":
        # conv with a negative target base reads the 16 hex digits as a signed 64-bit number
        return F.when(F.length(raw) == 8, F.conv(F.hex(raw), 16, -10).cast("bigint"))
    text = F.decode(raw, "ISO-8859-1")  # one char per byte: a byte outside ASCII never matches the pattern
    digits = F.regexp_extract(text, _DECIMAL, 1)
    number = F.when(text.rlike(_DECIMAL), digits.try_cast("decimal(38,0)"))
    return F.when(number.between(LONG_MIN, LONG_MAX), number.cast("bigint"))


def order_key(strategy: Strategy, offset: Column, timestamp_ms: Column, headers: Column) -> Column:
    """`strategy.order_key` as a struct of three longs (k1, k2, k3): the record of a key with the largest wins."""
    zero = F.lit(0).cast("bigint")
    if strategy.kind == "timestamp":
        return F.struct(timestamp_ms.alias("k1"), offset.alias("k2"), zero.alias("k3"))
    if strategy.kind == "header" and strategy.header:
        version = header_version(headers, strategy.header, strategy.header_format)
        return F.struct(
            F.when(version.isNull(), zero).otherwise(F.lit(1).cast("bigint")).alias("k1"),
            F.coalesce(version, zero).alias("k2"),
            offset.alias("k3"),
        )
    return F.struct(offset.alias("k1"), zero.alias("k2"), zero.alias("k3"))


def winners(rows: DataFrame, strategy: Strategy) -> DataFrame:
    """One row per (partition, key) of the rows with a key: its winner under `strategy` (the rows' own columns),
    plus `n`, the records of the key it stands for. The rows are the previous generation and the delta, in any order
    (the rules need none: `tombstone: latest` reads the log's order from the offsets).

    `tombstone: version` is a max over the order key. `tombstone: latest` (`strategy.replaces` in log order): a key's
    records before its last tombstone are out; of the rest, any record after that tombstone beats it, and those
    compete by order key."""
    ts_ms = F.unix_millis(F.col("timestamp")) if dict(rows.dtypes)["timestamp"] == "timestamp" else F.col("timestamp")
    keyed = rows.where(F.col("key").isNotNull()).withColumn(
        "_rank", order_key(strategy, F.col("offset"), ts_ms, F.col("headers"))
    )
    key = ["partition", "key"]
    rank = F.col("_rank")
    n = F.count(F.lit(1))
    if strategy.tombstone == "latest":
        by_key = Window.partitionBy(*key)
        keyed = (
            keyed.withColumn("_t", F.max(F.when(F.col("value").isNull(), F.col("offset"))).over(by_key))
            .withColumn("_n", F.count(F.lit(1)).over(by_key))  # the records before the tombstone still count
            .where(F.col("_t").isNull() | (F.col("offset") >= F.col("_t")))
        )
        after = (F.col("_t").isNull() | (F.col("offset") > F.col("_t"))).cast("int")
        rank = F.struct(after.alias("after"), F.col("_rank").alias("rank"))
        n = F.max("_n")
    fields = [c for c in rows.columns if c not in key]
    out = keyed.groupBy(*key).agg(F.max_by(F.struct(*fields), rank).alias("_w"), n.alias("n"))
    return out.select(*key, *(F.col(f"_w.{c}").alias(c) for c in fields), "n")
