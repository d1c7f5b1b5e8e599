// A Kafka Streams application that has been assigned its topic and has committed nothing: a streams group (KIP-1071)
// backfilling from `earliest` before its first commit (commit.interval.ms one hour). Prints "assigned" once it runs
// with an active task, then runs until its standard input closes, and halts without the commit a close makes.
// Run as a single-file program: java -cp <kafka jars> StreamsAssigned.java BOOTSTRAP APPLICATION_ID TOPIC

import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.ThreadMetadata;

public class StreamsAssigned {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 3_600_000);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArray().getClass());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArray().getClass());
        props.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/streams-" + args[1]);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        StreamsBuilder builder = new StreamsBuilder();
        builder.<byte[], byte[]>stream(args[2]).foreach((k, v) -> {});
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.start();
        long deadline = System.currentTimeMillis() + 60_000;
        while (System.currentTimeMillis() < deadline) {
            boolean assigned = streams.state() == KafkaStreams.State.RUNNING && streams.metadataForLocalThreads().stream()
                .anyMatch(t -> !t.activeTasks().isEmpty());
            if (assigned) break;
            Thread.sleep(100);
        }
        System.out.println(System.currentTimeMillis() < deadline ? "assigned" : "never assigned");
        System.out.flush();
        while (System.in.read() >= 0) {}
        Runtime.getRuntime().halt(0);
    }
}
