"""Cost profiles: measured per model and machine, read by the validation's wall-clock estimate (never by compute)."""

from __future__ import annotations

import json

import pytest
import yaml

from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.spec.cost import (CostModel, estimate_cost, load_profile, machine_key, row_tokens,
                                                save_profile)
from agent_trainer.inner_loop.spec.jobspec import load_job
from agent_trainer.inner_loop.spec.validate import validate_job
from agent_trainer.inner_loop.train.data import build_rows_with_origins


def _job(folder, steps: int, model: str = "smollm2-135m", batch: int = 16, size: int = 2000):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "base_model": model, "algorithm": "sft", "peft": {"r": 16}, "seed": 0,
        "hyperparameters": {"learning_rate": 1e-4, "batch_size": batch, "max_steps": steps},
        "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": size}]}}))
    return folder


def test_a_gpu_profile_prices_the_wall_clock_not_the_compute(tmp_path):
    """The reference CPU prices 20,000 SmolLM2 steps at ~12 hours of compute (over a 2-hour budget); a GPU's
    measured profile expects them to take under an hour here, which sizes the safety cap, but admission and what
    the agent is told read compute (its seconds and its dollars), the same on every machine: the job is refused on
    both, in the same words."""
    task = TaskSpec(name="gpu_task", family="calc_chain", allowed_base_models=["smollm2-135m"],
                    budget={"max_steps": 20_000, "max_seconds": 7200, "max_usd": 10.0})
    job = _job(tmp_path / "job", 20_000)
    cpu = validate_job(job, task, dry_run=False, cost_model=CostModel())
    assert not cpu.ok and any("budget" in f.message for f in cpu.errors), cpu.to_text()
    save_profile(machine_key("cuda"), "smollm2-135m", {"sft": 6.0, "grpo": 12.0, "dpo": 6.0},
                 {"sft": {"seconds_per_step": 0.034}}, cache_dir=tmp_path / "cache")
    gpu = CostModel.measured("cuda", tmp_path / "cache")
    assert {k: gpu.machine["smollm2-135m"][k] for k in ("sft", "grpo", "dpo")} == {"sft": 6.0, "grpo": 12.0, "dpo": 6.0}
    report = validate_job(job, task, dry_run=False, cost_model=gpu)
    assert [f.message for f in report.errors] == [f.message for f in cpu.errors], report.to_text()
    assert (report.estimated_cost.seconds, report.estimated_cost.usd) == (cpu.estimated_cost.seconds,
                                                                           cpu.estimated_cost.usd)
    assert report.to_text().replace(str(job), "") == cpu.to_text().replace(str(job), "")
    assert 1800 < report.wall_estimate.seconds < 3600 and "x6" in report.wall_estimate.formula
    assert load_profile(machine_key("cpu"), tmp_path / "cache") == {}, "profiles are per machine"


@pytest.mark.slow
def test_calibration_measures_a_model_and_predicts_its_steps(built_models, tmp_path):
    from agent_trainer.inner_loop.spec.calibrate import calibrate, floor_for

    save_profile(machine_key("cpu"), "tiny-s", {"grpo": 9.0, "grpo/row": 9.0}, {}, tmp_path / "cache")
    # SFT and DPO (which gives the sampling factor), raw and chat; what grpo had stays stored.
    profile = calibrate("tiny-s", cache_dir=tmp_path / "cache", progress=False, algorithms=["sft", "dpo"])
    factors = profile["factors"]
    kinds = {"sft", "dpo", "sft:chat", "dpo:chat"}
    assert kinds | {k + "/row" for k in kinds} | {"sample", "sample:chat"} == set(factors), factors
    # Factors are timings of this machine as it is: beside the other test worker one of them moves 10x, so
    # their sizes are the bench's to compare (quiet, chat is 4x raw for SFT), not a test's.
    assert all(f > 0 for f in factors.values()), factors
    assert all(m["cpu_share"] > 0 for m in profile["measured"].values()), profile["measured"]
    stored = json.loads((tmp_path / "cache" / "cost_profiles.json").read_text())[machine_key("cpu")]["tiny-s"]
    assert stored["factors"] == {**factors, "grpo": 9.0, "grpo/row": 9.0}
    assert stored["measured"]["sft"]["steps_timed"] >= 10
    # The profile gives back the measured seconds per step for the jobs it timed: both batch sizes when the two
    # factors separate into a fixed cost and a row cost; the larger (within 10%) when noise made them one factor,
    # or made the small job so fast that the rows carry the whole step (the fixed factor at its floor).
    machine = CostModel.measured("cpu", tmp_path / "cache")
    exact = factors["sft"] != factors["sft/row"] and factors["sft"] != floor_for(factors["sft/row"])
    sizes = [("sft/row", 64, 0.01 if exact else 0.1)] + ([("sft", 16, 0.01)] if exact else [])
    for key, batch, rel in sizes:
        # The calibration's own rows (400 of calc_chain, seed 1), priced at their length as validation prices a job's.
        job = _job(tmp_path / f"j{batch}", 12, "tiny-s", batch=batch, size=400)
        spec = load_job(job)
        tokens = row_tokens(build_rows_with_origins(spec, None, "calc_chain")[0])
        predicted = estimate_cost(spec, machine, wall=True, tokens=tokens).step_seconds
        assert predicted == pytest.approx(profile["measured"][key]["seconds_per_step"], rel=rel), (key, factors)
