// Records with the timestamps the caller gives, 0 included: librdkafka (confluent-kafka) reads a timestamp of 0 as
// "the time of sending", Kafka's Java producer writes it as is. Reads lines "PARTITION KEY VALUE TIMESTAMP" from
// stdin and sends them in order, then prints each record's offset. Run as a single-file program:
// java -cp <kafka jars> StampedProducer.java BOOTSTRAP TOPIC

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class StampedProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            String line;
            while ((line = in.readLine()) != null) {
                String[] f = line.trim().split(" ");
                if (f.length != 4) {
                    continue;
                }
                ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(args[1], Integer.parseInt(f[0]),
                    Long.parseLong(f[3]), f[1].getBytes(StandardCharsets.UTF_8), f[2].getBytes(StandardCharsets.UTF_8));
                RecordMetadata meta = producer.send(rec).get();
                System.out.println(meta.offset());
            }
        }
    }
}
