"""The segment agents: one beside a broker reading its log dirs, one polling the Admin API where compactd is only a
client; neither imports Redis, Spark nor Prometheus."""
