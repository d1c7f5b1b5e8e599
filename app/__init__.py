"""The command line, the running service (the composition root, the run loop, the delete gate) and `explain`."""
