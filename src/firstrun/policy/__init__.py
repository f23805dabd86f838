"""Policy as plain data, and the pure decisions made over it (stdlib only, no I/O)."""
