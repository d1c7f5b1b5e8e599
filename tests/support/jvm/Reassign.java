// A partition reassignment (AlterPartitionReassignments), which librdkafka does not offer: moves each partition named to
// the replicas given, waits until the cluster lists no reassignment of the topic in progress, and prints "done".
// Run as a single-file program:
// java -cp <kafka jars> Reassign.java BOOTSTRAP TOPIC PARTITION=NODE,NODE[,NODE] [PARTITION=...]

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.common.TopicPartition;

public class Reassign {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        Map<TopicPartition, Optional<NewPartitionReassignment>> moves = new HashMap<>();
        for (int i = 2; i < args.length; i++) {
            String[] f = args[i].split("=");
            List<Integer> replicas = new ArrayList<>();
            for (String node : f[1].split(",")) {
                replicas.add(Integer.parseInt(node));
            }
            moves.put(new TopicPartition(args[1], Integer.parseInt(f[0])),
                Optional.of(new NewPartitionReassignment(replicas)));
        }
        try (Admin admin = Admin.create(props)) {
            admin.alterPartitionReassignments(moves).all().get(60, TimeUnit.SECONDS);
            long deadline = System.currentTimeMillis() + 120_000;
            while (!admin.listPartitionReassignments(moves.keySet()).reassignments().get(30, TimeUnit.SECONDS)
                    .isEmpty()) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("the reassignment did not complete within 120 s");
                }
                Thread.sleep(200);
            }
        }
        System.out.println("done");
    }
}
