package io.compactd.spark;

import java.nio.charset.StandardCharsets;

/**
 * The fast path for JSON input events (value, the topic's types as a bit mask over {@link #TYPES}, the size limit) →
 * a {@link Decoded}, or null. One pass over the bytes, strict JSON (RFC 8259: no comments, single quotes, leading
 * zeros, NaN or trailing commas; whitespace is space, tab, CR, LF). It accepts only what the pydantic models of
 * codec/events.py accept and reads it as they do: an object whose contract fields each come once with their JSON type
 * (integers without fraction or exponent, strings of printable ASCII), other fields any JSON value up to 32 levels
 * deep and numbers up to 1,000 characters (ignored), the models' constraints (ranges, the topic name's pattern, the
 * group's length, which types belong on this topic, end after base; an absent size_bytes is 0). Everything else is
 * refused (null): the reference decides it and names the DLQ reason. Bytes outside ASCII anywhere in
 * the value are refused before parsing (which of them are valid UTF-8 is the reference's call), and so is any escape
 * (the reference rejects a lone surrogate's, which a parser that skips unknown fields can miss).
 *
 * <p>Why not Jackson (which Spark ships, and which this class used first): a parser per record cost more than the
 * rest of the decode; this scanner allocates nothing but the row and its two names (docs/benchmarks.md).
 */
final class JsonDecode {
  /** The event types, in the order of the mask's bits (streaming/columns.py KINDS). */
  static final String[] TYPES = {
    "offset_commit", "offset_delete", "group_delete", "segment_rolled", "compacted", "log_start"
  };
  private static final byte[][] TYPE_BYTES = ascii(TYPES);
  private static final byte[][] FIELDS = ascii(new String[] {
    "type", "group", "topic", "partition", "offset", "base_offset", "end_offset", "first_batch_max_ts",
    "size_bytes", "cleaned_up_to", "log_start_offset", "ts", "last_epoch"
  });
  private static final int TYPE = 0, GROUP = 1, TOPIC = 2, PARTITION = 3, OFFSET = 4, BASE = 5, END = 6,
      FIRST_TS = 7, SIZE = 8, CLEANED = 9, LOG_START = 10, TS = 11, LAST_EPOCH = 12, STRINGS = 3;
  private static final int MAX_DEPTH = 32;
  private static final int MAX_NUMBER_CHARS = 1000;
  /** Digits past which an integer cannot pass the contract's ranges (2^53 has 16): refused before it overflows. */
  private static final int MAX_INT_DIGITS = 18;

  private JsonDecode() {}

  /** The event's decoded fields, or null: refused, the reference decides it. */
  static Decoded decode(byte[] b, int types, int maxBytes) {
    if (b == null || b.length > maxBytes) return null;
    for (byte c : b) {
      if (c < 0 || c == '\\') return null;
    }
    int n = b.length;
    int[] at = new int[STRINGS * 2]; // start, end of each string field's text
    long[] num = new long[FIELDS.length];
    int seen = 0;
    int i = ws(b, 0);
    if (i >= n || b[i] != '{') return null;
    i = ws(b, i + 1);
    if (i < n && b[i] == '}') {
      i++;
    } else {
      while (true) {
        if (i >= n || b[i] != '"') return null;
        int end = string(b, i);
        if (end < 0) return null;
        int field = field(b, i + 1, end - 1);
        i = ws(b, end);
        if (i >= n || b[i] != ':') return null;
        i = ws(b, i + 1);
        if (field < 0) { // a field of no event: ignored, as the reference ignores it
          i = value(b, i, 1);
        } else {
          if ((seen & (1 << field)) != 0) return null; // twice: which one counts is the reference's call
          seen |= 1 << field;
          if (field < STRINGS) {
            if (i >= n || b[i] != '"') return null;
            end = string(b, i);
            if (end < 0) return null;
            for (int j = i + 1; j < end - 1; j++) {
              if (b[j] > 0x7e) return null; // printable ASCII (string() refused the controls)
            }
            at[2 * field] = i + 1;
            at[2 * field + 1] = end - 1;
            i = end;
          } else {
            end = integer(b, i);
            if (end < 0) return null;
            num[field] = parse(b, i, end);
            i = end;
          }
        }
        if (i < 0) return null;
        i = ws(b, i);
        if (i >= n) return null;
        if (b[i] == '}') {
          i++;
          break;
        }
        if (b[i] != ',') return null;
        i = ws(b, i + 1);
      }
    }
    if (ws(b, i) != n) return null; // anything after the object
    if ((seen & (1 << TYPE)) == 0) return null;
    int type = type(b, at[0], at[1]);
    if (type < 0 || (types & (1 << type)) == 0 || !count(seen, num, TS)) return null;
    boolean groupOk = (seen & (1 << GROUP)) != 0 && at[3] > at[2] && at[3] - at[2] <= 1024;
    boolean topicOk = (seen & (1 << TOPIC)) != 0 && topicName(b, at[4], at[5]) && (seen & (1 << PARTITION)) != 0
        && num[PARTITION] >= 0 && num[PARTITION] <= Integer.MAX_VALUE;
    String group = groupOk ? text(b, at[2], at[3]) : null;
    String topic = topicOk ? text(b, at[4], at[5]) : null;
    int partition = topicOk ? (int) num[PARTITION] : -1;
    long ts = num[TS];
    int ets = Decoded.TS;
    switch (type) {
      case 0: // offset_commit
        if (!groupOk || !topicOk || !count(seen, num, OFFSET)) return null;
        return Decoded.of(type, topic, partition, group, num[OFFSET], ts, ets | Decoded.VALUE);
      case 1: // offset_delete
        if (!groupOk || !topicOk) return null;
        return Decoded.of(type, topic, partition, group, 0, ts, ets);
      case 2: // group_delete
        if (!groupOk) return null;
        return Decoded.of(type, null, -1, group, 0, ts, ets);
      case 3: // segment_rolled
        long size = (seen & (1 << SIZE)) != 0 ? num[SIZE] : 0;
        boolean epochSeen = (seen & (1 << LAST_EPOCH)) != 0; // the segment's last leader epoch: an int32, optional
        if (!topicOk || !count(seen, num, BASE) || !count(seen, num, END) || !count(seen, num, FIRST_TS)
            || size < 0 || size > Decoded.MAX_INT || num[END] <= num[BASE]
            || (epochSeen && (num[LAST_EPOCH] < 0 || num[LAST_EPOCH] > Integer.MAX_VALUE))) {
          return null;
        }
        // the epoch travels in value_offset, which no segment otherwise carries
        return Decoded.segment(topic, partition, num[BASE], num[END], num[FIRST_TS], size, num[LAST_EPOCH],
            epochSeen, ts);
      case 4: // compacted
        if (!topicOk || !count(seen, num, CLEANED)) return null;
        return Decoded.of(type, topic, partition, null, num[CLEANED], ts, ets | Decoded.VALUE);
      case 5: // log_start
        if (!topicOk || !count(seen, num, LOG_START)) return null;
        return Decoded.of(type, topic, partition, null, num[LOG_START], ts, ets | Decoded.VALUE);
      default:
        return null;
    }
  }

  private static int ws(byte[] b, int i) {
    while (i < b.length && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r')) i++;
    return i;
  }

  /** The end (past the closing quote) of the string at i, or -1: unterminated, or a control character in it. */
  private static int string(byte[] b, int i) {
    for (int j = i + 1; j < b.length; j++) {
      if (b[j] == '"') return j + 1;
      if (b[j] < 0x20) return -1;
    }
    return -1;
  }

  /** The end of the JSON number at i (RFC 8259's grammar), or -1. */
  private static int number(byte[] b, int i) {
    int n = b.length, j = i;
    if (j < n && b[j] == '-') j++;
    if (j >= n) return -1;
    if (b[j] == '0') {
      j++;
    } else if (b[j] >= '1' && b[j] <= '9') {
      while (j < n && isDigit(b[j])) j++;
    } else {
      return -1;
    }
    if (j < n && b[j] == '.') {
      int d = ++j;
      while (j < n && isDigit(b[j])) j++;
      if (j == d) return -1;
    }
    if (j < n && (b[j] == 'e' || b[j] == 'E')) {
      j++;
      if (j < n && (b[j] == '+' || b[j] == '-')) j++;
      int d = j;
      while (j < n && isDigit(b[j])) j++;
      if (j == d) return -1;
    }
    return j - i > MAX_NUMBER_CHARS ? -1 : j;
  }

  /** The end of the integer at i (a number with neither fraction nor exponent, at most MAX_INT_DIGITS), or -1. */
  private static int integer(byte[] b, int i) {
    int end = number(b, i);
    if (end < 0) return -1;
    int digits = end - i - (b[i] == '-' ? 1 : 0);
    for (int j = i; j < end; j++) {
      if (b[j] == '.' || b[j] == 'e' || b[j] == 'E') return -1;
    }
    return digits > MAX_INT_DIGITS ? -1 : end;
  }

  private static long parse(byte[] b, int i, int end) {
    boolean negative = b[i] == '-';
    long v = 0;
    for (int j = negative ? i + 1 : i; j < end; j++) v = v * 10 + (b[j] - '0');
    return negative ? -v : v;
  }

  /** The end of the JSON value at i, a container at nesting `depth`; -1 if invalid or deeper than MAX_DEPTH. */
  private static int value(byte[] b, int i, int depth) {
    int n = b.length;
    if (i >= n) return -1;
    switch (b[i]) {
      case '"':
        return string(b, i);
      case 't':
        return literal(b, i, "true");
      case 'f':
        return literal(b, i, "false");
      case 'n':
        return literal(b, i, "null");
      case '{':
      case '[':
        if (depth > MAX_DEPTH) return -1;
        boolean object = b[i] == '{';
        byte close = (byte) (object ? '}' : ']');
        i = ws(b, i + 1);
        if (i < n && b[i] == close) return i + 1;
        while (true) {
          if (object) {
            if (i >= n || b[i] != '"') return -1;
            i = string(b, i);
            if (i < 0) return -1;
            i = ws(b, i);
            if (i >= n || b[i] != ':') return -1;
            i = ws(b, i + 1);
          }
          i = value(b, i, depth + 1);
          if (i < 0) return -1;
          i = ws(b, i);
          if (i >= n) return -1;
          if (b[i] == close) return i + 1;
          if (b[i] != ',') return -1;
          i = ws(b, i + 1);
        }
      default:
        return number(b, i);
    }
  }

  private static int literal(byte[] b, int i, String word) {
    if (i + word.length() > b.length) return -1;
    for (int j = 0; j < word.length(); j++) {
      if (b[i + j] != word.charAt(j)) return -1;
    }
    return i + word.length();
  }

  /** Which contract field the name in b[from, to) is, or -1. */
  private static int field(byte[] b, int from, int to) {
    for (int f = 0; f < FIELDS.length; f++) {
      if (same(b, from, to, FIELDS[f])) return f;
    }
    return -1;
  }

  private static int type(byte[] b, int from, int to) {
    for (int t = 0; t < TYPE_BYTES.length; t++) {
      if (same(b, from, to, TYPE_BYTES[t])) return t;
    }
    return -1;
  }

  private static boolean same(byte[] b, int from, int to, byte[] name) {
    if (to - from != name.length) return false;
    for (int j = 0; j < name.length; j++) {
      if (b[from + j] != name[j]) return false;
    }
    return true;
  }

  private static boolean isDigit(byte c) {
    return c >= '0' && c <= '9';
  }

  private static boolean count(int seen, long[] num, int field) {
    return (seen & (1 << field)) != 0 && num[field] >= 0 && num[field] <= Decoded.MAX_INT;
  }

  /** The contract's topic names: 1 to 249 of [a-zA-Z0-9._-]. */
  private static boolean topicName(byte[] b, int from, int to) {
    if (to <= from || to - from > 249) return false;
    for (int j = from; j < to; j++) {
      byte c = b[j];
      boolean ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.'
          || c == '_' || c == '-';
      if (!ok) return false;
    }
    return true;
  }

  private static String text(byte[] b, int from, int to) {
    return new String(b, from, to - from, StandardCharsets.ISO_8859_1); // ASCII: checked above
  }

  private static byte[][] ascii(String[] names) {
    byte[][] out = new byte[names.length][];
    for (int i = 0; i < names.length; i++) out[i] = names[i].getBytes(StandardCharsets.US_ASCII);
    return out;
  }
}
