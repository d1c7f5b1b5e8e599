package io.compactd.compaction;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.sql.api.java.UDF1;

/**
 * One compaction task in the JVM: read each of its source partitions' ranges (the previous generation's view ranges,
 * then the source delta, read_committed), keep each key's winner under KIP-280's order key, write the winners into
 * the view's partition of the same number in source-offset order, and report the view range written. The task's
 * JSON comes from compaction/spark_run.py ({@code jvm_task}); the report is a JSON list, one object per partition
 * that had a record to read, with the columns of {@code WRITTEN_SCHEMA}.
 *
 * <p>It is the fast path of the Python rules ({@code strategy.order_key}, {@code strategy.replaces},
 * {@code reduce.settle}, {@code spark_run.message_fields}), which stay the reference: the compaction property test
 * runs both. What its tasks hold comes out of one budget per JVM ({@link Budget}); a partition whose keys outgrow it
 * goes through Spark's shuffle. Why Java: the Python task spent about 2 µs a record inside confluent-kafka's message objects and
 * the combine's loop, more than Kafka's own cleaner spends on the whole record.
 *
 * <p>A read never skips: offsets deleted before they are read fail the task ({@code auto.offset.reset=none}), as
 * does a read that stalls. The range of view partition p is its high watermark before the first write and after
 * the last acknowledgement: only this task writes p in this run, and the driver checks the range holds exactly the
 * records written before it publishes.
 */
public final class ViewRun implements UDF1<String, String> {
  private static final long serialVersionUID = 1L;
  /** The Kafka clients' settings ({"consumer": {...}, "producer": {...}}), credentials included: a field of the
   * function, serialized with the task, never a literal of the query (Spark shows its plans, with their literals, in
   * its UI, event logs and `explain`). */
  private final String clients;

  public ViewRun(String clients) {
    this.clients = clients;
  }
  /** A task's three clients: the reader, the meter of the view's high watermarks, and the writer. */
  static final class Clients implements AutoCloseable {
    final KafkaConsumer<byte[], byte[]> consumer;
    final KafkaConsumer<byte[], byte[]> meter;
    final KafkaProducer<byte[], byte[]> producer;

    Clients(String clients) throws Exception {
      JsonNode k = JSON.readTree(clients);
      Properties consumerProps = props(k.path("consumer"));
      consumerProps.put("isolation.level", "read_committed");
      consumerProps.put("auto.offset.reset", "none");
      consumerProps.put("enable.auto.commit", "false");
      consumerProps.remove("group.id");
      Properties meterProps = props(k.path("consumer"));
      meterProps.put("isolation.level", "read_uncommitted"); // the view's high watermark, not its stable offset
      meterProps.remove("group.id");
      ByteArrayDeserializer bytes = new ByteArrayDeserializer();
      this.consumer = new KafkaConsumer<>(consumerProps, bytes, bytes);
      this.meter = new KafkaConsumer<>(meterProps, bytes, bytes);
      this.producer = new KafkaProducer<>(props(k.path("producer")), new ByteArraySerializer(), new ByteArraySerializer());
    }

    @Override
    public void close() {
      consumer.close(Duration.ZERO);
      meter.close(Duration.ZERO);
      producer.close(Duration.ZERO);
    }
  }

  /**
   * Idle clients by settings, as Spark's Kafka connector keeps its producers and consumers: a task borrows a set
   * connected by an earlier one (making one connects three clients: 0.02 to 0.05 s of a task that may last 0.1 s)
   * and gives it back when it succeeds; a task that fails closes its set. At most {@code POOL_MAX} idle sets per
   * settings, each closed after {@code IDLE_MS} unused (by the next task to borrow, whatever its settings).
   */
  record Idle(Clients clients, long since) {}

  static final ConcurrentHashMap<String, ConcurrentLinkedDeque<Idle>> POOL = new ConcurrentHashMap<>();
  static final int POOL_MAX = 4;
  static final long IDLE_MS = 300_000;

  static Clients borrow(String clients) throws Exception {
    long now = System.currentTimeMillis();
    for (ConcurrentLinkedDeque<Idle> idle : POOL.values()) { // sets of settings no longer used go too
      for (Idle old; (old = idle.peekLast()) != null && now - old.since() >= IDLE_MS; ) {
        if (idle.removeLastOccurrence(old)) {
          old.clients().close();
        }
      }
    }
    Idle held = POOL.computeIfAbsent(clients, c -> new ConcurrentLinkedDeque<>()).pollFirst();
    return held != null ? held.clients() : new Clients(clients);
  }

  /** How many idle sets of these settings the pool holds (what a test observes). */
  public static int idleSets(String clients) {
    ConcurrentLinkedDeque<Idle> idle = POOL.get(clients);
    return idle == null ? 0 : idle.size();
  }

  static void giveBack(String clients, Clients c) {
    c.consumer.assign(List.of());
    ConcurrentLinkedDeque<Idle> idle = POOL.computeIfAbsent(clients, k -> new ConcurrentLinkedDeque<>());
    if (idle.size() >= POOL_MAX) {
      c.close();
      return;
    }
    idle.addFirst(new Idle(c, System.currentTimeMillis()));
  }

  static final String OFFSET_HEADER = "compactd.offset";
  // a winner's own timestamp where the view record cannot carry it: 0 or none (-1), which a producer writes as the
  // time of writing (librdkafka always, so the shuffle path; one header for both paths). Read back, it is the rank
  // `timestamp` compares: "now" would outrank every newer source record produced before the run
  static final String TIMESTAMP_HEADER = "compactd.timestamp";
  static final String DELETED_AT = "compactd.deleted_at";
  /** `spark_run.RESERVED`: the headers a source record cannot carry into the view. */
  static final java.util.Set<String> RESERVED = java.util.Set.of(OFFSET_HEADER, TIMESTAMP_HEADER, DELETED_AT);
  private static final ObjectMapper JSON = new ObjectMapper();

  /** The topic's KIP-280 strategy, as {@code compaction/strategy.py} names it. */
  static final class Strategy {
    final String kind;
    final String header;
    final boolean decimal;
    final boolean latest;

    Strategy(JsonNode s) {
      String k = s.path("kind").asText("offset");
      String h = s.path("header").isTextual() ? s.path("header").asText() : null;
      boolean headerKind = k.equals("header") && h != null && !h.isEmpty();
      this.kind = k.equals("header") && !headerKind ? "offset" : k;
      this.header = headerKind ? h : null;
      this.decimal = s.path("header_format").asText("long").equals("decimal");
      this.latest = s.path("tombstone").asText("version").equals("latest");
    }
  }

  /** A key's record as the view keeps it: its source offset, timestamp (-1: none), and headers without the view's
   * own offset header. */
  static final class Rec {
    final long offset;
    final long ts;
    final byte[] key;
    final byte[] value;
    final List<Header> headers;
    long k1;
    long k2;
    long k3;

    Rec(long offset, long ts, byte[] key, byte[] value, List<Header> headers) {
      this.offset = offset;
      this.ts = ts;
      this.key = key;
      this.value = value;
      this.headers = headers;
    }

    /** What holding it costs the heap, about: its arrays, the object, its map entry and key wrapper. */
    long bytes() {
      long b = 160 + len(key) + len(value);
      for (Header h : headers) {
        b += 64 + 2L * h.key().length() + len(h.value());
      }
      return b;
    }
  }

  /** A partition's counts, named as {@code WRITTEN_SCHEMA}'s columns. */
  static final class Counts {
    int partition;
    long viewStart;
    long viewEnd;
    long written;
    long keys;
    long tombstones;
    long expired;
    long nullKeys;
    long recordsIn;
    long bytesIn;
    long bytesOut;
    long readNanos;
    long writeNanos;
  }

  @Override
  public String call(String task) throws Exception {
    JsonNode t = JSON.readTree(task);
    Strategy strategy = new Strategy(t.path("strategy"));
    boolean retain = t.path("retain_null_key").asBoolean(false);
    long stallMs = required(t, "stall_ms"); // a read's deadline on progress; also the meter's bound
    String view = t.path("view").asText();
    long now = t.path("now").asLong();
    long retentionMs = t.path("delete_retention_ms").asLong();
    boolean ranked = !strategy.kind.equals("offset");
    long holdMax = required(t, "hold_max"); // a larger partition is read twice, its keys in a KeyMap
    long budgetBytes = Budget.limit(required(t, "map_bytes"));
    // one partition's ranges in read order, partitions in the order the task lists them
    Map<Integer, List<JsonNode>> byPartition = new LinkedHashMap<>();
    for (JsonNode r : t.path("ranges")) {
      byPartition.computeIfAbsent(r.path("partition").asInt(), p -> new ArrayList<>()).add(r);
    }
    AtomicReference<Exception> failed = new AtomicReference<>();
    ArrayNode out = JSON.createArrayNode();
    Clients held = borrow(clients);
    boolean done = false;
    try {
      KafkaConsumer<byte[], byte[]> consumer = held.consumer;
      KafkaConsumer<byte[], byte[]> meter = held.meter;
      KafkaProducer<byte[], byte[]> producer = held.producer;
      Writer writer = new Writer(producer, view, now, retentionMs, failed);
      List<Counts> written = new ArrayList<>(); // reported once the producer has flushed
      for (Map.Entry<Integer, List<JsonNode>> e : byPartition.entrySet()) {
        int p = e.getKey();
        List<JsonNode> ranges = e.getValue();
        long records = 0;
        for (JsonNode r : ranges) {
          records += Math.max(0, r.path("end").asLong() - r.path("start").asLong());
        }
        Counts c = new Counts();
        TopicPartition vtp = new TopicPartition(view, p);
        long t0 = System.nanoTime();
        long t1;
        try (Budget budget = new Budget(budgetBytes)) {
          List<Rec> kept = null;
          if (records <= holdMax) { // one pass: each key's winner held whole, then written sorted by offset
            try {
              kept = read(consumer, ranges, strategy, retain, stallMs, c, budget);
            } catch (OverBudget over) { // the JVM's tasks hold all they may: this one reads its partition twice
              budget.release();
              c = new Counts();
            }
          }
          if (kept != null) {
            t1 = System.nanoTime();
            if (c.recordsIn == 0) {
              continue; // nothing read: no report, as no row reached the Python writer
            }
            c.viewStart = high(meter, vtp, stallMs);
            for (Rec r : kept) {
              writer.write(p, r, c);
            }
          } else { // two passes, as Kafka's cleaner: the winners' offsets by key, then the winners copied in log order
            Counts counts = c;
            KeyMap winners = map(consumer, ranges, strategy, retain, stallMs, c, new KeyMap(ranked, budget, records));
            t1 = System.nanoTime();
            if (winners == null) {
              ObjectNode o = JSON.createObjectNode();
              o.put("partition", p);
              o.put("overflow", true); // more keys than the JVM's budget holds: Spark's shuffle path takes it
              out.add(o);
              continue;
            }
            if (c.recordsIn == 0) {
              continue;
            }
            c.viewStart = high(meter, vtp, stallMs);
            scan(consumer, ranges, stallMs, (m, fromView, topic) -> {
              byte[] key = m.key();
              if (key == null) {
                if (retain) {
                  writer.write(p, fields(m, fromView, topic), counts);
                }
                return;
              }
              long offset = fromView ? sourceOffset(m, topic) : m.offset();
              if (winners.offsetOf(key) == offset) {
                writer.write(p, fields(m, fromView, topic), counts);
              }
            });
          }
        }
        // no flush here: the producer sends this partition's records while the task reads the next one
        c.partition = p;
        c.readNanos = t1 - t0;
        c.writeNanos = System.nanoTime() - t1;
        written.add(c);
      }
      long t2 = System.nanoTime();
      producer.flush();
      Exception err = failed.get();
      if (err != null) {
        throw new ViewRunException("view " + view + ": a write was refused: " + err);
      }
      for (Counts c : written) {
        // the range ends after the last record acknowledged: a batch written twice (a retry after a lost ack) makes
        // it longer than the count written, which the run refuses, as a record of another writer in it would
        Long end = writer.ends.get(c.partition);
        c.viewEnd = end == null ? c.viewStart : end;
        out.add(report(c.partition, c));
      }
      if (!written.isEmpty()) {
        written.get(written.size() - 1).writeNanos += System.nanoTime() - t2;
      }
      done = true;
    } finally {
      if (done) {
        giveBack(clients, held);
      } else {
        held.close(); // whatever state a failure left them in stays with them
      }
    }
    return JSON.writeValueAsString(out);
  }

  /** One partition's ranges read in order, reduced to each key's winner; kept null keys too; sorted by offset. */
  static List<Rec> read(
      KafkaConsumer<byte[], byte[]> consumer,
      List<JsonNode> ranges,
      Strategy strategy,
      boolean retain,
      long stallMs,
      Counts c,
      Budget budget) {
    Winners best = new Winners();
    List<Rec> keptNull = new ArrayList<>();
    boolean offsetKind = strategy.kind.equals("offset");
    scan(consumer, ranges, stallMs, (m, fromView, topic) -> {
      byte[] key = m.key();
      c.recordsIn++;
      c.bytesIn += len(key) + len(m.value());
      if (key == null) {
        if (retain) {
          keptNull.add(hold(budget, fields(m, fromView, topic)));
        } else {
          c.nullKeys++;
        }
        return;
      }
      Rec rec = fields(m, fromView, topic);
      int hash = Winners.hash(key);
      if (offsetKind) {
        // a later record always wins (both tombstone rules): the view is older than the delta
        Rec before = best.put(hold(budget, rec), hash);
        if (before != null) {
          budget.give(before.bytes());
        }
        return;
      }
      rank(strategy, rec);
      Rec held = best.get(key, hash);
      if (held == null || replaces(strategy, held, rec)) {
        best.put(hold(budget, rec), hash);
        if (held != null) {
          budget.give(held.bytes());
        }
      }
    });
    List<Rec> out = new ArrayList<>(best.size() + keptNull.size());
    best.addTo(out);
    out.addAll(keptNull);
    out.sort(Comparator.comparingLong(r -> r.offset));
    return out;
  }

  /**
   * A one-pass read's winners by key: open addressing over the records themselves, each slot's key hash beside it,
   * keys compared by their bytes where the hashes match. A {@code HashMap<ByteBuffer, Rec>} cost a node, a wrapper,
   * and a hash over the key's bytes and a chain of pointers a put: in a profile of a 2M-record run it was the read's
   * hottest code (issue 65).
   */
  static final class Winners {
    private Rec[] recs = new Rec[1 << 10];
    private int[] hashes = new int[1 << 10];
    private int size;

    /** The key's hash as the two-pass map mixes it (`KeyMap.hash`): the slot is its low bits. */
    static int hash(byte[] key) {
      return KeyMap.hash(key);
    }

    private int slot(byte[] key, int hash) {
      int mask = recs.length - 1;
      int i = hash & mask;
      while (recs[i] != null && (hashes[i] != hash || !Arrays.equals(recs[i].key, key))) {
        i = (i + 1) & mask;
      }
      return i;
    }

    /** The record held for {@code key} (null: none). */
    Rec get(byte[] key, int hash) {
      return recs[slot(key, hash)];
    }

    /** Holds {@code rec} for its key; the record it replaces, or null. */
    Rec put(Rec rec, int hash) {
      int i = slot(rec.key, hash);
      Rec before = recs[i];
      recs[i] = rec;
      hashes[i] = hash;
      if (before == null && ++size * 2 > recs.length) {
        grow();
      }
      return before;
    }

    private void grow() {
      Rec[] oldRecs = recs;
      int[] oldHashes = hashes;
      recs = new Rec[oldRecs.length * 2];
      hashes = new int[oldRecs.length * 2];
      int mask = recs.length - 1;
      for (int j = 0; j < oldRecs.length; j++) {
        if (oldRecs[j] != null) {
          int i = oldHashes[j] & mask;
          while (recs[i] != null) {
            i = (i + 1) & mask;
          }
          recs[i] = oldRecs[j];
          hashes[i] = oldHashes[j];
        }
      }
    }

    int size() {
      return size;
    }

    void addTo(List<Rec> out) {
      for (Rec r : recs) {
        if (r != null) {
          out.add(r);
        }
      }
    }
  }

  /** The record, once the budget holds its bytes; else the one-pass read ends (OverBudget). */
  static Rec hold(Budget budget, Rec rec) {
    if (!budget.take(rec.bytes())) {
      throw new OverBudget();
    }
    return rec;
  }

  /** A one-pass read the JVM's budget cannot hold: the partition is read twice instead. */
  static final class OverBudget extends RuntimeException {
    private static final long serialVersionUID = 1L;

    OverBudget() {
      super(null, null, false, false); // control flow, not an error: no stack trace
    }
  }

  /**
   * The bytes this JVM's compaction tasks hold (one-pass winners with their values, two-pass key maps): one budget
   * for all of them, a quarter of the heap at most. In local mode the tasks run in the driver, and a bound per task
   * (250k winners of 2 KB each; a quarter of the heap per map) let two tasks run a 1 GiB heap out of memory: the
   * JVM died with the stream, and the trigger started the same run again. A task takes its bytes in grants of
   * {@code GRANT} (one atomic operation per 4 MiB, not per record) and gives them all back when its partition is
   * done; a one-pass read refused a grant reads its partition twice, a key map refused one sends its partition to
   * Spark's shuffle.
   */
  static final class Budget implements AutoCloseable {
    static final long GRANT = 4L << 20;
    // how long a map waits for the budget other tasks hold before its partition goes to Spark's shuffle path
    static final long MAP_WAIT_MS = 60_000;
    static final AtomicLong HELD = new AtomicLong();
    static final AtomicLong PEAK = new AtomicLong();
    // what the tasks reading in one pass hold: given back when each finishes or finds it cannot hold its partition
    static final AtomicLong READING = new AtomicLong();
    static volatile long lastLimit;
    private final long limit;
    private long granted;
    private long used;
    private boolean mapping; // a map's (pass one of two), not a one-pass read's

    Budget(long limit) {
      this.limit = limit;
    }

    /** The JVM's budget under a setting: never more than a quarter of the heap, whatever it says. */
    static long limit(long setting) {
      long limit = Math.min(setting, Runtime.getRuntime().maxMemory() / 4);
      lastLimit = limit;
      return limit;
    }

    /** Hold `n` more bytes; false, nothing taken, when the JVM's tasks would hold more than the limit together. */
    boolean take(long n) {
      long need = used + n - granted;
      if (need <= 0) {
        used += n;
        return true;
      }
      for (long held = HELD.get(); ; held = HELD.get()) {
        long want = held + Math.max(need, GRANT) <= limit ? Math.max(need, GRANT) : need;
        if (held + want > limit) {
          return false;
        }
        if (HELD.compareAndSet(held, held + want)) {
          PEAK.accumulateAndGet(held + want, Math::max);
          if (!mapping) {
            READING.addAndGet(want);
          }
          granted += want;
          used += n;
          return true;
        }
      }
    }

    /** From now on this task's holdings are a map's (called with nothing held). */
    void forMap() {
      mapping = true;
    }

    /** Hold `n` more bytes, waiting up to `waitMs` while one-pass reads hold part of the budget: such a read gives
     * all it holds back when it finishes or finds it cannot hold its partition, so a map refused while one reads is
     * room that comes back in seconds, not a partition too large for the JVM. False at once when no one-pass read
     * holds anything (other maps give nothing back before they finish), or when the wait is over. */
    boolean takeOrWait(long n, long waitMs) {
      long deadline = System.nanoTime() + waitMs * 1_000_000L;
      while (!take(n)) {
        if (READING.get() <= 0 || System.nanoTime() >= deadline) {
          return false;
        }
        try {
          Thread.sleep(20);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          return false;
        }
      }
      return true;
    }

    void give(long n) {
      used -= n;
    }

    /** Everything this task holds given back to the JVM's budget. */
    void release() {
      HELD.addAndGet(-granted);
      if (!mapping) {
        READING.addAndGet(-granted);
      }
      granted = 0;
      used = 0;
    }

    @Override
    public void close() {
      release();
    }
  }

  /** The compaction tasks' budget of this JVM, as the last task set it (what a test observes). */
  public static long budgetBytes() {
    return Budget.lastLimit;
  }

  /** The most bytes this JVM's compaction tasks held together (their grants), since it started. */
  public static long peakHeldBytes() {
    return Budget.PEAK.get();
  }

  /** Pass one of a large partition: each key's winning source offset (and what `replaces` needs of it), counting
   * what is read; null when the keys outgrow the JVM's budget. */
  static KeyMap map(
      KafkaConsumer<byte[], byte[]> consumer,
      List<JsonNode> ranges,
      Strategy strategy,
      boolean retain,
      long stallMs,
      Counts c,
      KeyMap winners) {
    boolean offsetKind = strategy.kind.equals("offset");
    boolean[] full = {false};
    scan(consumer, ranges, stallMs, (m, fromView, topic) -> {
      if (full[0]) {
        return;
      }
      byte[] key = m.key();
      c.recordsIn++;
      c.bytesIn += len(key) + len(m.value());
      if (key == null) {
        if (!retain) {
          c.nullKeys++; // dropped; a kept one is counted when pass two writes it
        }
        return;
      }
      if (offsetKind) {
        full[0] = !winners.put(key, fromView ? sourceOffset(m, topic) : m.offset());
        return;
      }
      Rec rec = fields(m, fromView, topic);
      rank(strategy, rec);
      full[0] = !winners.offer(key, rec, strategy);
    });
    return full[0] ? null : winners;
  }

  /** What a scan does with each record of a partition's ranges, in log order. */
  interface Sink {
    void accept(ConsumerRecord<byte[], byte[]> m, boolean fromView, String topic);
  }

  /** Every record of a partition's ranges, in order: a deleted offset, or a read that moves no further for
   * {@code stallMs}, fails the task. */
  static void scan(KafkaConsumer<byte[], byte[]> consumer, List<JsonNode> ranges, long stallMs, Sink sink) {
    for (JsonNode range : ranges) {
      String topic = range.path("topic").asText();
      int partition = range.path("partition").asInt();
      long start = range.path("start").asLong();
      long end = range.path("end").asLong();
      boolean fromView = range.path("from_view").asBoolean();
      // a view range's records of source offsets at or past it are not read: the source was written again from
      // there under a later leader epoch (`manifest.plan_ranges`); -1: all are
      long below = fromView ? range.path("below").asLong(-1) : -1;
      if (start >= end) {
        continue;
      }
      TopicPartition tp = new TopicPartition(topic, partition);
      consumer.assign(List.of(tp));
      consumer.seek(tp, start);
      // a deadline on progress, not on the range: 1M offsets of 10 KB records take longer than any fixed bound
      long stallNanos = stallMs * 1_000_000L;
      long progressed = System.nanoTime();
      long position = start;
      while (position < end) {
        if (System.nanoTime() - progressed > stallNanos) {
          throw new ViewRunException(topic + "/" + partition + ": read stalled at " + position + " of [" + start
              + "," + end + "): no progress for " + stallMs + " ms");
        }
        ConsumerRecords<byte[], byte[]> records;
        try {
          records = consumer.poll(Duration.ofMillis(500));
        } catch (OffsetOutOfRangeException ex) {
          throw new ViewRunException(
              topic + "/" + partition + ": offsets from " + position + " were deleted before they were read "
                  + "(the topic's retention, or a deleteRecords)");
        }
        for (ConsumerRecord<byte[], byte[]> m : records.records(tp)) {
          if (m.offset() >= end) {
            break;
          }
          if (below >= 0 && sourceOffset(m, topic) >= below) {
            continue;
          }
          sink.accept(m, fromView, topic);
        }
        long next = consumer.position(tp);
        if (next > position) {
          position = next;
          progressed = System.nanoTime();
        }
      }
    }
  }

  /** Writes a partition's records into the view: tombstones settled as `reduce.settle` does, the source offset
   * header added, counted. */
  static final class Writer {
    final KafkaProducer<byte[], byte[]> producer;
    final String view;
    final long now;
    final long retentionMs;
    final AtomicReference<Exception> failed;
    final ConcurrentHashMap<Integer, Long> ends = new ConcurrentHashMap<>(); // per view partition: last acked + 1

    Writer(KafkaProducer<byte[], byte[]> producer, String view, long now, long retentionMs,
        AtomicReference<Exception> failed) {
      this.producer = producer;
      this.view = view;
      this.now = now;
      this.retentionMs = retentionMs;
      this.failed = failed;
    }

    void write(int p, Rec r, Counts c) {
      List<Header> headers = new ArrayList<>(r.headers);
      if (r.value == null) { // a tombstone: stamped on its first run, dropped after delete.retention.ms
        BigInteger since = deletedAt(r.headers);
        if (since == null) {
          headers.add(new RecordHeader(DELETED_AT, Long.toString(now).getBytes(StandardCharsets.US_ASCII)));
        } else if (BigInteger.valueOf(now).subtract(since).compareTo(BigInteger.valueOf(retentionMs)) >= 0) {
          c.expired++;
          return;
        }
        c.tombstones++;
      } else {
        c.keys++;
      }
      Long ts = r.ts;
      if (r.ts <= 0) {
        headers.add(new RecordHeader(TIMESTAMP_HEADER, Long.toString(r.ts).getBytes(StandardCharsets.US_ASCII)));
        ts = null;
      }
      headers.add(new RecordHeader(OFFSET_HEADER, Long.toString(r.offset).getBytes(StandardCharsets.US_ASCII)));
      producer.send(
          new ProducerRecord<>(view, p, ts, r.key, r.value, headers),
          (meta, err) -> {
            if (err != null) {
              failed.compareAndSet(null, err);
            } else {
              ends.merge(p, meta.offset() + 1, Math::max);
            }
          });
      c.written++;
      c.bytesOut += len(r.key) + len(r.value);
    }
  }

  /** `spark_run.message_fields`: a view record's source offset is its last {@code compactd.offset} header, which
   * must be there and decimal (else the view was not written by compactd); a source record keeps its headers but
   * compactd's own (RESERVED): a source mirrored from a view carries them, and they are not its. */
  static Rec fields(ConsumerRecord<byte[], byte[]> m, boolean fromView, String topic) {
    long ts = m.timestampType() == TimestampType.NO_TIMESTAMP_TYPE ? -1 : m.timestamp();
    long offset = m.offset();
    if (!fromView) { // compactd's own headers mean something on the view's records only (a mirrored view's copy)
      Header[] all = m.headers().toArray();
      if (all.length == 0) {
        return new Rec(offset, ts, m.key(), m.value(), List.of());
      }
      List<Header> kept = new ArrayList<>(all.length);
      for (Header h : all) {
        if (!RESERVED.contains(h.key())) {
          kept.add(h);
        }
      }
      return new Rec(offset, ts, m.key(), m.value(), kept);
    }
    List<Header> headers = new ArrayList<>();
    for (Header h : m.headers()) {
      if (h.key().equals(TIMESTAMP_HEADER)) {
        byte[] v = h.value();
        boolean negative = v != null && v.length > 1 && v[0] == '-';
        byte[] digits = negative ? Arrays.copyOfRange(v, 1, v.length) : v;
        if (v != null && digits(digits) && digits.length < 19) {
          ts = negative ? -Long.parseLong(ascii(digits)) : Long.parseLong(ascii(digits));
        }
      } else if (!h.key().equals(OFFSET_HEADER)) {
        headers.add(h);
      }
    }
    return new Rec(sourceOffset(m, topic), ts, m.key(), m.value(), headers);
  }

  /** A view record's source offset: its last {@code compactd.offset} header, decimal, within a long. */
  static long sourceOffset(ConsumerRecord<byte[], byte[]> m, String topic) {
    byte[] source = null;
    boolean found = false;
    for (Header h : m.headers()) {
      if (h.key().equals(OFFSET_HEADER)) {
        source = h.value();
        found = true;
      }
    }
    BigInteger number = found && source != null && digits(source) ? new BigInteger(ascii(source)) : null;
    if (number == null || number.bitLength() > 63) {
      throw new ViewRunException(topic + "/" + m.partition() + "@" + m.offset() + " has no " + OFFSET_HEADER);
    }
    return number.longValue();
  }

  /** `strategy.order_key`: the record of a key with the largest (k1, k2, k3) wins. */
  static void rank(Strategy s, Rec r) {
    if (s.kind.equals("timestamp")) {
      r.k1 = r.ts;
      r.k2 = r.offset;
      r.k3 = 0;
    } else if (s.kind.equals("header")) {
      Long version = headerVersion(r.headers, s.header, s.decimal);
      r.k1 = version == null ? 0 : 1;
      r.k2 = version == null ? 0 : version;
      r.k3 = r.offset;
    } else {
      r.k1 = r.offset;
      r.k2 = 0;
      r.k3 = 0;
    }
  }

  /** `strategy.replaces`, for a record later in the log than the one held. */
  static boolean replaces(Strategy s, Rec held, Rec rec) {
    return replaces(s, held.k1, held.k2, held.k3, held.value == null, rec);
  }

  static boolean replaces(Strategy s, long k1, long k2, long k3, boolean heldTombstone, Rec rec) {
    if (s.latest && (rec.value == null || heldTombstone)) {
      return true;
    }
    if (rec.k1 != k1) {
      return rec.k1 > k1;
    }
    if (rec.k2 != k2) {
      return rec.k2 > k2;
    }
    return rec.k3 > k3;
  }

  /**
   * Each key's winner by its exact bytes (never a hash of them: two keys that collide would lose a live key), in
   * flat arrays rather than objects: about 40 bytes for a 10-byte key under `offset` (the order key adds 25). The
   * keys live in 1 MiB chunks; the arrays never grow past the partition's record count. Its bytes come out of the
   * JVM's budget, shared with the other tasks: it refuses a key the budget cannot hold, and the partition then goes
   * through Spark's shuffle, which spills.
   */
  static final class KeyMap {
    static final int CHUNK = 1 << 20;
    private final boolean ranked;
    private final Budget budget;
    private long accounted; // what the budget holds for it
    private final long maxEntries; // never more keys than records
    private int[] slots = new int[1 << 17]; // entry + 1; 0 is empty
    private int size;
    private int[] hashes = new int[1 << 16];
    private long[] refs = new long[1 << 16]; // chunk << 32 | position
    private int[] lens = new int[1 << 16];
    private long[] offsets = new long[1 << 16];
    private long[] k1s;
    private long[] k2s;
    private long[] k3s;
    private boolean[] tombs;
    private final List<byte[]> chunks = new ArrayList<>();
    private int pos = CHUNK;
    private long arena;

    KeyMap(boolean ranked, Budget budget, long records) {
      this.ranked = ranked;
      this.budget = budget;
      budget.forMap();
      this.maxEntries = Math.max(1, records);
      if (ranked) {
        k1s = new long[hashes.length];
        k2s = new long[hashes.length];
        k3s = new long[hashes.length];
        tombs = new boolean[hashes.length];
      }
    }

    long bytes(int entries, int slotCount) {
      return 4L * slotCount + (long) entries * (ranked ? 49 : 24) + arena;
    }

    /** Whether the map may be `total` bytes: the budget holds them (or already did). */
    private boolean fits(long total) {
      if (total <= accounted) {
        return true;
      }
      if (!budget.takeOrWait(total - accounted, Budget.MAP_WAIT_MS)) {
        return false;
      }
      accounted = total;
      return true;
    }

    /** A key's hash, its bits mixed (murmur3's finalizer): a table's slot is its low bits. */
    static int hash(byte[] key) {
      int h = Arrays.hashCode(key);
      h ^= h >>> 16;
      h *= 0x85ebca6b;
      h ^= h >>> 13;
      h *= 0xc2b2ae35;
      return h ^ (h >>> 16);
    }

    /** The key's entry, or -(slot + 1) of the empty slot where it would go. */
    private int find(byte[] key, int h) {
      int mask = slots.length - 1;
      int i = h & mask;
      while (true) {
        int e = slots[i] - 1;
        if (e < 0) {
          return -(i + 1);
        }
        if (hashes[e] == h && lens[e] == key.length && same(e, key)) {
          return e;
        }
        i = (i + 1) & mask;
      }
    }

    private boolean same(int e, byte[] key) {
      byte[] chunk = chunks.get((int) (refs[e] >>> 32));
      int at = (int) refs[e];
      return Arrays.equals(chunk, at, at + key.length, key, 0, key.length);
    }

    /** A new entry for `key` (not held), or -1 when the map would outgrow its bytes. */
    private int add(byte[] key, int h, int slot) {
      if (size == hashes.length) {
        int grown = (int) Math.min(Integer.MAX_VALUE - 8, Math.min(maxEntries, hashes.length + (hashes.length >> 1)));
        if (grown <= size) {
          grown = size + 1; // more keys than the records counted: cannot happen, but never an index out of bounds
        }
        if (!fits(bytes(grown, slots.length))) {
          return -1;
        }
        hashes = Arrays.copyOf(hashes, grown);
        refs = Arrays.copyOf(refs, grown);
        lens = Arrays.copyOf(lens, grown);
        offsets = Arrays.copyOf(offsets, grown);
        if (ranked) {
          k1s = Arrays.copyOf(k1s, grown);
          k2s = Arrays.copyOf(k2s, grown);
          k3s = Arrays.copyOf(k3s, grown);
          tombs = Arrays.copyOf(tombs, grown);
        }
      }
      if (10L * (size + 1) > 7L * slots.length) { // linear probing up to 70 % full
        if (!fits(bytes(hashes.length, slots.length * 2))) {
          return -1;
        }
        int[] old = slots;
        slots = new int[old.length * 2];
        int mask = slots.length - 1;
        for (int e : old) {
          if (e != 0) {
            int i = hashes[e - 1] & mask;
            while (slots[i] != 0) {
              i = (i + 1) & mask;
            }
            slots[i] = e;
          }
        }
        slot = -find(key, h) - 1;
      }
      if (pos + key.length > CHUNK || chunks.isEmpty()) {
        if (!fits(bytes(hashes.length, slots.length) + Math.max(CHUNK, key.length))) {
          return -1;
        }
        chunks.add(new byte[Math.max(CHUNK, key.length)]);
        arena += Math.max(CHUNK, key.length);
        pos = 0;
      }
      byte[] chunk = chunks.get(chunks.size() - 1);
      System.arraycopy(key, 0, chunk, pos, key.length);
      int e = size++;
      hashes[e] = h;
      refs[e] = ((long) (chunks.size() - 1) << 32) | pos;
      lens[e] = key.length;
      pos += key.length;
      slots[slot] = e + 1;
      return e;
    }

    /** `offset`: the later record of a key wins. False when the map is full. */
    boolean put(byte[] key, long offset) {
      int h = hash(key);
      int e = find(key, h);
      if (e < 0 && (e = add(key, h, -e - 1)) < 0) {
        return false;
      }
      offsets[e] = offset;
      return true;
    }

    /** Another strategy: the record takes the key's place when `replaces` says so. False when the map is full. */
    boolean offer(byte[] key, Rec rec, Strategy s) {
      int h = hash(key);
      int e = find(key, h);
      if (e >= 0 && !replaces(s, k1s[e], k2s[e], k3s[e], tombs[e], rec)) {
        return true;
      }
      if (e < 0 && (e = add(key, h, -e - 1)) < 0) {
        return false;
      }
      offsets[e] = rec.offset;
      k1s[e] = rec.k1;
      k2s[e] = rec.k2;
      k3s[e] = rec.k3;
      tombs[e] = rec.value == null;
      return true;
    }

    /** The source offset of the key's winner; -1 for a key never seen. */
    long offsetOf(byte[] key) {
      int e = find(key, hash(key));
      return e < 0 ? -1 : offsets[e];
    }
  }

  /** `strategy.header_version`: the last header of the name; `long` is 8 bytes big-endian signed, `decimal` an ASCII
   * integer within a long's range after Python's whitespace strip (non-ASCII bytes are never digits or space). */
  public static Long headerVersion(List<Header> headers, String name, boolean decimal) {
    byte[] value = null;
    boolean found = false;
    for (Header h : headers) {
      if (h.key().equals(name)) {
        value = h.value();
        found = true;
      }
    }
    if (!found || value == null) {
      return null;
    }
    if (!decimal) {
      return value.length == 8 ? ByteBuffer.wrap(value).getLong() : null;
    }
    int from = 0;
    int to = value.length;
    while (from < to && space(value[from])) {
      from++;
    }
    while (to > from && space(value[to - 1])) {
      to--;
    }
    if (from == to) {
      return null;
    }
    int digitsFrom = value[from] == '+' || value[from] == '-' ? from + 1 : from;
    if (digitsFrom == to) {
      return null;
    }
    for (int i = digitsFrom; i < to; i++) {
      if (value[i] < '0' || value[i] > '9') {
        return null;
      }
    }
    BigInteger number = new BigInteger(new String(value, from, to - from, StandardCharsets.US_ASCII));
    return number.bitLength() <= 63 ? number.longValue() : null;
  }

  /** `reduce.deleted_at`: the first {@code compactd.deleted_at} header that is a decimal number. */
  static BigInteger deletedAt(List<Header> headers) {
    for (Header h : headers) {
      if (h.key().equals(DELETED_AT) && h.value() != null && digits(h.value())) {
        return new BigInteger(ascii(h.value()));
      }
    }
    return null;
  }

  /** Python's {@code str.strip()} whitespace among ASCII bytes. */
  static boolean space(byte b) {
    return b == ' ' || (b >= 9 && b <= 13) || (b >= 28 && b <= 31);
  }

  /** Python's {@code bytes.isdigit()}: not empty, ASCII digits only. */
  static boolean digits(byte[] b) {
    if (b.length == 0) {
      return false;
    }
    for (byte x : b) {
      if (x < '0' || x > '9') {
        return false;
      }
    }
    return true;
  }

  /** A number the task's JSON must carry: its defaults are the settings', set once in Python (`jvm_task`). */
  static long required(JsonNode task, String field) {
    JsonNode v = task.get(field);
    if (v == null || !v.canConvertToLong()) {
      throw new ViewRunException("the compaction task's JSON has no " + field);
    }
    return v.asLong();
  }

  static String ascii(byte[] b) {
    return new String(b, StandardCharsets.US_ASCII);
  }

  static long len(byte[] b) {
    return b == null ? 0 : b.length;
  }

  static long high(KafkaConsumer<byte[], byte[]> meter, TopicPartition tp, long stallMs) {
    Long end = meter.endOffsets(List.of(tp), Duration.ofMillis(stallMs)).get(tp);
    if (end == null) {
      throw new ViewRunException("view " + tp + ": no high watermark");
    }
    return end;
  }

  static Properties props(JsonNode conf) {
    Properties p = new Properties();
    conf.fields().forEachRemaining(e -> p.put(e.getKey(), e.getValue().asText()));
    return p;
  }

  static ObjectNode report(int p, Counts c) {
    ObjectNode o = JSON.createObjectNode();
    o.put("partition", p);
    o.put("view_start", c.viewStart);
    o.put("view_end", c.viewEnd);
    o.put("written", c.written);
    o.put("keys", c.keys);
    o.put("tombstones", c.tombstones);
    o.put("expired", c.expired);
    o.put("null_keys", c.nullKeys);
    o.put("records_in", c.recordsIn);
    o.put("bytes_in", c.bytesIn);
    o.put("bytes_out", c.bytesOut);
    o.put("read_seconds", c.readNanos / 1e9); // where a task's time went (the run's debug line)
    o.put("write_seconds", c.writeNanos / 1e9);
    return o;
  }
}
