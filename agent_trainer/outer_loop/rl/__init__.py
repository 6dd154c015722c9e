"""at-train's reinforcement learning: rollouts, the policy and its update, the run's settings from the config,
held-out evaluation."""
