"""Kafka plumbing every stage shares: the one builder of librdkafka settings, the clients made off librdkafka's threads,
topic and group reads (IDs, watermarks, committed offsets), the JSON topic writer."""
