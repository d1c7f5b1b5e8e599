"""The controller: merge, plan, apply and dispatch under one lock, with the send-time checks against the cluster (topic
identity, group offsets, readers) and the config events. It reaches the compaction service only through the view caps
it reads (`ViewCapReader`, control/controller.py)."""
