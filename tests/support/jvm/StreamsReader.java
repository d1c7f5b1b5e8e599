// A Kafka Streams application as the tests need one: a streams group (KIP-1071, group.protocol=streams) whose
// application id is the group, reading a topic from its start and committing its position, then stopping once it
// has read `upto` records. Stateless (no RocksDB). Run as a single-file program: java -cp <kafka jars> StreamsReader.java
// BOOTSTRAP APPLICATION_ID TOPIC UPTO

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;

public class StreamsReader {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArray().getClass());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArray().getClass());
        props.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/streams-" + args[1]);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        props.put(StreamsConfig.consumerPrefix("max.poll.records"), Integer.parseInt(args[3]));
        long upto = Long.parseLong(args[3]);
        AtomicLong read = new AtomicLong();
        CountDownLatch done = new CountDownLatch(1);
        StreamsBuilder builder = new StreamsBuilder();
        builder.<byte[], byte[]>stream(args[2]).foreach((k, v) -> {
            if (read.incrementAndGet() >= upto) done.countDown();
        });
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.start();
        boolean finished = done.await(60, TimeUnit.SECONDS);
        Thread.sleep(300); // a commit interval and more: the position is committed before the close commits again
        streams.close(Duration.ofSeconds(30));
        System.out.println(finished ? "read " + read.get() : "timed out at " + read.get());
        System.exit(finished ? 0 : 1);
    }
}
