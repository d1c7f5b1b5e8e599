// A Kafka Streams application that reads a compacted view as its users' would: the topic materialized as a KTable
// (or a GlobalKTable), each key's last record wins and a null value deletes it. Classic protocol and Streams'
// defaults otherwise (at-least-once, read_uncommitted), so it runs against any broker of the version matrix. Its
// stores are in memory (no RocksDB). Run as a single-file program:
//   java -cp <kafka jars> ViewTable.java BOOTSTRAP APPLICATION_ID TOPIC ktable|global
// It prints "running" once its store is being filled (a GlobalKTable's: restored to the topic's end), then, for each
// line read on stdin, the store's contents as one line of JSON ({"key hex": "value hex"}), and exits when stdin ends.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HexFormat;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;

public class ViewTable {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/streams-" + args[1]);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        String topic = args[2];
        boolean global = args[3].equals("global");
        StreamsBuilder builder = new StreamsBuilder();
        Consumed<byte[], byte[]> consumed = Consumed.with(Serdes.ByteArray(), Serdes.ByteArray());
        var store = Materialized.<byte[], byte[]>as(Stores.inMemoryKeyValueStore("view"))
            .withKeySerde(Serdes.ByteArray()).withValueSerde(Serdes.ByteArray());
        if (global) {
            builder.globalTable(topic, consumed, store);
        } else {
            builder.table(topic, consumed, store);
        }
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch running = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) running.countDown();
        });
        streams.start();
        if (!running.await(60, TimeUnit.SECONDS)) {
            System.out.println("not running after 60 s: " + streams.state());
            System.exit(1);
        }
        System.out.println("running");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        HexFormat hex = HexFormat.of();
        while (in.readLine() != null) {
            ReadOnlyKeyValueStore<byte[], byte[]> view =
                streams.store(StoreQueryParameters.fromNameAndType("view", QueryableStoreTypes.keyValueStore()));
            TreeMap<String, String> out = new TreeMap<>();
            try (KeyValueIterator<byte[], byte[]> all = view.all()) {
                while (all.hasNext()) {
                    KeyValue<byte[], byte[]> kv = all.next();
                    out.put(hex.formatHex(kv.key), kv.value == null ? null : hex.formatHex(kv.value));
                }
            }
            StringBuilder line = new StringBuilder("{");
            for (var e : out.entrySet()) {
                if (line.length() > 1) line.append(',');
                line.append('"').append(e.getKey()).append("\":\"").append(e.getValue()).append('"');
            }
            System.out.println(line.append('}'));
            System.out.flush();
        }
        streams.close(Duration.ofSeconds(30));
        System.exit(0);
    }
}
