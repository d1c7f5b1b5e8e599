"""compactd: bounded compaction lag (KIP-354) and consumed retention (KIP-68) for Kafka, as a Spark job.

This root package holds only the plain types every stage shares (model, errors, keys, clock, metrics); the
stages live in subpackages named after the data path: kafka, codec, streaming, state, policy, control, sinks.
"""

__version__ = "0.1.0"
