"""Self-generated training data: the model's own samples, scored by a reward, kept or paired.

    rewards = ranking_rewards(spec, job_dir, family="calc_chain")   # the job's reward, else the family's
    rows, stats = rejection_sample(model, tokenizer, items, source.self_generated, rewards, seed=0)
    pairs, stats = preference_pairs(model, tokenizer, prompt_rows, spec.hyperparameters, rewards, seed=0)

Runs the job's reward code: call it in the job's own process (``agent_trainer.inner_loop.train.stages``), never in
the harness. The rules: docs/jobs.md, "Strategy space".
"""

from __future__ import annotations

import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from agent_trainer.evaluation.families import FAMILIES

Rewards = Sequence[tuple[str, Callable, float]]
PROMPTS_PER_BATCH = 64
# Partial credit added to task_score when the job has no reward of its own, by the family's scorer.
_PARTIAL = {"numeric": "numeric_closeness", "exact": "token_overlap"}


class SelfGenError(ValueError):
    """Sampling gave nothing to train on; the message says what to change in job.yaml."""


@dataclass
class GenStats:
    """What one generation pass did (written to the stage's ``generation.json``)."""

    kind: str  # "rejection_sampling" | "preference_pairs"
    prompts: int = 0
    samples: int = 0
    kept: int = 0  # rows kept (rejection sampling) or pairs made (preference pairs)
    seconds: float = 0.0
    stopped_early: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        what = "rows" if self.kind == "rejection_sampling" else "pairs"
        cut = " (stopped at half the stage's time budget)" if self.stopped_early else ""
        per = self.samples // max(1, self.prompts)
        return f"self-generated {self.kept} {what} from {self.prompts} prompts x {per} samples in " \
               f"{self.seconds:.1f} s{cut}"


def default_reward_spec(family: str):
    """The family's reward (a ``RewardSpec`` of library functions): task_score plus partial credit."""
    from agent_trainer.inner_loop.spec.jobspec import RewardSpec

    funcs = [{"name": "task_score", "weight": 1.0}]
    partial = _PARTIAL.get(FAMILIES[family].scorer) if family in FAMILIES else None
    if partial:
        funcs.append({"name": partial, "weight": 1.0})
    return RewardSpec.model_validate({"functions": funcs})


def ranking_rewards(spec, job_dir: str | Path, family: str) -> list[tuple[str, Callable, float]]:
    """``(name, callable, weight)`` that accept (rejection sampling) or rank (DPO) samples.

    The job's reward when it has one, else the family's (``default_reward_spec``)."""
    from agent_trainer.inner_loop.train.rewards import resolve_rewards

    return resolve_rewards(spec.reward if spec.reward is not None else default_reward_spec(family), job_dir)


def sample(model, tokenizer, prompts: list[str], k: int, max_new_tokens: int, temperature: float, seed: int,
           deadline: float | None = None) -> tuple[list[list[tuple[str, bool]]], bool]:
    """``k`` samples per prompt as ``(text, ended)`` (``ended``: eos within the limit), and whether time ran out.

    Prompts are fed exactly as written (no special tokens), left-padded, in batches; sampling is
    plain (``top_k=0, top_p=1``) at ``temperature``. When ``deadline`` (``time.monotonic()``) passes,
    the prompts not yet sampled get no samples.
    """
    import torch

    was_training = model.training
    model.eval()
    torch.manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    out: list[list[tuple[str, bool]]] = []
    try:
        for start in range(0, len(prompts), PROMPTS_PER_BATCH):
            if deadline is not None and time.monotonic() > deadline:
                return out, True
            batch = prompts[start:start + PROMPTS_PER_BATCH]
            enc = tokenizer(batch, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
            with torch.no_grad():
                seqs = model.generate(**enc.to(model.device), do_sample=True, temperature=temperature, top_k=0,
                                      top_p=1.0, num_return_sequences=k, max_new_tokens=max_new_tokens,
                                      pad_token_id=pad, eos_token_id=eos)
            width = enc["input_ids"].shape[1]
            for i in range(len(batch)):
                group = []
                for seq in seqs[i * k:(i + 1) * k]:
                    ids = seq[width:].tolist()
                    ended = eos in ids
                    if ended:
                        ids = ids[:ids.index(eos)]
                    ids = [t for t in ids if t != pad]
                    group.append((tokenizer.decode(ids, skip_special_tokens=True), ended))
                out.append(group)
    finally:
        model.train(was_training)
    return out, False


def score(rewards: Rewards, rows: list[dict], samples: list[list[str]], max_steps: int = 1) -> list[list[float]]:
    """Weighted reward of every sample (``None`` counts 0, as in TRL); ``rows[i]``'s columns reach the rewards."""
    flat_rows = [r for r, group in zip(rows, samples) for _ in group]
    completions = [c for group in samples for c in group]
    if not completions:
        return [[] for _ in samples]
    columns = {k: [r.get(k) for r in flat_rows] for k in flat_rows[0] if k != "prompt"}
    state = types.SimpleNamespace(global_step=0, max_steps=max_steps, epoch=0.0)
    totals = [0.0] * len(completions)
    for _, fn, weight in rewards:
        values = fn(prompts=[r["prompt"] for r in flat_rows], completions=completions, completion_ids=None,
                    trainer_state=state, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None, **columns)
        totals = [t + weight * (v or 0.0) for t, v in zip(totals, values)]
    out, pos = [], 0
    for group in samples:
        out.append(totals[pos:pos + len(group)])
        pos += len(group)
    return out


def _sample_and_score(model, tokenizer, rows: list[dict], n: int, max_len: int, temperature: float, seed: int,
                      deadline: float | None, rewards: Rewards, stats: GenStats, max_steps: int = 1):
    """``n`` samples of each row's prompt, scored: ``(rows that got samples, groups of (text, ended), totals)``;
    fills ``stats``' prompt, sample and stopped-early counts."""
    groups, stats.stopped_early = sample(model, tokenizer, [r["prompt"] for r in rows], n, max_len, temperature,
                                         seed, deadline)
    rows = rows[:len(groups)]
    totals = score(rewards, rows, [[t for t, _ in g] for g in groups], max_steps=max_steps)
    stats.prompts, stats.samples = len(groups), sum(map(len, groups))
    return rows, groups, totals


def rejection_sample(model, tokenizer, items: list[dict], cfg, rewards: Rewards, seed: int,
                     deadline: float | None = None) -> tuple[list[dict], GenStats]:
    """SFT rows from the model's accepted samples of ``items`` (``cfg``: a ``SelfGenerated`` block)."""
    t0 = time.monotonic()
    stats = GenStats("rejection_sampling")
    items, groups, totals = _sample_and_score(model, tokenizer, items, cfg.samples_per_prompt,
                                              cfg.max_completion_length, cfg.temperature, seed, deadline, rewards,
                                              stats)
    kept: list[dict] = []
    for row, group, values in zip(items, groups, totals):
        seen: set[str] = set()
        for (text, ended), value in zip(group, values):
            if ended and text.strip() and value >= cfg.min_reward and text not in seen:
                seen.add(text)
                kept.append({"prompt": row["prompt"], "answer": text, "family": row.get("family")})
    stats.kept, stats.seconds = len(kept), round(time.monotonic() - t0, 3)
    return kept, stats


def preference_pairs(model, tokenizer, rows: list[dict], hp, rewards: Rewards, seed: int,
                     deadline: float | None = None) -> tuple[list[dict], GenStats]:
    """DPO rows ``{prompt, chosen, rejected, answer, family}``: each prompt's (best, worst) samples, if they differ."""
    t0 = time.monotonic()
    stats = GenStats("preference_pairs")
    rows, groups, totals = _sample_and_score(model, tokenizer, rows, hp.num_generations, hp.max_completion_length,
                                             hp.temperature, seed, deadline, rewards, stats, max_steps=hp.max_steps)
    texts = [[t for t, _ in g] for g in groups]
    pairs = []
    for row, group, values in zip(rows, texts, totals):
        best = max(range(len(values)), key=lambda j: (values[j], -j))
        worst = min(range(len(values)), key=lambda j: (values[j], j))
        if values[best] > values[worst] and group[best] != group[worst]:
            pairs.append({"prompt": row["prompt"], "chosen": group[best], "rejected": group[worst],
                          "answer": row.get("answer"), "family": row.get("family")})
    stats.kept, stats.seconds = len(pairs), round(time.monotonic() - t0, 3)
    return pairs, stats
