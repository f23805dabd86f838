"""One run of one task: sandbox, agent, check, and the typed events between them."""
