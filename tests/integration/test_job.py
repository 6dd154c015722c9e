"""``run_job`` end to end through the worker process, on a random-init tiny Qwen3: every outcome
(ok, diverged, refused over its compute budget, killed at the safety cap, crashed, invalid, over_budget) writes
``result.json``, the agent's view never carries the hidden score, and the harness keeps going.

    .venv/bin/pytest tests/integration/test_job.py -q            (~1.5-2 min on 2 cores)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent_trainer.tracking import Tracker, read_metrics
from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.spec.cost import CostModel
from agent_trainer.inner_loop.run.job import RESULT_FILE, run_job

pytestmark = pytest.mark.slow

HIDDEN = ("hidden_score", "baseline", "uplift")
# Tiny estimates so that the validation's budget check passes for budgets of a few seconds.
FAST_COSTS = CostModel(startup_s=0.0, grpo_step_s=1e-4, grpo_token_s=0.0, sft_step_s=1e-4, sft_sequence_s=0.0)


def _task(max_seconds: float = 60, max_usd: float = 0.05) -> TaskSpec:
    return TaskSpec(name="calc_test", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                    budget={"max_steps": 400, "max_seconds": max_seconds, "max_usd": max_usd})


def _job(tmp_path: Path, hp: dict, algorithm: str = "sft", reward: dict | None = None, files: dict = {}) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    spec = {"base_model": "tiny-s", "algorithm": algorithm, "hyperparameters": {"batch_size": 8, **hp},
            "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]}, "seed": 0}
    if reward:
        spec["reward"] = reward
    (job / "job.yaml").write_text(yaml.safe_dump(spec))
    for name, text in files.items():
        (job / name).write_text(text)
    return job


def _run(job: Path, base_dir: Path, task: TaskSpec | None = None, **kw):
    res = run_job(job, task or _task(), model_dir=base_dir, cache_dir=job.parent / "cache", progress=False,
                  cost_model=FAST_COSTS, **{"cache": False, "warm_workers": False, **kw})
    on_disk = json.loads((job / "output" / RESULT_FILE).read_text())
    assert on_disk["status"] == res.status, "result.json is written for every outcome"
    assert not set(HIDDEN) & set(res.visible()), "the agent's view never has the hidden score"
    return res, on_disk


def test_ok_job_is_scored_logged_and_hides_the_hidden_score(base_dir, tmp_path):
    job = _job(tmp_path, {"learning_rate": 1e-3, "max_steps": 3})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with Tracker(uri, experiment="jobs", artifact_location=str(tmp_path / "artifacts")) as tracker:
        res, on_disk = _run(job, base_dir, tracker=tracker)
    assert res.status == "ok" and res.steps == 3 and res.algorithm == "sft+full"
    assert res.hidden_score is not None and res.baseline is not None
    assert res.uplift == pytest.approx(res.hidden_score - res.baseline)
    assert on_disk["seconds"]["total"] >= on_disk["seconds"]["process"] >= on_disk["seconds"]["train"] > 0
    # the speed stage's clock: the cost model's seconds for the 3 steps run, not the wall clock
    from agent_trainer.inner_loop.spec.cost import estimate_job
    from agent_trainer.inner_loop.spec.jobspec import load_job

    assert on_disk["seconds"]["train_estimated"] == estimate_job(load_job(job), FAST_COSTS, [3]).train_seconds(3)
    assert on_disk["device"] == "cpu"
    from agent_trainer.kernels import cpu_kind

    assert on_disk["cpu"] == cpu_kind(), "the job's process ran this process's kinds of kernels, and says so"
    assert "cpu" not in res.visible(), "never shown to the agent: what it reads does not depend on the machine"
    assert len(on_disk["job_hash"]) == 64 and on_disk["libraries"]["trl"] and on_disk["seed"] == 0
    assert [step for step, _ in res.visible()["loss_curve"]] == [1, 2, 3]
    assert (job / "output" / "model" / "model.safetensors").is_file()
    assert json.loads((job / "output" / "trl_config.json").read_text())["max_steps"] == 3
    metrics = read_metrics(uri, tracker.run_id, ["train/loss", "job/hidden_score"])
    assert [s for s, _ in metrics["train/loss"]] == [1, 2, 3]
    assert metrics["job/hidden_score"][0][1] == pytest.approx(res.hidden_score)


def test_the_harness_kernel_settings_are_the_ones_the_jobs_process_trains_with(base_dir, tmp_path, monkeypatch):
    """Kernel settings in the harness's environment pass the sandbox's --clearenv: torch in the job's process runs
    the level they name (DEFAULT: no vector kernels, on any x86 CPU) and MKL gets its branch."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    res, on_disk = _run(_job(tmp_path, {"learning_rate": 1e-3, "max_steps": 2}), base_dir)
    assert res.status == "ok", res.detail
    assert on_disk["cpu"]["torch_capability"] == "DEFAULT" and on_disk["cpu"]["MKL_CBWR"] == "COMPATIBLE"


def test_diverging_job_ends_diverged(base_dir, tmp_path):
    res, _ = _run(_job(tmp_path, {"learning_rate": 1.0, "max_steps": 50}), base_dir)
    assert res.status == "diverged" and res.steps < 50 and "learning_rate" in res.detail
    assert res.hidden_score is None and not (tmp_path / "job" / "output" / "model").exists()


def test_job_over_its_compute_budget_is_refused_before_it_starts(base_dir, tmp_path):
    job = _job(tmp_path, {"learning_rate": 1e-3, "max_steps": 400})
    res = run_job(job, _task(max_seconds=10.0), model_dir=base_dir, cache_dir=tmp_path / "cache", progress=False,
                  cost_model=CostModel(), cache=False, warm_workers=False)
    assert res.status == "invalid" and res.steps == 0 and res.hidden_score is None
    assert any("over the task's 10 s budget" in f["message"] for f in res.findings), res.findings
    assert not (job / "output" / "worker.log").exists(), "no training process was started"


def test_a_slow_job_scores_exactly_as_the_same_job_run_fast(base_dir, tmp_path, monkeypatch):
    """Each step of the slow run sleeps 0.6 s (a busy machine): it runs past the task's 1 s budget in seconds, yet
    trains the same steps and earns the same staged reward, because budgets and the speed stage are compute."""
    from agent_trainer.evaluation.staged_reward import staged_reward
    from agent_trainer.inner_loop.run.job_env import STEP_DELAY_ENV

    task = _task(max_seconds=1.0)
    results = {}
    for name, delay in (("fast", None), ("slow", "0.6")):
        if delay:
            monkeypatch.setenv(STEP_DELAY_ENV, delay)
        (tmp_path / name).mkdir()
        results[name], _ = _run(_job(tmp_path / name, {"learning_rate": 1e-3, "max_steps": 5}), base_dir, task=task,
                                cache=False)   # the slow run trains: no stored result of the fast one
    fast, slow = results["fast"], results["slow"]
    # 5 steps x 0.6 s asleep: past the 1 s budget. The delay reached the trainer: its log's wall seconds exceed
    # its CPU seconds by the sleeps (a difference the machine's load only widens, never closes).
    assert slow.seconds["train"] > 2 * task.budget.max_seconds, (slow.seconds, fast.seconds)
    last = json.loads((Path(slow.output_dir) / "train_log.jsonl").read_text().splitlines()[-1])
    assert last["seconds"] - last["cpu_seconds"] > 0.9 * 5 * 0.6, last
    for res in (fast, slow):
        assert res.status == "ok" and res.steps == 5, (res.status, res.detail)
    same = ("steps", "hidden_score", "baseline", "uplift", "loss_curve", "final_train_loss")
    assert {k: getattr(slow, k) for k in same} == {k: getattr(fast, k) for k in same}
    assert slow.seconds["train_estimated"] == fast.seconds["train_estimated"]
    rewards = [staged_reward(0, r.outcome(task.budget.max_seconds)).to_dict() for r in (fast, slow)]
    assert rewards[0] == rewards[1] and rewards[0]["speed"] > 0
    # the ledger charges both the same compute against the budget caps (the measured seconds are kept beside)
    assert "estimated" in slow.seconds and slow.charged_seconds == fast.charged_seconds == slow.seconds["estimated"]


def test_the_wall_clock_safety_cap_is_an_infrastructure_fault_retried_once(base_dir, tmp_path):
    from agent_trainer.evaluation.staged_reward import staged_reward

    res, on_disk = _run(_job(tmp_path, {"learning_rate": 1e-3, "max_steps": 400}), base_dir, timeout_s=2.0)
    assert res.status == "infra_timeout" and "both tries" in res.detail and on_disk["hidden_score"] is None
    assert res.seconds["process"] < 10
    reward = staged_reward(0, res.outcome(60.0))
    assert reward.excluded and reward.total == 0.0


RAISING_REWARD = '''
def flaky(prompts, completions, trainer_state=None, **kwargs):
    # Fine in the validation probe (step 0), fails once training has made a step.
    if trainer_state is not None and trainer_state.global_step >= 1:
        raise ValueError("flaky reward gave up at step %d" % trainer_state.global_step)
    return [float(len(c) % 3) for c in completions]
'''


def test_raising_reward_ends_crashed_and_the_harness_goes_on(base_dir, tmp_path):
    reward = {"functions": [{"name": "flaky", "source": "file"}]}
    job = _job(tmp_path, {"learning_rate": 1e-3, "max_steps": 5, "num_generations": 4, "max_completion_length": 4},
               algorithm="grpo", reward=reward, files={"reward.py": RAISING_REWARD})
    res, on_disk = _run(job, base_dir)
    assert res.status == "crashed" and "flaky reward gave up at step 1" in res.error and res.steps == 1
    assert "Traceback" in on_disk["error"] and res.visible()["error"] == res.error
    assert res.hidden_score is None  # and this process is still here: the crash stayed in the child


def test_invalid_and_over_budget_jobs_are_refused_before_training(base_dir, tmp_path):
    bad = _job(tmp_path, {"learning_rate": 1e-3, "max_steps": 5})
    (bad / "job.yaml").write_text((bad / "job.yaml").read_text().replace("tiny-s", "tiny-xl"))
    res, _ = _run(bad, base_dir)
    assert res.status == "invalid" and any(f["field"] == "base_model" for f in res.findings)
    assert not (bad / "output" / "train_status.json").exists(), "nothing trained"

    (bad / "job.yaml").write_text((bad / "job.yaml").read_text().replace("tiny-xl", "tiny-s"))
    res, _ = _run(bad, base_dir, task=_task(max_usd=1e-9), price_per_hour=100.0)
    assert res.status == "over_budget" and res.estimated_usd > 1e-9
    assert not (bad / "output" / "train_status.json").exists()
