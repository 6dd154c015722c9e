"""The agent's RL objective, top-down: a step's episodes become samples with group-relative advantages, and the
update minimises a clipped, importance-weighted policy gradient plus a KL term over the agent's own tokens.

    J = 1/T sum_e sum_{t in e} min(rho_t A_e, clip(rho_t, 1 - eps, 1 + eps_high) A_e) - beta KL_t
    rho_t = exp(log pi(y_t) - log mu(y_t))       mu: the sampler, its log-probs recorded at sampling time
    A_e   = R_e - mean_group(R)  [/ std]          KL_t = exp(ref_t - new_t) - (ref_t - new_t) - 1  (k3)

Every setting: docs/outer_loop.md, "The update, precisely". How the log-probs are computed within memory
(a shared prefix run once, the LM head in chunks) is ``logprobs``'; the Lightning step that calls ``clipped_loss``
is ``policy.PolicyModule``.

    samples = turn_samples(results, tasks, OuterConfig(), version=0)
    loss, stats = clipped_loss(new_logprobs, collate(samples, pad_id), OuterConfig())
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from agent_trainer.config import OuterConfig


@dataclass
class TurnSample:
    """One agent turn: the context it saw, the tokens it sampled, and how they were sampled."""

    context_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]        # sampler log-probs of completion_ids, at ``temperature``
    advantage: float
    temperature: float = 1.0
    policy_version: int = 0
    episode_id: str = ""
    weight: float = 1.0              # per-token weight (1 / episode tokens with loss_aggregation="episode")
    # Which completion tokens are the agent's (1) and which are context in between (0): a merged
    # episode (``merge_turns``) carries tool results between its turns. None = all of them.
    completion_mask: list[int] | None = None
    # ``focus_top_frac`` < 1: which agent tokens the policy-gradient term covers (1) and its per-token
    # weight there; the KL term still covers every agent token. None = all agent tokens, ``weight``.
    focus_mask: list[int] | None = None
    focus_weight: float | None = None

    @property
    def n_targets(self) -> int:
        """Agent tokens the loss covers."""
        return len(self.completion_ids) if self.completion_mask is None else sum(self.completion_mask)

    @property
    def n_focus(self) -> int:
        """Agent tokens the policy-gradient term covers."""
        return self.n_targets if self.focus_mask is None else sum(self.focus_mask)

    @property
    def pg_weight(self) -> float:
        return self.weight if self.focus_weight is None else self.focus_weight


def turn_samples(results: list, tasks: list, policy: OuterConfig, version: int) -> list[TurnSample]:
    """The update's samples of a step's episodes (``EpisodeResult``), with group-relative advantages (one group
    per task); each episode's turns merged into as few sequences as its contexts allow. An episode whose job the
    machine failed (``reward["excluded"]``: the wall-clock safety cap) is left out of its group and of the update."""
    out: list[TurnSample] = []
    for task in tasks:
        group = [r for r in results if r.task == task.name and not r.reward.get("excluded")]
        adv = group_advantages([r.reward["total"] for r in group], policy.scale_by_std)
        for r, a in zip(group, adv):
            n_tokens = sum(len(t.completion_ids) for t in r.turns)
            weight = 1.0 / n_tokens if policy.loss_aggregation == "episode" and n_tokens else 1.0
            temperature = r.turns[0].temperature if r.turns else 1.0
            turns = [(t.prompt_ids, t.completion_ids, t.logprobs) for t in r.turns]
            for ctx, comp, lps, mask in merge_turns(turns):
                out.append(TurnSample(ctx, comp, lps, a, temperature, version, r.episode_id, weight,
                                      completion_mask=mask))
    return out


def group_advantages(rewards: Sequence[float], scale_by_std: bool = False) -> list[float]:
    """A_i = r_i - mean(r), optionally divided by the group's std (plus 1e-6)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    adv = [r - mean for r in rewards]
    if scale_by_std:
        std = math.sqrt(sum(a * a for a in adv) / len(adv))
        adv = [a / (std + 1e-6) for a in adv]
    return adv


def merge_turns(turns: Sequence[tuple[list[int], list[int], list[float]]]
                ) -> list[tuple[list[int], list[int], list[float], list[int]]]:
    """Fold an episode's turns into as few sequences as possible: ``(context, completion, logprobs, mask)``.

    Turn k+1's prompt is turn k's prompt and completion plus the tool result (the chat template re-renders the
    conversation), so one forward pass over the last turn's sequence scores every turn's tokens in the very context
    they were sampled in: the same objective as one sample per turn at a fraction of the update's compute. When a
    re-rendered prompt does not start with the sampled tokens (BPE can re-tokenize a completion differently: ~1
    turn in 20 here), a new sequence starts there."""
    out: list[tuple[list[int], list[int], list[float], list[int]]] = []
    ctx: list[int] = []
    comp: list[int] = []
    lps: list[float] = []
    mask: list[int] = []
    for prompt, tokens, logprobs in turns:
        seq = ctx + comp
        if comp and len(prompt) >= len(seq) and prompt[: len(seq)] == seq:
            gap = list(prompt[len(seq):])
            comp += gap + list(tokens)
            lps += [0.0] * len(gap) + list(logprobs)
            mask += [0] * len(gap) + [1] * len(tokens)
            continue
        if comp:
            out.append((ctx, comp, lps, mask))
        ctx, comp, lps, mask = list(prompt), list(tokens), list(logprobs), [1] * len(tokens)
    if comp:
        out.append((ctx, comp, lps, mask))
    return out


def mix_replay(kept: list[TurnSample], fresh: list[TurnSample], version: int, limit: int
               ) -> tuple[list[TurnSample], list[TurnSample]]:
    """``(used, kept)``: this update's samples (``fresh`` plus the kept ones at most ``limit`` updates old at policy
    ``version``) and those to keep for the next update. The kept ones enter the clipped objective with their own
    sampler log-probs, so the importance ratio corrects for the policy having moved since."""
    old = [s for s in kept if version - s.policy_version <= limit] if limit > 0 else []
    return fresh + old, [s for s in old + fresh if version + 1 - s.policy_version <= limit]


def clipped_loss(new: torch.Tensor, batch: dict[str, torch.Tensor], cfg: OuterConfig, ref: torch.Tensor | None = None,
                 norm: float | None = None, pg_norm: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """(the loss, its statistics) of a micro-batch (``logprobs.collate``): ``new`` and ``ref`` are the policy's
    and the reference's (adapter disabled; needed when ``cfg.kl_beta`` > 0) log-probs at each position.

    ``norm`` and ``pg_norm`` are the whole step's token weights (all agent tokens; the policy-gradient tokens):
    micro-batches of one step share them, so their losses add up to the step's objective and a micro-batch that
    holds one bad episode cannot move the policy on its own. None: this micro-batch's own."""
    mask = batch["loss_mask"]
    adv = batch["advantages"].view(-1, 1)
    ratio = torch.exp((new - batch["old_logprobs"]) * mask)
    high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + high) * adv)
    kl = torch.zeros_like(new)
    if cfg.kl_beta > 0:
        delta = ref - new
        kl = torch.exp(delta) - delta - 1
    weighted = mask * batch["weights"].view(-1, 1)    # all ones with token aggregation
    pg_weighted = batch["focus_mask"] * batch["focus_weights"].view(-1, 1)   # = weighted without focus
    norm = norm if norm is not None else weighted.sum().clamp(min=1e-12)
    pg_norm = pg_norm if pg_norm is not None else pg_weighted.sum().clamp(min=1e-12)
    loss = (-surrogate * pg_weighted).sum() / pg_norm + cfg.kl_beta * (kl * weighted).sum() / norm
    with torch.no_grad():
        n_tokens = mask.sum().clamp(min=1.0)
        clipped = ((ratio - 1).abs() > cfg.clip_eps).float()
        stats = {"loss": loss.item(), "ratio_mean": ((ratio * mask).sum() / n_tokens).item(),
                 "clip_frac": ((clipped * mask).sum() / n_tokens).item(),
                 "kl": ((kl * mask).sum() / n_tokens).item(), "tokens": n_tokens.item()}
    return loss, stats
