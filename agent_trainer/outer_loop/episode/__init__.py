"""One agent on one task: the episode loop, its tools, its workspace and the cost ledger."""
