"""Local Apache Kafka, Redis, Redis Cluster and Prometheus processes on loopback, shared by the tests, `compactd
demo` and the benchmarks: Kafka's KRaft nodes from the jars of `jvm/pom.xml`, the servers from the machine's
binaries."""
