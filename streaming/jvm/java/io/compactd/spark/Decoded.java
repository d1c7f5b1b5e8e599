package io.compactd.spark;

/**
 * One record as a fast-path decoder accepted it: the fields of streaming/decode.py's DECODED_SCHEMA that the decoders
 * fill. A refused record is no object at all ({@code null}): the reference decides it on the driver. Plain fields, not
 * a Spark {@code Row}: {@link FastReduce} writes Spark's internal rows itself, for the few rows the reduction keeps
 * (a Java UDF's Row cost its conversion, 2.7 times the decoder's own time, on every record).
 */
final class Decoded {
  /** Offsets and timestamps travel through Lua and zset scores (doubles): above 2^53 they are refused. */
  static final long MAX_INT = 1L << 53;
  /** Which of the long fields are set (the others are null in the row). */
  static final int BASE = 1, END = 2, FIRST_TS = 4, SIZE = 8, VALUE = 16, TS = 32, TID = 64;

  /** The index of the kind in {@link JsonDecode#TYPES}, or -1 (a skipped key version: {@link #kindName} says it). */
  final int kind;
  final String kindName;
  final String topic;
  /** -1: none. */
  final int partition;
  final String group;
  final long base, end, firstTs, size, valueOffset, ts, tidHi, tidLo;
  final int set;

  private Decoded(int kind, String kindName, String topic, int partition, String group, long base, long end,
      long firstTs, long size, long valueOffset, long ts, long tidHi, long tidLo, int set) {
    this.kind = kind;
    this.kindName = kindName;
    this.topic = topic;
    this.partition = partition;
    this.group = group;
    this.base = base;
    this.end = end;
    this.firstTs = firstTs;
    this.size = size;
    this.valueOffset = valueOffset;
    this.ts = ts;
    this.tidHi = tidHi;
    this.tidLo = tidLo;
    this.set = set;
  }

  static Decoded skipped(String kindName) {
    return new Decoded(-1, kindName, null, -1, null, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  }

  static Decoded of(int kind, String topic, int partition, String group, long valueOffset, long ts, int set) {
    return new Decoded(kind, JsonDecode.TYPES[kind], topic, partition, group, 0, 0, 0, 0, valueOffset, ts, 0, 0, set);
  }

  static Decoded segment(String topic, int partition, long base, long end, long firstTs, long size, long epoch,
      boolean epochSeen, long ts) {
    int set = BASE | END | FIRST_TS | SIZE | TS | (epochSeen ? VALUE : 0);
    return new Decoded(3, JsonDecode.TYPES[3], topic, partition, null, base, end, firstTs, size, epoch, ts, 0, 0, set);
  }

  static Decoded offsetDelete(String group, String topic, int partition) {
    return of(1, topic, partition, group, 0, 0, 0);
  }

  static Decoded offsetCommit(String group, String topic, int partition, long offset, long ts, boolean tid, long hi,
      long lo) {
    int set = VALUE | TS | (tid ? TID : 0);
    return new Decoded(0, JsonDecode.TYPES[0], topic, partition, group, 0, 0, 0, 0, offset, ts, hi, lo, set);
  }

  /** Log order does not decide these: the largest value wins, on the driver (decode.key_and_order). */
  boolean forward() {
    return kind == 4 || kind == 5;
  }
}
