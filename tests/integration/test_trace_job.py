"""A job's trace (``agent_trainer.trace``) on a random-init tiny Qwen3: a GRPO job run twice through the worker
process traces the same, a run with another learning rate parts at step 1's update, and one weight moved by one
unit in the last place after step 2 (in-process) is named at step 2, equal at the coarser precisions.

    .venv/bin/python -m pytest tests/integration/test_trace_job.py -q        (~1 min on 2 cores)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainerCallback

from agent_trainer import trace
from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.run.job import run_job
from agent_trainer.inner_loop.spec.cost import CostModel

pytestmark = pytest.mark.slow

STEPS = 3
FAST_COSTS = CostModel(startup_s=0.0, grpo_step_s=1e-4, grpo_token_s=0.0, sft_step_s=1e-4, sft_sequence_s=0.0)
TASK = TaskSpec(name="calc_test", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                budget={"max_steps": 400, "max_seconds": 60, "max_usd": 0.05})
JOB = {"base_model": "tiny-s", "algorithm": "grpo", "peft": {"r": 4, "alpha": 8},
       "hyperparameters": {"learning_rate": 1e-2, "batch_size": 8, "num_generations": 4, "max_completion_length": 4,
                           "max_steps": STEPS},
       "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]},
       "reward": {"functions": [{"name": "length_penalty"}]}, "seed": 0}   # spread on a random model


def _traced_job(folder: Path, base_dir: Path, **hp) -> list[dict]:
    job = folder / "job"
    job.mkdir(parents=True)
    (job / "job.yaml").write_text(yaml.safe_dump({**JOB, "hyperparameters": {**JOB["hyperparameters"], **hp}}))
    res = run_job(job, TASK, model_dir=base_dir, cache_dir=folder / "cache", progress=False, cost_model=FAST_COSTS,
                  cache=False, warm_workers=False)
    assert res.status == "ok" and res.steps == STEPS, (res.status, res.detail, res.error)
    return trace.read(job / "output" / trace.TRACE_FILE)


def test_a_job_traces_the_same_twice_and_another_learning_rate_parts_at_step_1(base_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(trace.TRACE_ENV, "1")
    first, again = _traced_job(tmp_path / "a", base_dir), _traced_job(tmp_path / "b", base_dir)
    events = [r["event"] for r in first]
    assert events == ["trace", "start", *["step"] * STEPS, "end", "eval"]
    steps = [r for r in first if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all({"completions", "rewards", "loss", "grad_norm", "weights", "weights@1e-4"} <= set(r) for r in steps)
    assert first[-1]["n"] == 16 and len(first[-1]["answers"]) == 1
    assert len("\n".join(json.dumps(r) for r in first)) < 8_000, "small enough to paste"
    assert trace.compare(first, again) == []

    other = _traced_job(tmp_path / "c", base_dir, learning_rate=2e-2)
    lines = trace.compare(first, other)
    # step 1 sampled from the same start, so its completions, rewards, loss and gradient agree; its update does not
    assert lines[0].startswith("first difference: step 1, weights: exact apart"), lines
    assert any(line.startswith("then: step 2,") for line in lines), lines


class OneUlp(TrainerCallback):
    """Moves one trainable weight by one unit in the last place after step ``at`` (before the trace reads it)."""

    def __init__(self, at: int):
        self.at = at

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at:
            p = next(p for p in model.parameters() if p.requires_grad)
            with torch.no_grad():
                p.view(-1)[:1].view(torch.int32).add_(1)
        return control


def test_one_ulp_after_step_2_is_named_at_step_2(base_dir, tmp_path, monkeypatch):
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.inner_loop.spec.jobspec import JobSpec
    from agent_trainer.inner_loop.train.rewards import length_penalty
    from agent_trainer.inner_loop.train.train import train

    rows = [dict(ex.as_dict(), family="calc_chain") for ex in get_family("calc_chain").training_examples(seed=3, n=48)]
    monkeypatch.setenv(trace.TRACE_ENV, "1")
    spec = JobSpec.model_validate(JOB)
    rewards = [("length_penalty", length_penalty, 1.0)]
    for name, extra in (("plain", []), ("ulp", [OneUlp(2)])):
        report = train(spec, rows, rewards, base_dir, tmp_path / name, max_steps=STEPS, callbacks=extra)
        assert report.status == "ok" and report.steps == STEPS
    lines = trace.compare(trace.read(tmp_path / "plain" / trace.TRACE_FILE),
                          trace.read(tmp_path / "ulp" / trace.TRACE_FILE))
    assert lines[0].startswith("first difference: step 2, weights: exact apart, 1e-6 equal, 1e-4 equal"), lines
