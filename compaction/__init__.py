"""The compaction service (Pulsar-style two-phase compaction into a view topic): its pure rules live here."""
