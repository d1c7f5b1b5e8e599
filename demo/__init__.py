"""The local Apache Kafka, Redis and Prometheus launchers (jars from `jvm/pom.xml`), shared by the tests, the demo and
the benchmarks, and `compactd demo`."""
