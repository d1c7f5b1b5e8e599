package io.compactd.spark;

import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Iterator;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The fast path, in the tasks that read the batch: Spark's Kafka rows (topic, partition, offset, key, value) decoded
 * ({@link OffsetsDecode}, {@link JsonDecode}) and reduced in one pass, as Spark's internal rows. What a task returns:
 * one row per reduction key (streaming/decode.py {@code key_and_order}: the kind, with commits and deletions as one
 * kind, the topic, partition, group and base offset), the last by source position (partition, then offset), with
 * {@code n} the records it stands for; one row per record for the forward kinds (compacted, log_start: the largest
 * value wins, on the driver) and for every record the decoders refuse ({@code slow}, its bytes kept: the reference
 * decides it on the driver and names the DLQ reason). Records a topic's reset superseded are dropped.
 *
 * <p>Why not Spark expressions: the decoders as Java UDFs returned a {@code Row} that Spark converted on every record
 * (2.7 times the decoder's own time, JFR), and the group-by after them hashed strings and kept nine max_by buffers per
 * key; here a record costs its decode and a hash-map update, and only the kept rows become Spark rows. A task holds
 * one source partition's range, so the map's rows are those of distinct keys, which the driver reduces again across
 * tasks (decode.reduce_table) as it reduces everything it receives.
 */
public final class FastReduce implements Serializable {
  private static final long serialVersionUID = 1L;

  /** The rows' columns, in order: decode.py FAST_DDL. */
  public static final StructType SCHEMA = new StructType()
      .add("stream", DataTypes.StringType)
      .add("kind", DataTypes.StringType)
      .add("topic", DataTypes.StringType)
      .add("partition", DataTypes.IntegerType)
      .add("grp", DataTypes.StringType)
      .add("base_offset", DataTypes.LongType)
      .add("end_offset", DataTypes.LongType)
      .add("first_batch_max_ts", DataTypes.LongType)
      .add("size_bytes", DataTypes.LongType)
      .add("value_offset", DataTypes.LongType)
      .add("ts", DataTypes.LongType)
      .add("src_topic", DataTypes.StringType)
      .add("src_partition", DataTypes.IntegerType)
      .add("src_offset", DataTypes.LongType)
      .add("raw_key", DataTypes.BinaryType)
      .add("raw_value", DataTypes.BinaryType)
      .add("topic_id", DataTypes.StringType)
      .add("n", DataTypes.LongType)
      .add("slow", DataTypes.BooleanType, false);

  private final String offsetsTopic;
  private final String segmentsTopic;
  private final String commitsTopic;
  private final String configTopic;
  private final int segmentTypes;
  private final int commitTypes;
  private final int maxEventBytes;
  private final boolean reduce;
  /** source topic, NUL, source partition → topic → the source offset below which its events are superseded. */
  private final HashMap<String, HashMap<String, Long>> cuts;

  /**
   * @param segmentTypes, commitTypes the event types each JSON topic may carry, as bit masks over
   *     {@link JsonDecode#TYPES}
   * @param cuts a topic's reset: lines of "topic TAB source topic TAB source partition TAB offset"
   * @param reduce false: one row per record ({@code n} 1), as the equivalence tests compare them with the reference
   */
  public FastReduce(String offsetsTopic, String segmentsTopic, String commitsTopic, String configTopic,
      int segmentTypes, int commitTypes, int maxEventBytes, String cuts, boolean reduce) {
    this.offsetsTopic = offsetsTopic;
    this.segmentsTopic = segmentsTopic;
    this.commitsTopic = commitsTopic;
    this.configTopic = configTopic;
    this.segmentTypes = segmentTypes;
    this.commitTypes = commitTypes;
    this.maxEventBytes = maxEventBytes;
    this.reduce = reduce;
    this.cuts = new HashMap<>();
    for (String line : cuts.split("\n")) {
      if (line.isEmpty()) continue;
      String[] f = line.split("\t", -1);
      this.cuts.computeIfAbsent(f[1] + "\u0000" + f[2], k -> new HashMap<>()).put(f[0], Long.parseLong(f[3]));
    }
  }

  /**
   * The batch's Kafka rows → the fast path's rows ({@link #SCHEMA}), computed by the batch's next action. The rows are
   * the connector's own (its columns found by name): a projection to the five columns read would copy every key and
   * value once more.
   */
  public Dataset<Row> apply(Dataset<Row> kafkaRows) {
    StructType in = kafkaRows.schema();
    int[] at = {in.fieldIndex("topic"), in.fieldIndex("partition"), in.fieldIndex("offset"), in.fieldIndex("key"),
        in.fieldIndex("value")};
    RDD<InternalRow> rows = kafkaRows.queryExecution().toRdd();
    RDD<InternalRow> out = rows.toJavaRDD().mapPartitions(new Columns(this, at)).rdd();
    return kafkaRows.sparkSession().internalCreateDataFrame(out, SCHEMA, false);
  }

  /** A task's function: the rows' columns are at {@code at} (topic, partition, offset, key, value). */
  private static final class Columns implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
    private static final long serialVersionUID = 1L;
    private final FastReduce task;
    private final int[] at;

    Columns(FastReduce task, int[] at) {
      this.task = task;
      this.at = at;
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> input) {
      return task.new Task(input, at);
    }
  }

  /** A reduction key (decode.key_and_order). */
  private record Key(String kind, String topic, int partition, String group, long base, boolean hasBase) {}

  /** A key's last record so far, and how many records it stands for. */
  private static final class Slot {
    Decoded d;
    UTF8String srcTopic;
    int srcPartition;
    long srcOffset;
    long n;
  }

  private final class Task implements Iterator<InternalRow> {
    private final Iterator<InternalRow> input;
    private final UTF8String offsets = UTF8String.fromString(offsetsTopic);
    private final UTF8String segments = UTF8String.fromString(segmentsTopic);
    private final UTF8String commits = UTF8String.fromString(commitsTopic);
    private final UTF8String config = UTF8String.fromString(configTopic);
    private final HashMap<Key, Slot> keys = new HashMap<>();
    private final ArrayDeque<InternalRow> ready = new ArrayDeque<>();
    private Iterator<Slot> reduced;
    private String cutsAt;
    private HashMap<String, Long> cutsHere;
    private final int topicAt, partitionAt, offsetAt, keyAt, valueAt;

    Task(Iterator<InternalRow> input, int[] at) {
      this.input = input;
      topicAt = at[0];
      partitionAt = at[1];
      offsetAt = at[2];
      keyAt = at[3];
      valueAt = at[4];
    }

    @Override
    public boolean hasNext() {
      while (ready.isEmpty() && input.hasNext()) read(input.next());
      if (!ready.isEmpty()) return true;
      if (reduced == null) reduced = keys.values().iterator();
      return reduced.hasNext();
    }

    @Override
    public InternalRow next() {
      if (!hasNext()) throw new NoSuchElementException();
      if (!ready.isEmpty()) return ready.poll();
      Slot s = reduced.next();
      return row(s.d, s.srcTopic, s.srcPartition, s.srcOffset, s.n);
    }

    private void read(InternalRow r) {
      UTF8String src = r.getUTF8String(topicAt);
      int srcPartition = r.getInt(partitionAt);
      long srcOffset = r.getLong(offsetAt);
      byte[] key = r.isNullAt(keyAt) ? null : r.getBinary(keyAt);
      byte[] value = r.isNullAt(valueAt) ? null : r.getBinary(valueAt);
      UTF8String srcTopic;
      Decoded d;
      if (src.equals(offsets)) {
        srcTopic = offsets;
        d = OffsetsDecode.decode(key, value);
      } else if (src.equals(segments)) {
        srcTopic = segments;
        d = JsonDecode.decode(value, segmentTypes, maxEventBytes);
      } else if (src.equals(commits)) {
        srcTopic = commits;
        d = JsonDecode.decode(value, commitTypes, maxEventBytes);
      } else {
        srcTopic = src.equals(config) ? config : src.clone(); // the input row's bytes are reused
        d = null;
      }
      if (d == null) {
        ready.add(slow(srcTopic, srcPartition, srcOffset, key, value));
        return;
      }
      if (d.topic != null && superseded(srcTopic, srcPartition, srcOffset, d.topic)) return;
      if (!reduce || d.forward()) {
        ready.add(row(d, srcTopic, srcPartition, srcOffset, 1));
        return;
      }
      boolean commit = d.kind == 0 || d.kind == 1;
      Key k = new Key(commit ? "offset" : d.kindName, d.topic, d.partition, d.group, d.base,
          (d.set & Decoded.BASE) != 0);
      Slot s = keys.get(k);
      if (s == null) {
        s = new Slot();
        keys.put(k, s);
      }
      s.n++;
      if (s.d == null || srcPartition > s.srcPartition
          || (srcPartition == s.srcPartition && srcOffset >= s.srcOffset)) {
        s.d = d;
        s.srcTopic = srcTopic;
        s.srcPartition = srcPartition;
        s.srcOffset = srcOffset;
      }
    }

    private boolean superseded(UTF8String srcTopic, int srcPartition, long srcOffset, String topic) {
      if (cuts.isEmpty()) return false;
      String at = srcTopic + "\u0000" + srcPartition;
      if (!at.equals(cutsAt)) {
        cutsAt = at;
        cutsHere = cuts.get(at);
      }
      if (cutsHere == null) return false;
      Long below = cutsHere.get(topic);
      return below != null && srcOffset < below;
    }

    private UTF8String stream(UTF8String srcTopic) {
      if (srcTopic == offsets) return CONSUMER_OFFSETS;
      if (srcTopic == segments) return SEGMENTS;
      if (srcTopic == commits) return COMMITS;
      if (srcTopic == config) return CONFIG;
      return UNKNOWN;
    }

    private InternalRow slow(UTF8String srcTopic, int srcPartition, long srcOffset, byte[] key, byte[] value) {
      Object[] v = new Object[SCHEMA.size()];
      v[0] = stream(srcTopic);
      v[11] = srcTopic;
      v[12] = srcPartition;
      v[13] = srcOffset;
      v[14] = key;
      v[15] = value;
      v[17] = 1L;
      v[18] = true;
      return new GenericInternalRow(v);
    }

    private InternalRow row(Decoded d, UTF8String srcTopic, int srcPartition, long srcOffset, long n) {
      Object[] v = new Object[SCHEMA.size()];
      v[0] = stream(srcTopic);
      v[1] = UTF8String.fromString(d.kindName);
      v[2] = d.topic == null ? null : UTF8String.fromString(d.topic);
      v[3] = d.partition < 0 ? null : (Object) d.partition;
      v[4] = d.group == null ? null : UTF8String.fromString(d.group);
      v[5] = (d.set & Decoded.BASE) != 0 ? (Object) d.base : null;
      v[6] = (d.set & Decoded.END) != 0 ? (Object) d.end : null;
      v[7] = (d.set & Decoded.FIRST_TS) != 0 ? (Object) d.firstTs : null;
      v[8] = (d.set & Decoded.SIZE) != 0 ? (Object) d.size : null;
      v[9] = (d.set & Decoded.VALUE) != 0 ? (Object) d.valueOffset : null;
      v[10] = (d.set & Decoded.TS) != 0 ? (Object) d.ts : null;
      v[11] = srcTopic;
      v[12] = srcPartition;
      v[13] = srcOffset;
      v[16] = (d.set & Decoded.TID) != 0 ? UTF8String.fromString(new java.util.UUID(d.tidHi, d.tidLo).toString())
          : null;
      v[17] = n;
      v[18] = false;
      return new GenericInternalRow(v);
    }
  }

  private static final UTF8String CONSUMER_OFFSETS = UTF8String.fromString("consumer_offsets");
  private static final UTF8String SEGMENTS = UTF8String.fromString("segments");
  private static final UTF8String COMMITS = UTF8String.fromString("commits");
  private static final UTF8String CONFIG = UTF8String.fromString("config");
  private static final UTF8String UNKNOWN = UTF8String.fromString("unknown");
}
