"""The agent and its training: agents (backends, models), episode (tools, workspace, ledger), rl (the policy
and its update), strategy (protocol, steering, evaluator, journal, fork) and report (comparisons, plots)."""
