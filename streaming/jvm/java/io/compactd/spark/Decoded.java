package io.compactd.spark;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;

/** The row both fast-path decoders return, field for field streaming/udfs.py DECODED_DDL (its Spark type). */
final class Decoded {
  /** Offsets and timestamps travel through Lua and zset scores (doubles): above 2^53 they are refused. */
  static final long MAX_INT = 1L << 53;

  static final Row REFUSED = row(false, null, null, null, null, null, null, null, null, null, null, null, null);

  private Decoded() {}

  static Row row(boolean fast, String kind, String topic, Integer partition, String group, Long base, Long end,
      Long firstTs, Long size, Long valueOffset, Long ts, Long tidHi, Long tidLo) {
    return RowFactory.create(fast, kind, topic, partition, group, base, end, firstTs, size, valueOffset, ts, tidHi,
        tidLo);
  }

  static Row skipped(String kind) {
    return row(true, kind, null, null, null, null, null, null, null, null, null, null, null);
  }

  static Row offsetDelete(String group, String topic, int partition) {
    return row(true, "offset_delete", topic, partition, group, null, null, null, null, null, null, null, null);
  }

  static Row offsetCommit(String group, String topic, int partition, long offset, long ts, Long hi, Long lo) {
    return row(true, "offset_commit", topic, partition, group, null, null, null, null, offset, ts, hi, lo);
  }
}
