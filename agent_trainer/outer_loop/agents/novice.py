"""A scripted, randomized novice policy: the teacher of the tiny agent's warm start.

It works like a beginner with a broad, imperfect prior: it mostly picks the small base model, draws hyperparameters from
wide ranges (often poor ones), writes an invalid ``job.yaml`` a fair share of the time, fixes it only sometimes, and
submits. Its transcripts (through the real tools) are what the tiny agent is supervised on, so the agent
starts out writing real jobs of mixed quality and reinforcement learning has something to learn.

    >>> script = novice_episode(task, random.Random(0))
    >>> call = next(script)                 # {"name": ..., "arguments": {...}}
    >>> call = script.send(tool_result)     # feed back each tool's result
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Generator

import yaml

# The prior. Each list is sampled uniformly unless a weight is given.
BASE_MODEL_PRIOR = {"tiny-s": 0.8, "tiny-m": 0.2}
ALGORITHM_PRIOR = {"sft": 0.5, "grpo": 0.5}
LORA_PROB = 0.4
LEARNING_RATES = [1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 3e-3]
MAX_STEPS = [20, 50, 100, 150]
SFT_BATCH = [16, 32, 64]
GRPO_SHAPES = [(32, 8), (64, 8), (32, 4)]  # (batch_size, num_generations)
DATA_SIZES = [500, 1000, 2000]
# Baselines are not looked up by default: a baseline needs the inner models trained, so transcripts with
# lookups made the agent's warm start wait for tiny-m's build (the critical path of at-models: 4m26s
# against ~2.5 min without the wait), and a 167K-parameter imitator cannot act on the number anyway.
LOOKUP_PROB = 0.0
INVALID_PROB = 0.5
FIX_PROB = 0.35

# Ways a novice gets a job wrong; each is a function of the job dict that breaks it.
MISTAKES = ("typo_key", "one_generation", "indivisible_batch", "too_many_steps", "unknown_reward", "bad_model")


@dataclass
class Call:
    """A tool call as the agent emits it."""

    name: str
    arguments: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


def _pick(rng: random.Random, prior: dict[str, float]) -> str:
    return rng.choices(list(prior), weights=list(prior.values()))[0]


def default_rewards(family_scorer: str) -> list[str]:
    """Library rewards that fit a family's scorer."""
    if family_scorer == "numeric":
        return ["numeric_closeness", "exact_match"]
    if family_scorer == "label":
        return ["label_match"]
    return ["token_overlap", "exact_match"]


def sample_job(task, rng: random.Random) -> dict[str, Any]:
    """A valid job for ``task`` drawn from the novice prior."""
    from agent_trainer.evaluation.families import get_family

    family = get_family(task.family)
    allowed = [m for m in BASE_MODEL_PRIOR if m in task.allowed_base_models] or list(task.allowed_base_models)
    prior = {m: BASE_MODEL_PRIOR.get(m, 0.1) for m in allowed}
    algorithm = _pick(rng, ALGORITHM_PRIOR)
    steps = [s for s in MAX_STEPS if s <= task.budget.max_steps] or [task.budget.max_steps]
    job: dict[str, Any] = {"base_model": _pick(rng, prior), "algorithm": algorithm}
    if rng.random() < LORA_PROB:
        job["peft"] = {"r": rng.choice([8, 16]), "alpha": rng.choice([16, 32])}
    hp: dict[str, Any] = {"learning_rate": rng.choice(LEARNING_RATES), "max_steps": rng.choice(steps)}
    if algorithm == "grpo":
        batch, gens = rng.choice(GRPO_SHAPES)
        hp.update(batch_size=batch, num_generations=gens, max_completion_length=family.max_new_tokens + 2)
    else:
        hp["batch_size"] = rng.choice(SFT_BATCH)
    job["hyperparameters"] = hp
    # Few keys (seeds and reward weights keep their defaults): short jobs are what a tiny agent can
    # write reliably, and identical jobs repeat, so the job cache serves repeats instead of retraining.
    # The source names no family: it is the task's own, so the job reads the same on every task and what
    # the agent learns about it carries over to families it has never seen.
    job["data"] = {"sources": [{"size": rng.choice(DATA_SIZES)}]}
    if algorithm == "grpo":
        names = default_rewards(family.scorer)
        if len(names) > 1 and rng.random() < 0.5:
            names = names[-1:]  # exact only: too sparse a reward, a classic novice choice
        job["reward"] = {"functions": [{"name": n} for n in names]}
    return job


def break_job(job: dict[str, Any], mistake: str, task) -> dict[str, Any]:
    """A copy of ``job`` with one novice mistake in it."""
    bad = json.loads(json.dumps(job))  # a deep copy that keeps the key order
    hp = bad["hyperparameters"]
    if mistake == "typo_key":
        hp["learning_rte"] = hp.pop("learning_rate")
    elif mistake == "one_generation":
        bad["algorithm"] = "grpo"
        hp.update(num_generations=1)
        bad.setdefault("reward", {"functions": [{"name": "exact_match"}]})
    elif mistake == "indivisible_batch":
        bad["algorithm"] = "grpo"
        hp.update(batch_size=30, num_generations=8)
        bad.setdefault("reward", {"functions": [{"name": "exact_match"}]})
    elif mistake == "too_many_steps":
        hp["max_steps"] = task.budget.max_steps * 10
    elif mistake == "unknown_reward":
        bad["algorithm"] = "grpo"
        hp.setdefault("num_generations", 8)
        hp["batch_size"] = 64
        bad["reward"] = {"functions": [{"name": "accuracy"}]}
    elif mistake == "bad_model":
        bad["base_model"] = "qwen3-70b"
    return bad


def _flow(value: Any) -> str:
    """A YAML flow-style rendering; small floats as ``5.0e-4`` (one mantissa digit, one exponent digit:
    what a learning rate is chosen by, in few tokens)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, float) and 0 < abs(value) < 0.01:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return text[: -len("\n...")].strip() if text.endswith("\n...") else text


def render_job(job: dict[str, Any]) -> str:
    """``job.yaml`` text as the novice writes it: one line per top-level key, nested values as YAML flow
    mappings (``peft: {r: 8, alpha: 16}``), about half the tokens of block style. ``reward`` follows
    ``algorithm`` (GRPO needs one: a short-range dependency is one a tiny model gets right)."""
    order = ["base_model", "algorithm", "reward"] + [k for k in job if k not in ("base_model", "algorithm", "reward")]
    return "".join(f"{k}: {_flow(job[k])}\n" for k in order if k in job)


def novice_episode(task, rng: random.Random, job_path: str = "job.yaml",
                   lookup_prob: float = LOOKUP_PROB) -> Generator[dict, Any, None]:
    """Yield tool calls for one episode on ``task``; send each call's result back in."""
    if rng.random() < lookup_prob:
        model = _pick(rng, {m: BASE_MODEL_PRIOR.get(m, 0.1) for m in task.allowed_base_models})
        yield Call("lookup_baseline", {"model": model, "family": task.family}).as_dict()
    job = sample_job(task, rng)
    written = break_job(job, rng.choice(MISTAKES), task) if rng.random() < INVALID_PROB else job
    yield Call("write_file", {"path": job_path, "content": render_job(written)}).as_dict()
    result = yield Call("validate_job", {"path": job_path}).as_dict()
    retries = 0
    while not _ok(result) and retries < 2 and rng.random() < FIX_PROB:
        retries += 1
        yield Call("write_file", {"path": job_path, "content": render_job(job)}).as_dict()
        result = yield Call("validate_job", {"path": job_path}).as_dict()
    yield Call("submit_job", {"path": job_path}).as_dict()


def _ok(result: Any) -> bool:
    """Whether a validate_job tool result says the job is valid (ToolResult or dict)."""
    if result is None:
        return False
    data = getattr(result, "data", None) if not isinstance(result, dict) else result.get("data", result)
    if isinstance(data, dict) and "ok" in data:
        return bool(data["ok"])
    return bool(getattr(result, "ok", False))
