"""Run one inner job end to end: validate, train in a child process, score, write ``result.json``.

    r = run_job("examples/jobs/sft_full", load_task("examples/tasks/calc_chain_v1_fast.json"))
    r.status, r.hidden_score, r.baseline, r.uplift      # harness-side numbers
    r.visible()                                         # what the agent may see (no hidden score)

``result.json`` holds the hidden score: keep ``output_dir`` out of the agent's reach. Statuses and
output files: docs/inner_loop.md, "Outcomes".
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from evaluation.prompts import for_task
from evaluation.tasks import TaskSpec, load_task
from inner_loop.job_env import gpu_ids, job_gpus
from inner_loop.result import RESULT_FILE, JobResult, job_hash, library_versions, track_result, write_json_atomic

# transformers' from_pretrained is not thread-safe (module-level init flags): jobs running in
# parallel threads (inner_loop.executor) train in parallel child processes, but load and score
# models in this process one at a time. A race here left weights on the meta device.
HARNESS_LOCK = threading.RLock()
KILL_FACTOR, KILL_MARGIN_S = 1.5, 60.0


def _read_log(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _ran(ran: dict | None, log: list[dict]) -> dict:
    """The child's ``ran`` record; a stage still at 0 steps when the child died gets its steps from the log."""
    stages = [dict(s) for s in (ran or {}).get("stages", [])]
    for n, stage in enumerate(stages, 1):
        if not stage.get("steps"):
            stage["steps"] = sum(1 for r in log if r.get("stage", 1) == n and "loss" in r)
    return {"stages": stages}


def _curve(log: list[dict], key: str) -> list[list[float]]:
    return [[r["step"], r[key]] for r in log if isinstance(r.get(key), (int, float))]


def architecture_mismatch(checkpoint: Path, base: Path) -> str | None:
    """Why ``checkpoint`` is not a model of ``base``'s architecture, or None when it is.

    The full lineage check (``evaluation.lineage``): plain safetensors files, every config key, every
    parameter shape, the tokenizer and the generation config equal to the base model's."""
    from evaluation.lineage import lineage_mismatch

    return lineage_mismatch(checkpoint, base)


def _base_model_dir(name: str, cache_dir) -> Path:
    from inner_loop.models import resolve_model

    return Path(resolve_model(name, cache_dir=cache_dir))


def _baseline(base_dir: Path, family: str, n: int, cache_dir, device: str = "cpu", fmt=None) -> float:
    from evaluation.baselines import get_baseline
    from evaluation.prompts import RAW

    return float(get_baseline(base_dir, family, n, cache_dir=cache_dir, device=device, fmt=fmt or RAW))


def eval_device(device: str, gpus: str | None) -> str:
    """Where the harness scores a job's model: the job's first GPU as this process numbers it, else the CPU.

    ``gpus`` is the job's ``CUDA_VISIBLE_DEVICES`` (ids as the machine numbers them); this process may
    itself see only some GPUs (its own ``CUDA_VISIBLE_DEVICES``), so the first id is looked up there."""
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    first = (gpus or "").split(",")[0].strip()
    if not first:
        return "cuda"
    mine = gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if mine:
        return f"cuda:{mine.index(first)}" if first in mine else "cuda"
    return f"cuda:{first}" if first.isdigit() else "cuda"


def run_job(job_dir: str | Path, task: TaskSpec | str | Path, *, cache_dir: str | Path | None = None,
            tracker=None, hidden_n: int | None = None, price_per_hour: float | None = None,
            timeout_s: float | None = None, cost_model=None,
            output_dir: str | Path | None = None, model_dir: str | Path | None = None, threads: int | None = None,
            dry_run: bool = True, progress: bool = True,
            wrap: Callable[[list[str]], list[str]] | None = None, warm: bool = False, cache: bool = False,
            sandbox=None, device: str = "cpu", gpus: str | None = None, vllm: bool = False) -> JobResult:
    """Validate, train (child process), score and record one job; never raises for a job's fault.

    ``warm=True`` forks the training process from a pre-imported worker (``inner_loop.worker``),
    saving the ~10 s import, for jobs without agent-written code or data; the others (and any
    sandboxed run, ``wrap``) always take a fresh interpreter.

    ``price_per_hour`` prices the machine (default: ``cost_model``'s, else ``CostModel()``'s $0.10);
    ``cost_model`` (``inner_loop.cost.CostModel``) makes the validation's estimate fit other hardware.
    ``model_dir`` uses that base-model folder instead of resolving ``base_model``; ``timeout_s``
    overrides the hard kill deadline; ``wrap`` turns the child's argv into a sandboxed one (e.g.
    a bubblewrap prefix); ``tracker`` is anything with ``log_params``/``log_metrics``/``log_artifact``
    (``agent_trainer.tracking.Tracker``). ``cache=True`` returns the stored result of an identical job
    (``inner_loop.cache``; the ``inner.cache`` config key, on by default in the commands).

    ``sandbox`` (``inner_loop.sandbox.SandboxPolicy``, a dict of its fields, a bool, or None for the
    default: on, unsafe execution refused) runs a job with agent-written code or data under
    bubblewrap, its reward functions in a sandboxed reward host of their own; without bubblewrap
    such a job is refused (``invalid``, a ``sandbox`` finding) unless the policy allows unsafe runs.
    Agent data (and reward file text) are checked against the hidden set first: a job that contains
    hidden items is ``flagged`` and scores as its baseline (``evaluation.contamination``).

    ``device`` (``hardware.device``: ``cpu``, ``cuda``, ``auto``): where the job trains and is scored;
    ``gpus``: its ``CUDA_VISIBLE_DEVICES`` (the local executor hands each parallel job its own; None:
    what this process was given, as under SLURM or Ray); ``vllm``: GRPO generation through vLLM.
    """
    if cache:
        args = {k: v for k, v in locals().items() if k != "cache"}  # first statement: only the arguments
        from inner_loop.cache import run_cached

        return run_cached(run_job, **args)
    from inner_loop.cost import CostModel
    from inner_loop.jobspec import JobSpecError, load_job
    from inner_loop.validate import validate_job
    from inner_loop.worker import run_worker

    t_start = time.monotonic()
    cost_model = cost_model or CostModel.measured(device, cache_dir)
    if price_per_hour is not None:
        cost_model = dataclasses.replace(cost_model, usd_per_hour=price_per_hour)
    price_per_hour = cost_model.usd_per_hour
    task = task if isinstance(task, TaskSpec) else load_task(task)
    job_dir = Path(job_dir)
    out = Path(output_dir) if output_dir else job_dir / "output"
    hidden_n = hidden_n or task.hidden_eval_size
    res = JobResult(status="invalid", task=task.name, family=task.family, job_dir=str(job_dir), output_dir=str(out),
                    job_hash=job_hash(job_dir), hidden_n=hidden_n, libraries=library_versions())

    from inner_loop.sandbox import SandboxPolicy

    policy = SandboxPolicy.coerce(sandbox)
    with HARNESS_LOCK:  # the dry run loads a model in this process
        if warm and wrap is None:
            prestart_warm_worker(job_dir, task.family)
        report = validate_job(job_dir, task, dry_run=dry_run, cache_dir=cache_dir, model_dir=model_dir,
                              cost_model=cost_model, sandbox=policy, output_dir=out)
    res.seconds["validate"] = round(time.monotonic() - t_start, 3)
    res.findings = [asdict(f) for f in report.findings]
    est = report.estimated_cost
    res.estimated_usd = est.usd if est else None
    if not report.ok:
        over = est is not None and report.over_budget
        res.status = "over_budget" if over else "invalid"
        res.detail = (f"estimated ${est.usd:.4f} is over the task's ${task.budget.max_usd} cap; not run" if over
                      else f"{len(report.errors)} validation error(s); nothing was trained")
        return _finish(res, out, t_start, price_per_hour, tracker)

    try:
        spec = load_job(job_dir, task.family)
    except JobSpecError as e:  # changed between validation and now
        res.detail = str(e)
        return _finish(res, out, t_start, price_per_hour, tracker)
    res.job_hash = job_hash(job_dir, spec)
    res.base_model, res.algorithm, res.seed = spec.base_model, spec.strategy_algorithm(), spec.seed
    base_dir = Path(model_dir) if model_dir else _base_model_dir(spec.base_model, cache_dir)

    deadline = timeout_s or task.budget.max_seconds * KILL_FACTOR + KILL_MARGIN_S
    fmt = for_task(task)  # how the job's rows, its hidden score and its baseline render prompts
    agent_files = spec.uses_agent_code or spec.uses_agent_data
    reward_host = None
    if agent_files:
        from inner_loop.contamination import check_job
        from inner_loop.reward_proxy import RewardHost
        from inner_loop.sandbox import trainer_wrapper

        found = check_job(spec, job_dir, task.family, hidden_n)
        res.flagged, res.contamination = found.flagged, found.to_dict()
        res.sandbox = "bwrap" if policy.use_bwrap() else "unsafe"
        if wrap is None and res.sandbox == "bwrap":
            out.mkdir(parents=True, exist_ok=True)
            wrap = trainer_wrapper(policy, job_dir=job_dir, output_dir=out, model_dir=base_dir, deadline_s=deadline,
                                   threads=threads, gpus=job_gpus(device, gpus))
        if spec.uses_agent_code:
            reward_host = RewardHost(policy, job_dir, out / "reward.log", deadline_s=deadline)
    try:
        run = run_worker(job_dir, base_dir, task.family, out, max_steps=task.budget.max_steps,
                         max_seconds=task.budget.max_seconds, deadline_s=deadline, threads=threads,
                         progress=progress, wrap=wrap, warm=warm and wrap is None and not agent_files,
                         reward_host=reward_host, device=device, gpus=gpus, vllm=vllm, fmt=fmt)
    finally:
        if reward_host is not None:
            reward_host.close()
    st = run.status
    res.status, res.device = st.get("status", "crashed"), st.get("device")
    res.detail, res.error = st.get("detail", ""), st.get("error", "")
    res.steps, res.planned_steps = int(st.get("steps") or 0), int(st.get("planned_steps") or 0)
    res.seconds["train"], res.seconds["process"] = float(st.get("seconds") or 0.0), run.wall_seconds
    log = _read_log(out / "train_log.jsonl")
    if log:  # a crash mid-run leaves the steps it made in the log only
        res.steps = max(res.steps, int(log[-1].get("step", 0)))
    if est is not None:   # the speed stage's clock: the cost model's seconds for the steps run (no load noise)
        res.seconds["train_estimated"] = est.train_seconds(res.steps)
    res.ran = _ran(st.get("ran"), log)
    res.reward_curve, res.loss_curve = _curve(log, "reward"), _curve(log, "loss")
    res.final_train_reward = res.reward_curve[-1][1] if res.reward_curve else None
    res.final_train_loss = res.loss_curve[-1][1] if res.loss_curve else None

    model_out = out / "model"
    if res.status in ("ok", "timeout") and st.get("model_dir") and model_out.is_dir():
        _check_trained(res, spec, job_dir, out, task.family, hidden_n)
        with HARNESS_LOCK:
            _score(res, model_out, base_dir, cache_dir, eval_device(device, gpus), fmt)
    return _finish(res, out, t_start, price_per_hour, tracker, log)


def prestart_warm_worker(job_dir: Path, task_family: str | None = None) -> None:
    """Start the warm-worker forkserver now, so that its ~10 s of imports overlap the validation.

    Only for a job that will take the warm path (no agent-written code or data); once per process."""
    from inner_loop.jobspec import JobSpecError, load_job
    from inner_loop.worker import warm_context

    try:
        spec = load_job(job_dir, task_family)
    except JobSpecError:
        return
    if not (spec.uses_agent_code or spec.uses_agent_data):
        warm_context()


def _check_trained(res: JobResult, spec, job_dir: Path, out: Path, family: str, hidden_n: int) -> None:
    """Flag the job when the rows its process trained on are not its declared rows or hold hidden items."""
    from inner_loop.contamination import check_trained

    after = check_trained(spec, job_dir, out, family, hidden_n, stages_run=len(res.ran.get("stages", [])) or None)
    if after.flagged:
        res.flagged = True
        res.contamination = {**res.contamination, "trained": after.to_dict()}


def _score(res: JobResult, checkpoint: Path, base_dir: Path, cache_dir, device: str = "cpu", fmt=None) -> None:
    """Hidden score, baseline and uplift of a saved checkpoint (in this, the harness, process).

    The checkpoint is loaded only after its lineage check; a flagged job is not scored at all: its
    hidden score is its baseline (uplift 0)."""
    from evaluation.hidden_eval import score_checkpoint
    from evaluation.prompts import RAW

    why = architecture_mismatch(checkpoint, base_dir)
    if why:
        res.status, res.detail = "crashed", f"the saved model is not a {res.base_model} model ({why}); not scored"
        return
    t0 = time.monotonic()
    try:
        res.baseline = _baseline(base_dir, res.family, res.hidden_n, cache_dir, device, fmt)
        res.hidden_score = (res.baseline if res.flagged else float(
            score_checkpoint(checkpoint, res.family, res.hidden_n, device=device, fmt=fmt or RAW).score))
    except Exception as e:  # a checkpoint the harness cannot read is the job's failure, not the harness's
        res.status, res.detail = "crashed", f"the hidden evaluation could not score the model: {type(e).__name__}: {e}"
        res.hidden_score = res.baseline = None
    res.seconds["eval"] = round(time.monotonic() - t0, 3)
    if res.hidden_score is not None and res.baseline is not None:
        res.uplift = round(res.hidden_score - res.baseline, 6)


def _finish(res: JobResult, out: Path, t_start: float, price_per_hour: float, tracker, log: list[dict] = ()) -> JobResult:
    res.seconds["total"] = round(time.monotonic() - t_start, 3)
    res.usd = round(res.seconds["total"] / 3600 * price_per_hour, 6)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / RESULT_FILE, res.as_dict())
    if tracker is not None:
        track_result(tracker, res, out, log)
    return res
