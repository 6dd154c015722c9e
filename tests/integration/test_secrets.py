"""API keys in the harness's environment never reach a run's files or MLflow.

Keys are planted in the environment (the variable the agent config names, and the usual
provider/hub/tracking ones), then a real tiny-agent episode and a short inner job with an
agent-written reward that dumps its whole environment to its log are run. Every file of the runs
folder is then read as bytes (run folders, trajectories, ledger, result.json, worker and reward
logs, resolved configs, the MLflow SQLite database and its artifact store): no key may appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_trainer.config import compose_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TASK = str(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
KEYS = {
    "OPENAI_API_KEY": "sk-test-PLANTED-openai-5f1c9a7e2b",
    "AT_AGENT_API_KEY": "sk-test-PLANTED-agent-0c4d8e1f6a",
    "HF_TOKEN": "hf_PLANTEDhubtoken3b7e9d2c1a",
    "MLFLOW_TRACKING_TOKEN": "PLANTED-mlflow-token-8a2f4c6e",
    "AWS_SECRET_ACCESS_KEY": "PLANTED-aws-secret-1d3f5b7a9c",
}
MARKER = "ENV-DUMP-BY-AGENT-CODE"
REWARD = f'''import os, sys

# Agent code hunting for keys: everything it can see goes to its log.
print("{MARKER}", dict(os.environ), flush=True)
print("{MARKER}", dict(os.environ), file=sys.stderr, flush=True)


def closeness(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
'''
JOB = {"base_model": "tiny-s", "algorithm": "grpo",
       "hyperparameters": {"learning_rate": 5e-4, "batch_size": 16, "num_generations": 4,
                           "max_completion_length": 4, "max_steps": 3},
       "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]},
       "reward": {"functions": [{"name": "closeness", "source": "file"}, {"name": "numeric_closeness"}]},
       "seed": 0}


def _leaks(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{name} in {path.relative_to(root)}" for name, key in KEYS.items() if key.encode() in data]
    return found


def test_planted_keys_appear_in_no_file_of_an_episode_or_a_job(tmp_path, built_agent, monkeypatch):
    from agent_trainer.commands import episode as at_episode
    from agent_trainer.commands import job as at_job

    for name, key in KEYS.items():
        monkeypatch.setenv(name, key)
    runs = tmp_path / "runs"

    at_episode.run(compose_config([f"runs_dir={runs}", "run_id=ep", f"task.spec_path={TASK}", "agent=tiny_local",
                                   "agent.api_key_env=AT_AGENT_API_KEY", "inner.eval_size=16"], "episode"))
    assert (runs / "ep" / "episodes" / "0" / "trajectory.jsonl").is_file()

    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(yaml.safe_dump(JOB))
    (job / "reward.py").write_text(REWARD)
    at_job.run(compose_config([f"runs_dir={runs}", "run_id=job", f"task.spec_path={TASK}", f"job_dir={job}",
                               "inner.eval_size=16", "hardware.threads_per_job=1",
                               "inner.cache=false"], "job"))  # the job must really run (and dump its env)
    result = json.loads((runs / "job" / "job" / "result.json").read_text())
    assert result["status"] == "ok", result.get("detail")
    dumped = [p for p in (runs / "job").rglob("*.log") if MARKER in p.read_text(errors="replace")]
    assert dumped, "the agent's reward code ran and dumped its environment into a log"

    # the MLflow database and artifact store are inside the runs folder: both are searched
    assert (runs / "mlflow.db").is_file() and any((runs / "mlartifacts").rglob("result.json"))
    assert _leaks(runs) == []


def test_a_key_pasted_as_the_variable_name_is_refused_before_anything_is_written(tmp_path):
    key = KEYS["OPENAI_API_KEY"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([str(Path(sys.executable).parent / "at-episode"), f"runs_dir={tmp_path}", "agent=openai",
                           "agent.base_url=http://127.0.0.1:1/v1", f"agent.api_key_env={key}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "NAME of an environment variable" in proc.stderr, proc.stderr
    assert key not in proc.stdout + proc.stderr and _leaks(tmp_path) == []
