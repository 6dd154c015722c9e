"""One inner job end to end: validate, prepare, train (child process), score, record ``result.json``.

    r = run_job("examples/jobs/sft_full", load_task("examples/tasks/calc_chain_v1_fast.json"), threads=1)
    r = run_request(JobRequest.of(job_dir, task, settings=settings))   # what the executors call
    r.status, r.hidden_score, r.baseline, r.uplift      # harness-side numbers
    r.visible()                                         # what the agent may see (no hidden score)

``job.yaml`` is parsed once (``Job.open``) and the spec handed to every stage, the training process too.
``result.json`` holds the hidden score: keep the output folder out of the agent's reach. Statuses and
output files: docs/inner_loop.md, "Outcomes".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent_trainer.evaluation.prompts import for_task
from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.run.job_env import gpu_ids, job_gpus
from agent_trainer.inner_loop.run.request import KILL_FACTOR, KILL_MARGIN_S, JobRequest, JobSettings, safety_cap
from agent_trainer.inner_loop.run.result import (
    RESULT_FILE, JobResult, job_hash, library_versions, track_result, write_json_atomic,
)
from agent_trainer.trace import TRACE_FILE, append, tracing

# transformers' from_pretrained is not thread-safe (module-level init flags): jobs running in
# parallel threads (agent_trainer.inner_loop.run.executor) train in parallel child processes, but load and score
# models in this process one at a time. A race here left weights on the meta device.
HARNESS_LOCK = threading.RLock()
__all__ = ["Job", "run_job", "run_request", "execute", "JobRequest", "JobSettings", "HARNESS_LOCK", "KILL_FACTOR",
           "KILL_MARGIN_S", "RESULT_FILE", "eval_device"]

log = logging.getLogger(__name__)


def _ran(ran: dict | None, log: list[dict]) -> dict:
    """The child's ``ran`` record; a stage still at 0 steps when the child died gets its steps from the log."""
    stages = [dict(s) for s in (ran or {}).get("stages", [])]
    for n, stage in enumerate(stages, 1):
        if not stage.get("steps"):
            stage["steps"] = sum(1 for r in log if r.get("stage", 1) == n and "loss" in r)
    return {"stages": stages}


def _curve(log: list[dict], key: str) -> list[list[float]]:
    return [[r["step"], r[key]] for r in log if isinstance(r.get(key), (int, float))]


def _base_model_dir(name: str, cache_dir) -> Path:
    from agent_trainer.inner_loop.models import resolve_model

    return Path(resolve_model(name, cache_dir=cache_dir))


def _baseline(base_dir: Path, family: str, n: int, cache_dir, device: str = "cpu", fmt=None) -> float:
    from agent_trainer.evaluation.baselines import get_baseline
    from agent_trainer.evaluation.prompts import RAW

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


@dataclass
class Job:
    """A request with what every stage needs, derived once: its cost model and sandbox policy, and
    ``job.yaml`` read and parsed (``spec``; None when it could not be, with why in ``report``)."""

    request: JobRequest
    cost_model: Any            # agent_trainer.inner_loop.spec.cost.CostModel
    policy: Any                # agent_trainer.inner_loop.isolation.sandbox.SandboxPolicy
    report: Any                # agent_trainer.inner_loop.spec.validate.ValidationReport: reading's findings, then
                               # validation's
    spec: Any                  # agent_trainer.inner_loop.spec.jobspec.JobSpec | None
    t_start: float

    source_dir: Path | None = None  # the folder the job was asked from; ``request.job_dir`` is its snapshot

    @classmethod
    def open(cls, request: JobRequest) -> "Job":
        """The job read once: its folder copied into a read-only snapshot (``jobfiles.snapshot_job``) that every
        later stage reads (validation, contamination check, training, trained-rows check), ``job.yaml`` parsed."""
        from agent_trainer.inner_loop.spec.jobfiles import SnapshotError, snapshot_job
        from agent_trainer.inner_loop.spec.validate import ValidationReport, internal_error, read_spec

        t_start = time.monotonic()
        source = request.job_dir
        report = ValidationReport(job_dir=str(source))
        request = dataclasses.replace(request, output_dir=request.out)  # outputs stay where they were asked
        spec = None
        try:
            request = dataclasses.replace(request, job_dir=snapshot_job(source, skip=[request.out]))
        except FileNotFoundError:
            pass  # no folder: reading job.yaml below says so
        except SnapshotError as e:
            report.add("files", str(e), "a job folder holds job.yaml, its data files and reward*.py files only")
        if not report.findings:
            try:
                spec = read_spec(report, request.job_dir, request.task.family)
            except Exception as e:  # a harness bug reaches the agent as a finding
                internal_error(report, e)
        s = request.settings
        job = cls(request, s.cost(), s.policy(), report, spec, t_start, source)
        if request.job_dir != source:  # removed by close(), else when the job is collected or the harness exits
            from agent_trainer.inner_loop.spec.jobfiles import remove_snapshot

            job._remove_snapshot = weakref.finalize(job, remove_snapshot, request.job_dir)
        return job

    def close(self) -> None:
        """Remove the job's snapshot."""
        remove = getattr(self, "_remove_snapshot", None)
        if remove is not None:
            remove()

    @property
    def price_per_hour(self) -> float:
        return self.cost_model.usd_per_hour

    @property
    def deadline_s(self) -> float:
        """The wall-clock safety cap of the training process: ``timeout_s``, else ``safety_cap`` of the seconds
        the validation expects on this machine (before it: the request's, from the task's budget)."""
        est = self.report.wall_estimate
        if self.request.settings.timeout_s or est is None:
            return self.request.deadline_s
        return safety_cap(est.seconds)

    @property
    def agent_files(self) -> bool:
        """The job trains on agent-written data or calls agent-written reward code."""
        return bool(self.spec is not None and (self.spec.uses_agent_code or self.spec.uses_agent_data))

    @property
    def warm_path(self) -> bool:
        """The trainer forks from the pre-imported warm worker: asked for, no sandbox wrapper, no agent files."""
        s = self.request.settings
        return s.warm_workers and s.wrap is None and self.spec is not None and not self.agent_files


def run_job(job_dir: str | Path, task: TaskSpec | str | Path, *, output_dir: str | Path | None = None,
            **settings: Any) -> JobResult:
    """``run_request`` of the job in ``job_dir`` for ``task``; ``settings``: ``JobSettings`` fields."""
    return run_request(JobRequest.of(job_dir, task, output_dir, **settings))


def run_request(request: JobRequest) -> JobResult:
    """Run one job, through the job cache (``agent_trainer.inner_loop.run.cache``) when ``settings.cache``; never raises
    for a job's fault. Every executor runs its requests through this."""
    job = Job.open(request)
    try:
        if request.settings.cache:
            from agent_trainer.inner_loop.run.cache import through_cache

            return through_cache(job, execute)
        return execute(job)
    finally:
        job.close()


def execute(job: Job) -> JobResult:
    """The stages of a job: validate, prepare, train, score, record (no cache)."""
    r = job.request
    res = JobResult(status="invalid", task=r.task.name, family=r.task.family, job_dir=str(job.source_dir or r.job_dir),
                    output_dir=str(r.out), job_hash=job_hash(r.job_dir), hidden_n=r.hidden_n,
                    libraries=library_versions(), hidden_salt=_salt_label())
    if not validate(job, res):
        return record(job, res)
    res.job_hash = job_hash(r.job_dir, job.spec)
    res.base_model, res.algorithm, res.seed = job.spec.base_model, job.spec.strategy_algorithm(), job.spec.seed
    base_dir, wrap, reward_host = prepare(job, res)
    log, saved = train(job, res, base_dir, wrap, reward_host)
    if res.status in ("ok", "timeout") and saved and (r.out / "model").is_dir():
        _check_trained(res, job.spec, r.job_dir, r.out, r.task, r.hidden_n, base_dir)
        with HARNESS_LOCK:
            _score(res, r.out / "model", base_dir, r.settings.cache_dir,
                   eval_device(r.settings.device, r.settings.gpus), for_task(r.task))
            if tracing() and res.hidden_score is not None and not res.flagged:
                from agent_trainer.evaluation.hidden_eval import trace_checkpoint

                append(r.out / TRACE_FILE, trace_checkpoint(r.out / "model", res.family, res.hidden_n,
                                                            device=eval_device(r.settings.device, r.settings.gpus),
                                                            fmt=for_task(r.task)))
    return record(job, res, log)


def validate(job: Job, res: JobResult) -> bool:
    """The validation (``agent_trainer.inner_loop.spec.validate``) into ``res``; False when the job may not run."""
    from agent_trainer.inner_loop.spec.validate import check_spec

    r, s = job.request, job.request.settings
    with HARNESS_LOCK:  # the dry run loads a model in this process
        if job.spec is not None:
            if job.warm_path:
                from agent_trainer.inner_loop.run.worker import warm_context

                warm_context()  # the warm worker's ~10 s of imports overlap the validation
            check_spec(job.report, job.spec, r.job_dir, r.task, dry_run=s.dry_run, cache_dir=s.cache_dir,
                       model_dir=s.model_dir, cost_model=job.cost_model, sandbox=job.policy, output_dir=r.out)
    report = job.report
    res.seconds["validate"] = round(time.monotonic() - job.t_start, 3)
    if job.spec is not None:
        from agent_trainer.inner_loop.isolation.contamination import CheckBudget

        res.checks = {**CheckBudget.of(job.spec, r.job_dir).as_dict(),
                      "seconds": dict(report.probe.get("check_seconds") or {})}
    res.findings = [asdict(f) for f in report.findings]
    est = report.estimated_cost
    res.estimated_usd = est.usd if est else None
    if report.ok and job.spec is not None:
        return True
    over = est is not None and report.over_budget
    res.status = "over_budget" if over else "invalid"
    res.detail = (f"estimated ${est.usd:.4f} is over the task's ${r.task.budget.max_usd} cap; not run" if over
                  else f"{len(report.errors)} validation error(s); nothing was trained")
    return False


def prepare(job: Job, res: JobResult):
    """The base model's folder, and for a job with agent files: the contamination check, the sandbox wrapper
    of the training process and the reward host of agent code. Returns ``(base_dir, wrap, reward_host)``."""
    r, s, spec = job.request, job.request.settings, job.spec
    base_dir = Path(s.model_dir) if s.model_dir else _base_model_dir(spec.base_model, s.cache_dir)
    wrap, reward_host = s.wrap, None
    if job.agent_files:
        from agent_trainer.inner_loop.isolation.contamination import check_job
        from agent_trainer.inner_loop.isolation.reward_proxy import RewardHost
        from agent_trainer.inner_loop.isolation.sandbox import trainer_wrapper

        with _timed(res, "job"):
            found = check_job(spec, r.job_dir, r.task.family, r.hidden_n, model_dir=base_dir, fmt=for_task(r.task))
        res.flagged, res.contamination = found.flagged, found.to_dict()
        res.sandbox = "bwrap" if job.policy.use_bwrap() else "unsafe"
        if wrap is None and res.sandbox == "bwrap":
            r.out.mkdir(parents=True, exist_ok=True)
            wrap = trainer_wrapper(job.policy, job_dir=r.job_dir, output_dir=r.out, model_dir=base_dir,
                                   deadline_s=job.deadline_s, threads=s.threads, gpus=job_gpus(s.device, s.gpus))
        if spec.uses_agent_code:
            if not res.flagged:
                from agent_trainer.inner_loop.isolation.reward_oracle import oracle_check

                render, tokenize = _as_trained(base_dir, r.task)
                with _timed(res, "oracle"):
                    oracle = oracle_check(spec, r.job_dir, r.task.family, r.hidden_n, job.policy, render=render,
                                          tokenize=tokenize, budget_steps=r.task.budget.max_steps)
                res.flagged = oracle.flagged
                res.contamination = {**res.contamination, "reward_oracle": oracle.to_dict()}
            reward_host = RewardHost(job.policy, r.job_dir, r.out / "reward.log", deadline_s=job.deadline_s)
    return base_dir, wrap, reward_host


def _as_trained(base_dir: Path, task):
    """``(render, tokenize)``: a prompt as the trainer passes it to reward functions (in the task's format, by the
    base model's tokenizer) and a completion's token ids as GRPO passes them (``completion_ids``: its tokens and
    eos), so the reward-oracle check's calls carry what training's do."""
    from agent_trainer.evaluation.prompts import RAW, render
    from agent_trainer.inner_loop.models import load_tokenizer

    fmt = for_task(task)
    tokenizer = load_tokenizer(base_dir)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def tokenize(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] + eos

    return (lambda prompt: prompt) if fmt == RAW else (lambda prompt: render(tokenizer, prompt, fmt)), tokenize


def train(job: Job, res: JobResult, base_dir: Path, wrap, reward_host) -> tuple[list[dict], bool]:
    """The training process (``agent_trainer.inner_loop.run.worker``), its outcome into ``res``; returns its train log
    and whether it reported a saved model. A process killed at the wall-clock safety cap is the job's ``timeout``
    when its CPU seconds ran far past its price (``worker.job_fault``: its own rows or settings), not retried;
    otherwise an infrastructure fault, run once more, and a second kill leaves the job ``infra_timeout``."""
    from agent_trainer.inner_loop.run.worker import Training, read_jsonl, run_worker

    r, s = job.request, job.request.settings
    est, wall = job.report.estimated_cost, job.report.wall_estimate
    training = Training.of(r, job.spec, base_dir, est)
    for _ in range(2):
        run = run_worker(training, deadline_s=job.deadline_s, progress=s.progress, wrap=wrap, warm=job.warm_path,
                         reward_host=reward_host, expected_s=wall.seconds if wall is not None else None,
                         stage_step_s=[step for step, _ in wall.stages] if wall is not None else None)
        if not run.killed or run.status.get("status") != "infra_timeout":
            break
    st = run.status
    res.status, res.device, res.cpu = st.get("status", "crashed"), st.get("device"), st.get("cpu") or {}
    res.detail, res.error = st.get("detail", ""), st.get("error", "")
    if run.killed:   # the evidence of the fault rule (only then: a clean job's metrics stay as they were)
        res.seconds["process_cpu"] = run.cpu_seconds
        if res.status == "infra_timeout":
            res.detail += "; it was killed on both tries"
    res.steps, res.planned_steps = int(st.get("steps") or 0), int(st.get("planned_steps") or 0)
    res.seconds["train"], res.seconds["process"] = float(st.get("seconds") or 0.0), run.wall_seconds
    log = read_jsonl(r.out / "train_log.jsonl")
    if log:  # a crash mid-run leaves the steps it made in the log only
        res.steps = max(res.steps, int(log[-1].get("step", 0)))
    if est is not None:   # the speed stage's clock: the compute of what the job asked for (no load, no machine)
        res.seconds["train_estimated"] = est.train_seconds()
        res.seconds["estimated"] = est.seconds   # the whole job's, start-up included: what the ledger charges
    res.ran = _ran(st.get("ran"), log)
    res.reward_curve, res.loss_curve = _curve(log, "reward"), _curve(log, "loss")
    res.final_train_reward = res.reward_curve[-1][1] if res.reward_curve else None
    res.final_train_loss = res.loss_curve[-1][1] if res.loss_curve else None
    return log, bool(st.get("model_dir"))


def record(job: Job, res: JobResult, log: list[dict] = ()) -> JobResult:
    """Total seconds and USD, ``result.json``, and the tracker (when the request has one)."""
    out, tracker = job.request.out, job.request.settings.tracker
    res.seconds["total"] = round(time.monotonic() - job.t_start, 3)
    res.usd = round(res.seconds["total"] / 3600 * job.price_per_hour, 6)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / RESULT_FILE, res.as_dict())
    if tracker is not None:
        track_result(tracker, res, out, log)
    return res


def prestart_warm_worker(job_dir: Path, task_family: str | None = None) -> None:
    """Start the warm-worker forkserver now, so that its ~10 s of imports overlap what a command does before
    its job runs. Only for a job that will take the warm path (no agent-written code or data); once per process."""
    from agent_trainer.inner_loop.spec.jobspec import JobSpecError, load_job
    from agent_trainer.inner_loop.run.worker import warm_context

    try:
        spec = load_job(job_dir, task_family)
    except JobSpecError:
        return
    if not (spec.uses_agent_code or spec.uses_agent_data):
        warm_context()


def _salt_label() -> str:
    from agent_trainer.salt import hidden_salt

    return hidden_salt().label


@contextlib.contextmanager
def _timed(res: JobResult, check: str):
    """The wall seconds of one check into ``res.checks["seconds"][check]`` (``result.json``)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        res.checks.setdefault("seconds", {})[check] = round(time.monotonic() - t0, 3)


def _check_trained(res: JobResult, spec, job_dir: Path, out: Path, task, hidden_n: int, base_dir: Path) -> None:
    """Flag the job when the rows its process trained on are not its declared rows or hold hidden items."""
    from agent_trainer.inner_loop.isolation.contamination import check_trained

    with _timed(res, "trained"):
        after = check_trained(spec, job_dir, out, task.family, hidden_n,
                              stages_run=len(res.ran.get("stages", [])) or None, model_dir=base_dir,
                              fmt=for_task(task))
    if after.error:   # fails closed: the job scores as its baseline, and the harness says why
        log.warning("job %s: the trained-rows check could not finish (%s); the job is flagged", res.job_dir,
                    after.error)
    if after.flagged:
        res.flagged = True
        res.contamination = {**res.contamination, "trained": after.to_dict()}


def _score(res: JobResult, checkpoint: Path, base_dir: Path, cache_dir, device: str = "cpu", fmt=None) -> None:
    """Hidden score, baseline and uplift of a saved checkpoint (in this, the harness, process).

    The checkpoint is loaded only after its lineage check; a flagged job is not scored at all: its
    hidden score is its baseline (uplift 0)."""
    from agent_trainer.evaluation.hidden_eval import score_checkpoint
    from agent_trainer.evaluation.lineage import lineage_mismatch
    from agent_trainer.evaluation.prompts import RAW

    why = lineage_mismatch(checkpoint, base_dir)  # plain safetensors, config, shapes, tokenizer equal to the base's
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
