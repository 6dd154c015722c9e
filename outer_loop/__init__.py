"""The agent: backends, workspace and tools, episodes, ledger, policy module, training loop."""
