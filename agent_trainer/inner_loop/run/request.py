"""What one inner job is asked to do: a ``JobRequest`` (job folder, task, output folder) and its ``JobSettings``.

    settings = JobSettings(cache_dir="~/.cache/agent-trainer", threads=1, cache=True)
    request = JobRequest.of("examples/jobs/sft_full", "examples/tasks/calc_chain_v1_fast.json", settings=settings)
    result = run_request(request)                   # agent_trainer.inner_loop.run.job; executors take lists of requests

Settings are plain, picklable values (SLURM and Ray ship requests to other machines); the outer loop
builds one ``JobSettings`` from the inner and hardware config groups (``agent_trainer.outer_loop.rl.run_config``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agent_trainer.evaluation.tasks import TaskSpec, load_task

# The hard kill deadline of a job without ``timeout_s``: the task's training budget x 1.5 + 60 s.
KILL_FACTOR, KILL_MARGIN_S = 1.5, 60.0
_PATHS = ("cache_dir", "model_dir")


@dataclass(frozen=True)
class JobSettings:
    """How a job runs; every field is optional.

    ``cache_dir``: the cache root (models, baselines, jobs); ``model_dir``: this base-model folder instead
    of resolving the job's ``base_model``; ``hidden_n``: hidden items scored (default: the task's);
    ``timeout_s``: the hard kill deadline (default: ``KILL_FACTOR``/``KILL_MARGIN_S`` of the task's budget);
    ``price_per_hour``: USD per hour of this machine (default: ``cost_model``'s); ``cost_model``
    (``agent_trainer.inner_loop.spec.cost.CostModel``): the validation's estimate (default: this machine's measured
    profile); ``threads``: torch threads of the training process; ``dry_run``: validation probes the base model;
    ``progress``: a progress bar; ``warm``: fork the trainer from a pre-imported worker (jobs without agent
    code or data); ``cache``: return the stored result of an identical job (``agent_trainer.inner_loop.run.cache``);
    ``sandbox``: ``agent_trainer.inner_loop.isolation.sandbox.SandboxPolicy`` (or a dict of its fields, a bool, None:
    the default); ``device``: ``cpu``, ``cuda`` or ``auto``; ``gpus``: the job's ``CUDA_VISIBLE_DEVICES`` (None: this
    process's); ``vllm``: GRPO generation through vLLM; ``wrap``: turns the trainer's argv into a sandboxed
    one; ``tracker``: anything with ``log_params``/``log_metrics``/``log_artifact``.
    """

    cache_dir: str | Path | None = None
    model_dir: str | Path | None = None
    hidden_n: int | None = None
    timeout_s: float | None = None
    price_per_hour: float | None = None
    cost_model: Any = None
    threads: int | None = None
    dry_run: bool = True
    progress: bool = True
    warm: bool = False
    cache: bool = False
    sandbox: Any = None
    device: str = "cpu"
    gpus: str | None = None
    vllm: bool = False
    wrap: Callable[[list[str]], list[str]] | None = None
    tracker: Any = None

    def replace(self, **changes: Any) -> "JobSettings":
        return dataclasses.replace(self, **changes)

    def cost(self):
        """The cost model this job is priced with (``price_per_hour`` overrides its rate)."""
        from agent_trainer.inner_loop.spec.cost import CostModel

        model = self.cost_model or CostModel.measured(self.device, self.cache_dir)
        if self.price_per_hour is not None:
            model = dataclasses.replace(model, usd_per_hour=self.price_per_hour)
        return model

    def policy(self):
        """The sandbox policy (``agent_trainer.inner_loop.isolation.sandbox.SandboxPolicy``)."""
        from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy

        return SandboxPolicy.coerce(self.sandbox)


@dataclass(frozen=True)
class JobRequest:
    """One job: its folder, the task it is for, where its outputs go (default ``<job>/output``), how it runs."""

    job_dir: Path
    task: TaskSpec
    output_dir: Path | None = None
    settings: JobSettings = field(default_factory=JobSettings)

    @classmethod
    def of(cls, job_dir: str | Path, task: TaskSpec | str | Path, output_dir: str | Path | None = None,
           settings: JobSettings | None = None, **changes: Any) -> "JobRequest":
        """A request from paths (a task spec file is loaded); ``changes`` are ``JobSettings`` fields."""
        settings = settings or JobSettings()
        if changes:
            settings = settings.replace(**changes)
        return cls(Path(job_dir), task if isinstance(task, TaskSpec) else load_task(task),
                   Path(output_dir) if output_dir else None, settings)

    @property
    def out(self) -> Path:
        """The output folder (``result.json``, logs, ``model/``)."""
        return self.output_dir or self.job_dir / "output"

    @property
    def hidden_n(self) -> int:
        return self.settings.hidden_n or self.task.hidden_eval_size

    @property
    def deadline_s(self) -> float:
        """Seconds after which the training process is killed."""
        return self.settings.timeout_s or self.task.budget.max_seconds * KILL_FACTOR + KILL_MARGIN_S

    def with_settings(self, **changes: Any) -> "JobRequest":
        return dataclasses.replace(self, settings=self.settings.replace(**changes))

    def absolute(self) -> "JobRequest":
        """The request with its paths absolute (a SLURM or Ray worker may start in another folder)."""
        paths = {k: Path(getattr(self.settings, k)).resolve() for k in _PATHS if getattr(self.settings, k)}
        return dataclasses.replace(self, job_dir=self.job_dir.resolve(), output_dir=self.out.resolve(),
                                   settings=self.settings.replace(**{k: str(v) for k, v in paths.items()}))


def with_threads(requests: list[JobRequest], threads: int | None) -> list[JobRequest]:
    """The requests, those without a ``threads`` setting of their own given ``threads``."""
    return [r.with_settings(threads=threads) if r.settings.threads is None and threads else r for r in requests]
