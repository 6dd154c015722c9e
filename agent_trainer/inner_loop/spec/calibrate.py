"""Cost profiles: how fast a base model trains on this machine, measured, for the validation's estimates.

    at-models calibrate model=smollm2-135m          # a few minutes for SmolLM2 on 2 cores
    >>> from agent_trainer.inner_loop.spec.calibrate import calibrate
    >>> calibrate("smollm2-135m")["factors"]         # {"sft": ..., "grpo": ..., "sft:chat": ..., ...}

Times short SFT-LoRA and GRPO-LoRA jobs (raw and chat format) against the tiny-s coefficients and stores
the factors in ``<cache>/cost_profiles.json``, which ``CostModel.measured`` reads: docs/real_models.md,
"Costs per machine".
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml

from agent_trainer.inner_loop.spec.cost import CostModel, estimate_cost, machine_key, row_tokens, save_profile

# The calibration jobs (LoRA, as real models are trained here); steps after the first are timed.
JOBS = {
    "sft": {"algorithm": "sft", "peft": {"r": 16, "alpha": 32},
            "hyperparameters": {"learning_rate": 1e-4, "batch_size": 16, "max_steps": 12}},
    "grpo": {"algorithm": "grpo", "peft": {"r": 16, "alpha": 32},
             "hyperparameters": {"learning_rate": 1e-5, "batch_size": 16, "num_generations": 4,
                                 "max_completion_length": 8, "max_steps": 4},
             "reward": {"functions": [{"name": "numeric_closeness"}]}},
}


def _timed_job(name: str, model_dir: Path, job: dict, device: str, folder: Path, fmt=None,
               threads: int | None = None, family: str = "calc_chain") -> tuple[float, int, float]:
    """(seconds per step after the first, steps timed, CPU seconds per wall second over those steps) of one
    calibration job, run as jobs run (its own process)."""
    from agent_trainer.inner_loop.run.worker import Training, run_worker
    from agent_trainer.inner_loop.train.train import TRAIN_LOG

    job_dir = folder / "job"
    job_dir.mkdir(parents=True)
    spec = {"base_model": name, "seed": 0, "data": {"sources": [{"family": family, "seed": 1, "size": 400}]}, **job}
    (job_dir / "job.yaml").write_text(yaml.safe_dump(spec))
    steps = job["hyperparameters"]["max_steps"]
    run = run_worker(Training(job_dir, model_dir, family, folder / "out", max_steps=steps, threads=threads,
                              device=device, fmt=fmt), deadline_s=7200, progress=False)
    if run.status.get("status") != "ok":
        raise RuntimeError(f"the calibration job ({job['algorithm']}) ended {run.status.get('status')}: "
                           f"{run.status.get('detail')} {run.status.get('error', '')[-500:]}")
    log = [json.loads(line) for line in (folder / "out" / TRAIN_LOG).read_text().splitlines() if line.strip()]
    times = {r["step"]: (r["seconds"], r.get("cpu_seconds", 0.0)) for r in log if "seconds" in r}
    first, last = min(times), max(times)
    wall, cpu = times[last][0] - times[first][0], times[last][1] - times[first][1]
    return wall / max(1, last - first), last - first, cpu / wall if wall > 0 else 0.0


def calibrate(name: str, cache_dir=None, device: str = "cpu", progress: bool = True,
              threads: int | None = None, family: str = "calc_chain") -> dict:
    """Measure model ``name``'s factors here (sft, grpo, and both again in the chat format when its tokenizer
    has a chat template; dpo takes sft's) on rows of ``family`` (those of the jobs to price), store them in
    the cache's profile, return them. A factor is per token: the rows' lengths are priced first
    (``cost.row_tokens``), so rows of another length reuse it."""
    from transformers import AutoTokenizer

    from agent_trainer.evaluation.prompts import for_family
    from agent_trainer.inner_loop.models.registry import resolve_model
    from agent_trainer.inner_loop.spec.jobspec import JobSpec
    from agent_trainer.inner_loop.train.data import build_rows_with_origins

    model_dir = resolve_model(name, cache_dir=cache_dir, progress=progress)
    formats = ["raw"] + (["chat"] if AutoTokenizer.from_pretrained(model_dir).chat_template else [])
    base = CostModel()
    factors, measured = {}, {}
    for kind in formats:
        for algorithm, job in JOBS.items():
            key = algorithm if kind == "raw" else f"{algorithm}:{kind}"
            with tempfile.TemporaryDirectory(prefix=f"calibrate-{algorithm}-") as tmp:
                step_s, timed, cpu_share = _timed_job(name, model_dir, job, device, Path(tmp),
                                                      for_family(family, kind), threads, family)
            spec = JobSpec.model_validate({"base_model": "tiny-s", "seed": 0,
                                           "data": {"sources": [{"family": family, "seed": 1, "size": 400}]}, **job},
                                          context={"task_family": family})
            tokens = row_tokens(build_rows_with_origins(spec, None, family)[0])
            tiny_step = estimate_cost(spec, base, tokens=tokens).step_seconds  # tiny-s's, by the coefficients
            factors[key] = round(step_s / tiny_step, 2)
            measured[key] = {"seconds_per_step": round(step_s, 4), "steps_timed": timed,
                             "batch_size": job["hyperparameters"]["batch_size"], "cpu_share": round(cpu_share, 2)}
        suffix = "" if kind == "raw" else f":{kind}"
        factors["dpo" + suffix] = factors["sft" + suffix]
    save_profile(machine_key(device), name, factors, measured, cache_dir)
    return {"machine": machine_key(device), "factors": factors, "measured": measured,
            "busy": busy_warning(measured, device)}


BUSY_SHARE = 0.5   # CPU seconds per wall second under which a CPU job shared its cores with other work


def busy_warning(measured: dict, device: str = "cpu") -> str | None:
    """A line when a CPU calibration job ran less than ``BUSY_SHARE`` of the wall clock on the CPU: other work
    took its cores, so its seconds (and the factors from them) are too high for this machine."""
    if device != "cpu":
        return None
    busy = {k: m["cpu_share"] for k, m in measured.items() if m.get("cpu_share", 1.0) < BUSY_SHARE}
    if not busy:
        return None
    shares = ", ".join(f"{k} {v:.2f}" for k, v in busy.items())
    return (f"the machine was busy: the calibration jobs ran on the CPU only part of the time (CPU seconds per "
            f"wall second: {shares}; a job alone runs at 1 or more), so these factors price this machine too "
            f"high; rerun at-models calibrate when nothing else runs")
