"""compactd: bounded compaction lag (KIP-354) and consumed retention (KIP-68) for Kafka, as a Spark job.

This root package holds what every layer may import and no stage owns: the plain types every stage shares (model,
errors, keys, labels, clock), the settings, and two helpers with no stage of their own, the fetch of a pom's jars from
Maven Central (maven: the job's connector, the test broker's Kafka) and the collector's pause around a batch
(gc_pause). The stages live in subpackages named after the data path (kafka, codec, streaming, state, policy,
control, sinks, compaction, agent), with the running service (daemon), explain, the local servers (local) and the
command line (app) above them; docs/architecture.md maps them.
"""

__version__ = "0.1.0"
