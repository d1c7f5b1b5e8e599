package io.compactd.spark;

import java.nio.charset.StandardCharsets;

/**
 * The fast path for {@code __consumer_offsets} records (key, value) → the row of {@link Decoded}. It accepts exactly what
 * the numpy path it replaces accepted: an offset key (v0/v1) with ASCII group and topic and a partition in range;
 * a value of version 0 to 4 with ASCII metadata, exact lengths and the offset in [0, 2^53]; a v4 value with metadata
 * of at most 126 bytes and either no tagged field or exactly the topic ID (tag 0, 16 bytes). An offset key with no
 * value is its deletion; a key of version 3 or more is skipped (counted), as the reference does. Anything else —
 * group metadata (v2), other tags, truncated or trailing bytes, non-ASCII names — is refused ({@code fast} false):
 * the Python reference (codec/offsets.py) decides it and names the DLQ reason. All big-endian.
 */
final class OffsetsDecode {
  private OffsetsDecode() {}

  /** The record's decoded fields, or null: refused, the reference decides it. */
  static Decoded decode(byte[] key, byte[] value) {
    if (key == null || key.length < 2) return null;
    int kver = i16(key, 0);
    if (kver >= 3) return Decoded.skipped("skipped_key_v" + kver);
    if ((kver != 0 && kver != 1) || key.length < 10) return null;
    int kl = key.length;
    int glen = i16(key, 2);
    if (glen < 0 || kl < 10 + glen) return null;
    int tlen = i16(key, 4 + glen);
    if (tlen < 0 || kl != 10 + glen + tlen) return null;
    int partition = i32(key, 6 + glen + tlen);
    if (partition < 0 || !ascii(key, 4, glen) || !ascii(key, 6 + glen, tlen)) return null;
    String group = new String(key, 4, glen, StandardCharsets.US_ASCII);
    String topic = new String(key, 6 + glen, tlen, StandardCharsets.US_ASCII);
    if (value == null) return Decoded.offsetDelete(group, topic, partition);
    int vl = value.length;
    if (vl < 20) return null;
    int vver = i16(value, 0);
    if (vver < 0 || vver > 4) return null;
    long offset = i64(value, 2);
    int mpos = vver >= 3 ? 14 : 10;
    int mlen;
    int mstart;
    boolean tid = false;
    long hi = 0;
    long lo = 0;
    if (vver == 4) {
      int mvar = value[mpos] & 0xff; // one byte: no continuation bit, not null (0)
      if (mvar < 1 || mvar > 127) return null;
      mlen = mvar - 1;
      mstart = mpos + 1;
      int tags = mstart + mlen + 8;
      if (vl < tags + 1) return null;
      if (value[tags] == 0) {
        if (vl != tags + 1) return null;
      } else if (value[tags] == 1 && vl == tags + 1 + 18 && value[tags + 1] == 0 && value[tags + 2] == 16) {
        tid = true;
        hi = i64(value, tags + 3);
        lo = i64(value, tags + 11);
      } else {
        return null;
      }
    } else {
      mlen = i16(value, mpos);
      mstart = mpos + 2;
      int fixed = vver == 1 ? 28 : vver == 3 ? 24 : 20;
      if (mlen < 0 || vl != fixed + mlen) return null;
    }
    long ts = i64(value, mstart + mlen);
    if (offset < 0 || offset > Decoded.MAX_INT || !ascii(value, mstart, mlen)) return null;
    return Decoded.offsetCommit(group, topic, partition, offset, ts, tid, hi, lo);
  }

  static int i16(byte[] b, int at) {
    return (short) (((b[at] & 0xff) << 8) | (b[at + 1] & 0xff));
  }

  static int i32(byte[] b, int at) {
    return ((b[at] & 0xff) << 24) | ((b[at + 1] & 0xff) << 16) | ((b[at + 2] & 0xff) << 8) | (b[at + 3] & 0xff);
  }

  static long i64(byte[] b, int at) {
    return ((long) i32(b, at) << 32) | (i32(b, at + 4) & 0xffffffffL);
  }

  static boolean ascii(byte[] b, int from, int length) {
    for (int i = from; i < from + length; i++) {
      if (b[i] < 0) return false;
    }
    return true;
  }
}
