"""The daemon `compactd run` runs: the composition root that wires Redis, the Kafka clients, the sinks, the controller
and the Spark job (`application`), the stream's batches and stops (`run_loop`), the delete gate (`gate`), the
source's lost records (`source_loss`) and the evaluation slices' Spark task (`slice_task`)."""
