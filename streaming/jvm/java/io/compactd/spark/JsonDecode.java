package io.compactd.spark;

import java.io.IOException;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF3;

/**
 * The fast path for JSON input events (value, the topic's types as "a,b,c", the size limit) → the row of {@link Decoded}.
 * Jackson's streaming parser reads the value once, strictly (its defaults: no comments, no single quotes, no leading
 * zeros, no NaN, no trailing commas). It accepts only what the pydantic models of codec/events.py accept and reads
 * it as they do: a flat object whose contract fields each come once with their JSON type (integers without fraction
 * or exponent that fit a long, strings of printable ASCII), other fields anything up to 32 levels deep (ignored), the
 * models' constraints (ranges, the topic name's pattern, the group's length, which types belong on this topic, end
 * after base; an absent size_bytes is 0). Everything else is refused ({@code fast} false): the reference decides it
 * and names the DLQ reason. Bytes outside ASCII anywhere in the value are refused before parsing (which of them are
 * valid UTF-8 is the reference's call), and so is any escape: Jackson skips a lone surrogate (an unknown field's
 * "\ud800") that the reference rejects as malformed JSON.
 */
public final class JsonDecode implements UDF3<byte[], String, Integer, Row> {
  private static final long serialVersionUID = 1L;
  private static final JsonFactory JSON = new JsonFactory();
  private static final String[] FIELDS = {
    "type", "group", "topic", "partition", "offset", "base_offset", "end_offset", "first_batch_max_ts",
    "size_bytes", "cleaned_up_to", "log_start_offset", "ts"
  };
  private static final int TYPE = 0, GROUP = 1, TOPIC = 2, PARTITION = 3, OFFSET = 4, BASE = 5, END = 6,
      FIRST_TS = 7, SIZE = 8, CLEANED = 9, LOG_START = 10, TS = 11, STRINGS = 3;
  private static final int MAX_DEPTH = 32;

  @Override
  public Row call(byte[] value, String types, Integer maxBytes) {
    if (value == null || value.length > maxBytes) return Decoded.REFUSED;
    for (byte b : value) {
      if (b < 0 || b == '\\') return Decoded.REFUSED;
    }
    String[] text = new String[STRINGS];
    long[] num = new long[FIELDS.length];
    int seen = 0;
    try (JsonParser p = JSON.createParser(value)) {
      if (p.nextToken() != JsonToken.START_OBJECT) return Decoded.REFUSED;
      for (JsonToken t = p.nextToken(); t != JsonToken.END_OBJECT; t = p.nextToken()) {
        if (t != JsonToken.FIELD_NAME) return Decoded.REFUSED;
        int field = index(p.currentName());
        t = p.nextToken();
        if (field < 0) { // a field of no event: ignored, as the reference ignores it
          if ((t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY) && !skip(p)) return Decoded.REFUSED;
          continue;
        }
        if ((seen & (1 << field)) != 0) return Decoded.REFUSED; // twice: which one counts is the reference's call
        seen |= 1 << field;
        if (field < STRINGS) {
          if (t != JsonToken.VALUE_STRING) return Decoded.REFUSED;
          String s = p.getText();
          for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c < 0x20 || c > 0x7e) return Decoded.REFUSED;
          }
          text[field] = s;
        } else {
          if (t != JsonToken.VALUE_NUMBER_INT) return Decoded.REFUSED;
          JsonParser.NumberType nt = p.getNumberType();
          if (nt != JsonParser.NumberType.INT && nt != JsonParser.NumberType.LONG) return Decoded.REFUSED;
          num[field] = p.getLongValue();
        }
      }
      if (p.nextToken() != null) return Decoded.REFUSED; // anything after the object
    } catch (IOException | RuntimeException e) {
      return Decoded.REFUSED;
    }
    String kind = text[TYPE];
    if (kind == null || !hasType(types, kind) || !count(seen, num, TS)) return Decoded.REFUSED;
    String group = text[GROUP];
    String topic = text[TOPIC];
    boolean groupOk = group != null && !group.isEmpty() && group.length() <= 1024;
    boolean topicOk = topic != null && topicName(topic) && (seen & (1 << PARTITION)) != 0
        && num[PARTITION] >= 0 && num[PARTITION] <= Integer.MAX_VALUE;
    Integer partition = topicOk ? (int) num[PARTITION] : null;
    long ts = num[TS];
    switch (kind) {
      case "offset_commit":
        if (!groupOk || !topicOk || !count(seen, num, OFFSET)) return Decoded.REFUSED;
        return Decoded.row(true, kind, topic, partition, group, null, null, null, null, num[OFFSET], ts, null, null);
      case "offset_delete":
        if (!groupOk || !topicOk) return Decoded.REFUSED;
        return Decoded.row(true, kind, topic, partition, group, null, null, null, null, null, ts, null, null);
      case "group_delete":
        if (!groupOk) return Decoded.REFUSED;
        return Decoded.row(true, kind, null, null, group, null, null, null, null, null, ts, null, null);
      case "segment_rolled":
        long size = (seen & (1 << SIZE)) != 0 ? num[SIZE] : 0;
        if (!topicOk || !count(seen, num, BASE) || !count(seen, num, END) || !count(seen, num, FIRST_TS)
            || size < 0 || size > Decoded.MAX_INT || num[END] <= num[BASE]) {
          return Decoded.REFUSED;
        }
        return Decoded.row(true, kind, topic, partition, null, num[BASE], num[END], num[FIRST_TS], size, null, ts,
            null, null);
      case "compacted":
        if (!topicOk || !count(seen, num, CLEANED)) return Decoded.REFUSED;
        return Decoded.row(true, kind, topic, partition, null, null, null, null, null, num[CLEANED], ts, null, null);
      case "log_start":
        if (!topicOk || !count(seen, num, LOG_START)) return Decoded.REFUSED;
        return Decoded.row(true, kind, topic, partition, null, null, null, null, null, num[LOG_START], ts, null,
            null);
      default:
        return Decoded.REFUSED;
    }
  }

  private static int index(String name) {
    for (int i = 0; i < FIELDS.length; i++) {
      if (FIELDS[i].equals(name)) return i;
    }
    return -1;
  }

  /** Skips a nested value; false when it nests deeper than MAX_DEPTH. */
  private static boolean skip(JsonParser p) throws IOException {
    int depth = 1;
    while (depth > 0) {
      JsonToken t = p.nextToken();
      if (t == null) return false;
      if (t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY) {
        if (++depth > MAX_DEPTH) return false;
      } else if (t == JsonToken.END_OBJECT || t == JsonToken.END_ARRAY) {
        depth--;
      }
    }
    return true;
  }

  private static boolean count(int seen, long[] num, int field) {
    return (seen & (1 << field)) != 0 && num[field] >= 0 && num[field] <= Decoded.MAX_INT;
  }

  private static boolean hasType(String types, String kind) {
    for (String t : types.split(",")) {
      if (t.equals(kind)) return true;
    }
    return false;
  }

  /** The contract's topic names: 1 to 249 of [a-zA-Z0-9._-]. */
  private static boolean topicName(String s) {
    if (s.isEmpty() || s.length() > 249) return false;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      boolean ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.'
          || c == '_' || c == '-';
      if (!ok) return false;
    }
    return true;
  }
}
