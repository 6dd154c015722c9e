"""``at-train ... dry_run=true`` on every hardware option: the config composes, the executor is built, the
plan (``plan.json``) says how inner jobs would run, nothing is submitted or trained.

    .venv/bin/pytest tests/integration/test_dry_run.py -q          (~15 s)
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_trainer.config import CONFIG_DIR, compose_config
from agent_trainer.commands import train as at_train

ROOT = Path(__file__).resolve().parents[2]
HARDWARE = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))


def _plan(tmp_path: Path, *overrides: str) -> dict:
    cfg = compose_config([f"runs_dir={tmp_path}", "run_id=plan", "dry_run=true", *overrides], "train")
    assert at_train.run(cfg) is None
    return json.loads((tmp_path / "plan" / "plan.json").read_text())


def test_the_required_hardware_options_exist():
    assert {"cpu", "cpu_parallel", "gpu1", "gpu_node", "slurm", "ray"} <= set(HARDWARE)


@pytest.mark.parametrize("hardware", HARDWARE)
def test_every_hardware_option_passes_a_dry_run(tmp_path, hardware):
    plan = _plan(tmp_path, f"hardware={hardware}")
    cfg = compose_config([f"hardware={hardware}"], "train")
    assert plan["executor"] == cfg.hardware.executor and plan["max_parallel"] == cfg.hardware.max_parallel_jobs
    assert plan["device"] == cfg.hardware.device and plan["job_cache"] is True
    assert not list(tmp_path.glob("plan/episodes/*")) and not (tmp_path / "plan" / "checkpoints").exists()
    assert not (tmp_path / "submitit").exists(), "a dry run submits nothing"


def test_gpu_node_runs_one_job_per_gpu(tmp_path):
    plan = _plan(tmp_path, "hardware=gpu_node")
    assert (plan["executor"], plan["max_parallel"], plan["gpus_per_job"]) == ("local_parallel", 8, 1)
    assert plan["agent"] == "local on cuda" and plan["inner_vllm"] is False


def test_gpu1_plans_vllm_for_the_agent_and_the_grpo_jobs(tmp_path):
    plan = _plan(tmp_path, "hardware=gpu1", "agent=vllm")
    assert (plan["agent"], plan["inner_vllm"], plan["max_parallel"]) == ("vllm on cuda", True, 1)


@pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason="submitit not installed (.[slurm])")
def test_slurm_plan_is_the_sbatch_array_submitit_would_write(tmp_path):
    plan = _plan(tmp_path, "hardware=slurm", "hardware.slurm_partition=gpu-long", "hardware.time_limit_min=45",
                 "+hardware.slurm_additional.account=lab", "outer.group_size=4", "outer.tasks_per_step=1")
    sbatch = plan["sbatch"]
    n = plan["jobs_per_step_max"]
    for line in ("#SBATCH --partition=gpu-long", "#SBATCH --time=45", "#SBATCH --gpus-per-node=1",
                 f"#SBATCH --array=0-{n - 1}%{min(n, 8)}", "#SBATCH --account=lab", "#SBATCH --cpus-per-task=8"):
        assert line in sbatch, line
    # Without a time limit, the job's hard deadline plus the evaluation margin.
    derived = _plan(tmp_path / "derived", "hardware=slurm")["parameters"]["timeout_min"]
    assert 5 <= derived <= 60


def test_ray_plan_without_ray_installed_still_passes(tmp_path):
    plan = _plan(tmp_path, "hardware=ray", "hardware.max_parallel_jobs=3", "hardware.cpus_per_job=2")
    assert plan["local_cpus"] == 6 and plan["task_resources"] == {"num_cpus": 2, "num_gpus": 0}
    assert plan["engine_installed"] == (importlib.util.find_spec("ray") is not None)


def test_the_command_line_dry_run_exits_0_and_prints_the_plan(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([str(Path(sys.executable).parent / "at-train"), "hardware=slurm", "dry_run=true",
                           f"runs_dir={tmp_path}", "run_id=cli"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "cli" / "plan.json").is_file()
    assert "executor" in proc.stdout and "slurm" in proc.stdout


def test_a_bad_hardware_value_stops_with_one_line(tmp_path):
    proc = subprocess.run([str(Path(sys.executable).parent / "at-train"), "hardware=slurm", "hardware.mem_gb=0",
                           "dry_run=true", f"runs_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 2 and "hardware.mem_gb must be >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr
