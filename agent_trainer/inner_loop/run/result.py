"""The record of one inner job: ``JobResult``, its ``result.json``, what identifies the job, how it is tracked.

Shared by the job runner (``agent_trainer.inner_loop.run.job``), the job cache (``agent_trainer.inner_loop.run.cache``)
and the scale-out launchers (``agent_trainer.inner_loop.run.launchers``), which all write results.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
# ``timeout``: the compute budget ran out while training (the model is scored); ``infra_timeout``: the wall-clock
# safety cap killed the training process twice, an infrastructure fault that the staged reward leaves out.
STATUSES = ("ok", "invalid", "over_budget", "crashed", "timeout", "diverged", "infra_timeout")
_LIBRARIES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "tokenizers")


@dataclass
class JobResult:
    """Everything the harness knows about one job; ``visible()`` is the agent's share of it."""

    status: str
    task: str
    family: str
    job_dir: str
    output_dir: str
    job_hash: str
    base_model: str | None = None
    algorithm: str | None = None
    seed: int | None = None
    findings: list[dict] = field(default_factory=list)
    detail: str = ""
    error: str = ""
    steps: int = 0
    planned_steps: int = 0
    final_train_reward: float | None = None
    final_train_loss: float | None = None
    reward_curve: list[list[float]] = field(default_factory=list)
    loss_curve: list[list[float]] = field(default_factory=list)
    hidden_score: float | None = None
    baseline: float | None = None
    uplift: float | None = None
    hidden_n: int = 0
    # train: the training loop; process: the child's whole life (imports, data, training, saving);
    # eval: hidden score and baseline; validate: the harness's validation; total: everything (wall
    # seconds, measured). train_estimated (a job that ran): the compute of the training the job asked for
    # (agent_trainer.inner_loop.spec.cost), the same on every machine and run: the speed stage reads it;
    # estimated: the whole job's compute, start-up included: what the ledger charges against the budget caps.
    seconds: dict = field(default_factory=lambda: {"validate": 0.0, "train": 0.0, "process": 0.0, "eval": 0.0,
                                                   "total": 0.0})
    estimated_usd: float | None = None
    usd: float = 0.0
    libraries: dict = field(default_factory=dict)
    # What actually ran, from the job's process (agent_trainer.inner_loop.train.stages): {"stages": [{"algorithm":
    # sft|grpo|dpo, "peft": full|lora, "data_source": curated|self_generated|mixed|agent, "steps": int}]}.
    ran: dict = field(default_factory=lambda: {"stages": []})
    # Job cache (agent_trainer.inner_loop.run.cache): a hit is ``cached`` (its numbers come from the run in
    # ``cached_from``; seconds["total"] and usd are the lookup's); ``cache_key`` is set whenever the cache was asked.
    cached: bool = False
    cache_key: str | None = None
    cached_from: str | None = None
    # Reward-hacking guards (harness-only, never in visible()): agent data that contains hidden items
    # (agent_trainer.evaluation.contamination) flags the job: it scores as its baseline, uplift 0. ``sandbox``: how the
    # job's process ran, "bwrap", "unsafe" (allowed by inner.allow_unsafe) or "none" (no agent files).
    flagged: bool = False
    contamination: dict = field(default_factory=dict)
    # The checking children's limits, by the job's size (isolation.contamination.CheckBudget: mb, rows,
    # cpu_limit_s, wall_limit_s), and each check's wall seconds in the harness (seconds: parse, job, oracle, trained).
    checks: dict = field(default_factory=dict)
    sandbox: str = "none"
    # The salt of the hidden set it was scored on (agent_trainer.salt): "public", "public:NAME" or
    # "secret:<digest prefix>" (never the secret).
    hidden_salt: str = "public"
    # Where the job's process trained (``cpu`` or ``cuda``; None when nothing was trained).
    device: str | None = None
    # The float kernels the job's process trained with, as that process saw them (agent_trainer.kernels.cpu_kind:
    # architecture, vendor, torch's level, MKL/oneDNN settings; {} when no process started). Never in visible().
    cpu: dict = field(default_factory=dict)
    # Where the job ran when an engine ran it (agent_trainer.inner_loop.run.launchers): SLURM's job, array task,
    # node and submitit's log files; Ray's node, worker and log folder. {} for jobs run on this machine.
    placement: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def train_seconds(self) -> float:
        """The training seconds the staged reward's speed stage uses: the compute of the training the job asked
        for (``seconds["train_estimated"]``), else (a result without it) the measured ones.

        Not the wall clock: on a shared machine the measured seconds of the same job move by tens of percent
        with the load, so two runs of one seed would reward the same jobs differently, and with std-scaled
        group advantages such differences decide ties: the runs would part from step 1."""
        return float(self.seconds.get("train_estimated", self.seconds.get("train", 0.0)))

    @property
    def charged_seconds(self) -> float:
        """The seconds the run's ledger charges against its budget caps: the compute estimate of the whole job it
        was admitted to train (``seconds["estimated"]``), whatever its status after and whether it ran or came
        from the job cache; 0 for a job that never trained (invalid, over budget); the measured total for a
        result without the estimate. Deterministic: a slow or busy machine cannot spend a budget sooner."""
        if "estimated" in self.seconds:
            return float(self.seconds["estimated"])
        if self.status in ("invalid", "over_budget"):
            return 0.0
        return float(self.seconds.get("total", 0.0))

    def outcome(self, budget_seconds: float):
        """The staged reward's input (``agent_trainer.evaluation.staged_reward.JobOutcome``) for a task of
        ``budget_seconds``."""
        from agent_trainer.evaluation.staged_reward import JobOutcome

        return JobOutcome(status=self.status, post_score=self.hidden_score, baseline=self.baseline,
                          train_seconds=self.train_seconds, budget_seconds=float(budget_seconds),
                          flagged=self.flagged)

    def visible(self) -> dict[str, Any]:
        """What an agent may see: status, findings, errors of its own code, training curves, time and cost.

        Never the hidden score, the baseline or the uplift; time and cost as compute (``train_seconds``, the
        validation's dollars), never the clock: what an agent reads must not depend on the machine or its load.
        """
        return {"status": self.status, "detail": self.detail, "error": self.error, "findings": self.findings,
                "steps": self.steps, "planned_steps": self.planned_steps,
                "final_train_reward": self.final_train_reward, "final_train_loss": self.final_train_loss,
                "reward_curve": self.reward_curve, "loss_curve": self.loss_curve,
                "seconds": {"train": self.train_seconds}, "usd": self.estimated_usd or 0.0, "ran": self.ran}


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape a job's numbers (read from metadata: no imports)."""
    out = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def job_hash(job_dir: Path, spec=None) -> str:
    """sha256 over the files the job uses (``job.yaml``, its data and reward files), by name and content."""
    names = ["job.yaml"]
    if spec is not None:
        names += spec.agent_files()  # every stage's data and reward files
    h = hashlib.sha256()
    for name in names:
        p = Path(job_dir) / name
        h.update(name.encode() + b"\0")
        if p.is_file():
            with open(p, "rb") as f:  # in chunks: a job file may be large before the validation refuses it
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        else:
            h.update(b"<missing>")
        h.update(b"\0")
    return h.hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file, so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def track_result(tracker, res: JobResult, out: Path, log) -> None:
    """Params, per-step training metrics, final metrics and the job's files, to MLflow (or any tracker)."""
    tracker.log_params({"job.hash": res.job_hash, "job.status": res.status, "job.task": res.task,
                        "job.base_model": res.base_model, "job.algorithm": res.algorithm, "job.seed": res.seed,
                        "job.flagged": res.flagged, "job.sandbox": res.sandbox,
                        **{f"lib.{k}": v for k, v in res.libraries.items()}})
    for rec in log:
        tracker.log_metrics({f"train/{k}": v for k, v in rec.items()
                             if k != "step" and "/" not in k and isinstance(v, (int, float))}, step=rec["step"])
    final = {"job/hidden_score": res.hidden_score, "job/baseline": res.baseline, "job/uplift": res.uplift,
             "job/steps": res.steps, "job/final_train_reward": res.final_train_reward, "job/usd": res.usd,
             "job/flagged": float(res.flagged), "job/contaminated_items": float(res.contamination.get("hits", 0)),
             **{f"job/seconds_{k}": v for k, v in res.seconds.items()}}
    tracker.log_metrics(final, step=res.steps)
    for name in (RESULT_FILE, "train_log.jsonl", "trl_config.json"):
        if (out / name).is_file():
            tracker.log_artifact(out / name)
