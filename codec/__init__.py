"""Input formats, each a reference decoder record by record that names its DLQ reasons (the fast paths are Java, in
streaming/jvm): the JSON events, the binary `__consumer_offsets` records, config events, share-group state."""
