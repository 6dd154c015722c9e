"""The plain clipped update, for tests of the update's machinery (micro-batches, shared prefixes, gradients).

One epoch over every agent token, the token mean, no KL term, one clip both ways: the recipes' choices (the schema's
defaults, ``agent_trainer.config.OuterConfig``) are tested through at-train; these tests pin what they compare.

    policy = AgentPolicy(model, tokenizer, plain_update(lr=1e-2, micro_batch_size=4))
"""

from __future__ import annotations

from agent_trainer.config import OuterConfig

PLAIN = {"lr": 1e-4, "epochs": 1, "kl_beta": 0.0, "focus_top_frac": 1.0, "loss_aggregation": "token",
         "scale_by_std": False, "clip_eps_high": None}


def plain_update(**changes) -> OuterConfig:
    """The outer group's settings of the plain update, with ``changes``."""
    return OuterConfig(**{**PLAIN, **changes})
