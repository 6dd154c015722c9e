"""agent-trainer: an agent LLM learns, by reinforcement learning, to post-train smaller models.

Rooms (docs/architecture.md): ``commands`` (the at-* commands) -> ``outer_loop`` (the agent and its RL)
-> ``inner_loop`` (one training job) -> ``evaluation`` (hidden sets, scoring) -> the base modules here
(config schemas, CLI plumbing, registries, paths, prices, tracking).
"""

__version__ = "0.1.0"
