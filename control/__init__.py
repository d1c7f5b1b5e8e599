"""The controller: merge, plan, apply and dispatch under one lock, with the send-time checks against the cluster (topic
identity, group offsets, readers), the config events, the compaction trigger."""
