"""Pure decisions over numpy arrays, one row per partition (one partition is an array of one): the rules, one
partition's plan and its action record, thresholds and scopes, the readers, the throttle."""
