"""Only what runs in or drives Spark: the session, Spark's Kafka connector, compactd's Java decoders, the fast path and
the reference reduction, the query and its checkpoint."""
