"""The compaction service (Pulsar-style two-phase compaction into a view topic): its pure rules, the runs, and the
trigger that starts them inside the job and writes the views' caps on source deletes for the controller."""
