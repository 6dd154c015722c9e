"""Faults the harness must survive: an inner job's process killed mid-training (the job ends
``crashed`` with its ``result.json`` and the episode's next tool call works), and an MLflow server
that cannot be reached (reported at start-up in seconds, with one line, before any work starts).

The SIGKILL-during-an-outer-step resume is in ``test_train.py`` (it needs a whole at-train run).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from agent_trainer.evaluation.tasks import load_task
from agent_trainer.outer_loop.episode.ledger import Ledger
from agent_trainer.outer_loop.episode.tools import ToolBox, ToolLimits
from agent_trainer.outer_loop.episode.workspace import Workspace
from agent_trainer.inner_loop.run.request import JobSettings

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples/tasks/calc_chain_v1_tiny.json"
# Library data only (no agent code or data): the plain cold worker process, no sandbox around it.
JOB = {"base_model": "tiny-s", "algorithm": "sft",
       "hyperparameters": {"learning_rate": 1e-3, "batch_size": 64, "max_steps": 100},
       "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 2000}]}, "seed": 0}


def _worker_pids(output_dir: Path) -> list[int]:
    """Pids of ``python -m agent_trainer.inner_loop.run.worker`` processes writing into ``output_dir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agent_trainer.inner_loop.run.worker" in argv and str(output_dir).encode() in argv:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_inner_job_killed_mid_training_ends_crashed_and_the_episode_goes_on(tmp_path, built_models):
    task = load_task(TASK)
    ws = Workspace.create(tmp_path / "ep" / "workspace", task)
    ledger = Ledger.open(tmp_path)
    box = ToolBox(ws, task, limits=ToolLimits(max_turns=8, max_jobs_per_episode=2), jobs_dir=tmp_path / "ep" / "jobs",
                  ledger=ledger, validate_kwargs={"dry_run": False},
                  job_settings=JobSettings(dry_run=False, threads=1, progress=False, hidden_n=16, cache=False,
                                           warm_workers=False))
    assert box.call("write_file", {"path": "job.yaml", "content": yaml.safe_dump(JOB)}).ok
    output = (tmp_path / "ep" / "jobs" / "00" / "output").resolve()
    killed: list[int] = []

    def kill_after_first_step():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            log = output / "train_log.jsonl"
            if log.is_file() and log.read_text().strip():  # training has made a step
                for pid in _worker_pids(output):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_after_first_step, daemon=True)
    killer.start()
    res = box.call("submit_job", {"path": "."})
    killer.join(timeout=5)
    assert killed, "the worker was never seen training"

    assert not res.ok and "job status: crashed" in res.text, res.text
    result = json.loads((output / "result.json").read_text())
    assert result["status"] == "crashed" and result["hidden_score"] is None
    # how it ended, in the result and as the last line of its log (the kill here is no out-of-memory kill)
    assert "killed by SIGKILL (signal 9)" in result["detail"] and 0 < result["steps"] < 100
    assert "[harness] the job process killed by SIGKILL" in (output / "worker.log").read_text()
    assert not _worker_pids(output), "no process of the killed job is left"
    (job,) = [r for r in map(json.loads, (tmp_path / "ledger.jsonl").read_text().splitlines()) if r["kind"] == "job"]
    assert job["status"] == "crashed"

    # the episode goes on: the agent reads, edits, validates; the tools answer as before
    assert "job.yaml" in box.call("list_files", {}).text
    assert box.call("write_file", {"path": "job.yaml", "content": yaml.safe_dump({**JOB, "seed": 1})}).ok
    valid = box.call("validate_job", {"path": "job.yaml"})
    assert valid.ok and "VALID" in valid.text
    assert box.state.submitted == 1 and not box.done
    assert box.call("finish", {"summary": "the first job crashed"}).ok
    ledger.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nothing listens there


# Written beside the command as sitecustomize.py: at exit, the names of the modules it had imported.
_MODULES_AT_EXIT = """import atexit, os, sys
atexit.register(lambda: open(os.environ["AT_TEST_MODULES"], "w").write("\\n".join(sorted(sys.modules))))
"""
# What a command loads once it starts work: reporting a dead server must come before all of these.
_HEAVY = ("torch", "transformers", "trl", "peft", "lightning", "datasets", "mlflow", "vllm")


@pytest.mark.parametrize("command,args", [
    ("at-train", ["experiment=smoke"]),
    ("at-job", ["examples/jobs/sft_full", "task=calc_chain_v1_tiny"]),
])
def test_unreachable_mlflow_server_is_reported_at_start_up(tmp_path, command, args):
    uri = f"http://127.0.0.1:{_closed_port()}"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_MODULES_AT_EXIT)
    modules = tmp_path / "modules.txt"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
    env["AT_TEST_MODULES"] = str(modules)
    proc = subprocess.run([str(Path(sys.executable).parent / command), *args, f"runs_dir={tmp_path}", "run_id=r",
                           "tracking=server", f"tracking.tracking_uri={uri}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{command}: error: MLflow server {uri}"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    # Before any work: no episode, no job output; and before torch, TRL, MLflow and models are loaded (what the
    # command had imported when it exited, which unlike its time does not change with the machine or its load).
    assert not (tmp_path / "r" / "episodes").exists() and not (tmp_path / "r" / "job").exists()
    loaded = set(modules.read_text().split())
    assert "hydra" in loaded, "the hook saw the command's modules"
    assert not loaded.intersection(_HEAVY), f"{command} loaded {sorted(loaded.intersection(_HEAVY))} first"


def test_a_warm_job_that_dies_while_it_starts_leaves_its_error_in_its_log(tmp_path, monkeypatch):
    """A forked job that fails before it opens its log (here: its task's module fails to import in the job
    process) still says why, in worker.log and in its result's error."""
    from agent_trainer.inner_loop.isolation import launcher as isolation
    from agent_trainer.inner_loop.run import worker

    ctx = worker.warm_context()
    (tmp_path / "late_module.py").write_text(
        f"import os\nif os.getpid() != {os.getpid()}:\n    raise ImportError('late_module loads in the harness only')\n"
        "def train():\n    print('never runs')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_module  # importable here; its import fails where the job process unpickles its task
    out, home = tmp_path / "out", tmp_path / "home"
    out.mkdir()
    home.mkdir()
    proc = isolation.WarmProcess(ctx, late_module.train, cwd=home, env={}, log_path=out / worker.WORKER_LOG)
    assert proc.wait() not in (0, None)

    status = worker.final_status(out, killed=False, returncode=proc.returncode, deadline_s=60)
    assert status["status"] == "crashed" and "exited with code" in status["detail"]
    log = (out / worker.WORKER_LOG).read_text()
    assert "died before it opened this log" in log and "late_module loads in the harness only" in log
    assert "late_module loads in the harness only" in status["error"]
    sys.modules.pop("late_module", None)
