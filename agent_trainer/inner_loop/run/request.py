"""What one inner job is asked to do: a ``JobRequest`` (job folder, task, output folder) and its ``JobSettings``.

    settings = JobSettings(cache_dir="~/.cache/agent-trainer", threads=1, cache=True)
    request = JobRequest.of("examples/jobs/sft_full", "examples/tasks/calc_chain_v1_fast.json", settings=settings)
    result = run_request(request)                   # agent_trainer.inner_loop.run.job; executors take lists of requests

Settings are plain, picklable values (SLURM and Ray ship requests to other machines); the outer loop
builds one ``JobSettings`` from the inner and hardware config groups (``JobSettings.from_config``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agent_trainer.config import Config, HardwareConfig, InnerConfig
from agent_trainer.evaluation.tasks import TaskSpec, load_task

# The wall-clock safety cap of a job's training process without ``timeout_s``: KILL_FACTOR times the seconds this
# machine is expected to take (start-up included) plus KILL_MARGIN_S, well above the estimate: a busy machine
# runs jobs 2-5x slower, and hitting the cap is an infrastructure fault (status ``infra_timeout``), never a score.
KILL_FACTOR, KILL_MARGIN_S = 4.0, 180.0
_PATHS = ("cache_dir", "model_dir")


@dataclass(frozen=True)
class JobSettings:
    """How a job runs; every field is optional. A field the config sets has the schema's default
    (``agent_trainer.config``: ``cache_dir``, ``inner.*``, ``hardware.*``; ``from_config`` maps them).

    ``cache_dir``: the cache root (models, baselines, jobs); ``model_dir``: this base-model folder instead
    of resolving the job's ``base_model``; ``hidden_n``: hidden items scored (default: the task's);
    ``timeout_s``: the wall-clock safety cap (default: ``safety_cap`` of the job's estimated seconds);
    ``price_per_hour``: USD per hour of this machine (default: ``cost_model``'s); ``cost_model``
    (``agent_trainer.inner_loop.spec.cost.CostModel``): the validation's estimate (default: this machine's measured
    profile); ``threads``: torch threads of the training process; ``dry_run``: validation probes the base model;
    ``progress``: a progress bar; ``warm_workers``: fork the trainer from a pre-imported worker (jobs without
    agent code or data); ``cache``: return the stored result of an identical job
    (``agent_trainer.inner_loop.run.cache``);
    ``sandbox``: ``agent_trainer.inner_loop.isolation.sandbox.SandboxPolicy`` (or a dict of its fields, a bool, None:
    the default); ``device``: ``cpu``, ``cuda`` or ``auto``; ``gpus``: the job's ``CUDA_VISIBLE_DEVICES`` (None: this
    process's); ``vllm``: GRPO generation through vLLM; ``wrap``: turns the trainer's argv into a sandboxed
    one; ``tracker``: anything with ``log_params``/``log_metrics``/``log_artifact``.
    """

    cache_dir: str | Path | None = Config.cache_dir
    model_dir: str | Path | None = None
    hidden_n: int | None = InnerConfig.eval_size
    timeout_s: float | None = InnerConfig.timeout_s
    price_per_hour: float | None = None   # None: the cost model's rate (the config always gives hardware.usd_per_hour)
    cost_model: Any = None
    threads: int | None = HardwareConfig.threads_per_job
    dry_run: bool = True
    progress: bool = True
    warm_workers: bool = InnerConfig.warm_workers
    cache: bool = InnerConfig.cache
    sandbox: Any = None
    device: str = HardwareConfig.device.value
    gpus: str | None = None
    vllm: bool = HardwareConfig.inner_vllm
    wrap: Callable[[list[str]], list[str]] | None = None
    tracker: Any = None

    @classmethod
    def from_config(cls, c: Config, **changes: Any) -> "JobSettings":
        """The settings of every job of a validated config (``agent_trainer.config.validate``): ``cache_dir``, the
        ``inner`` and ``hardware`` groups; ``changes`` sets the fields no config holds (``tracker``, ``progress``)."""
        from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy

        i, h = c.inner, c.hardware
        return cls(cache_dir=c.cache_dir, hidden_n=i.eval_size, timeout_s=i.timeout_s, price_per_hour=h.usd_per_hour,
                   threads=h.threads_per_job, warm_workers=i.warm_workers, cache=i.cache, device=h.device.value,
                   vllm=h.inner_vllm, sandbox=SandboxPolicy.from_config(i).as_dict(), **changes)

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
        """The most seconds the training process may take before the job is estimated (a job admitted within
        the task's compute budget on the reference machine); ``Job.deadline_s`` is the estimate's cap."""
        return self.settings.timeout_s or safety_cap(self.task.budget.max_seconds)

    def with_settings(self, **changes: Any) -> "JobRequest":
        return dataclasses.replace(self, settings=self.settings.replace(**changes))

    def absolute(self) -> "JobRequest":
        """The request with its paths absolute (a SLURM or Ray worker may start in another folder)."""
        paths = {k: Path(getattr(self.settings, k)).resolve() for k in _PATHS if getattr(self.settings, k)}
        return dataclasses.replace(self, job_dir=self.job_dir.resolve(), output_dir=self.out.resolve(),
                                   settings=self.settings.replace(**{k: str(v) for k, v in paths.items()}))


def safety_cap(expected_seconds: float) -> float:
    """The wall-clock safety cap of a training process expected to take ``expected_seconds`` here."""
    return round(KILL_FACTOR * expected_seconds + KILL_MARGIN_S, 1)


def with_threads(requests: list[JobRequest], threads: int | None) -> list[JobRequest]:
    """The requests, those without a ``threads`` setting of their own given ``threads``."""
    return [r.with_settings(threads=threads) if r.settings.threads is None and threads else r for r in requests]
