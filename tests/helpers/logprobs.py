"""The update's reference computation for tests: the full-vocabulary log-softmax at every position, and the loss
and gradients of one ``PolicyModule.training_step`` under a given log-prob function."""

from __future__ import annotations

import torch


def full_logprobs(model, batch):
    """The LM head and a log-softmax over every position, then the sampled token's entry (pos 0 = 0)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    logits = logits.float() / batch["temperature"].view(-1, 1, 1)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))


def loss_and_grads(policy, batch, logprobs_fn, monkeypatch):
    """One training step's loss and the LoRA gradients, with ``policy.token_logprobs`` replaced by ``logprobs_fn``."""
    import agent_trainer.outer_loop.rl.policy as policy_mod

    monkeypatch.setattr(policy_mod, "token_logprobs", logprobs_fn)
    policy.model.train()
    policy.model.zero_grad()
    loss = policy.module.training_step(batch, 0)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}
