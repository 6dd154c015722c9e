"""Job executors: how a batch of inner jobs runs (one interface; the outer loop does not know which).

    >>> ex = make_executor("local_parallel", max_parallel=2)
    >>> results = ex.run([JobRequest.of(d, spec, out, settings=settings), ...])   # agent_trainer.inner_loop.run.request
    >>> ex.plan(requests)                                                        # what would run (dry_run)

Kinds: ``sequential``, ``local_parallel`` (threads waiting on the jobs' own processes; on GPUs each
running job holds ``gpus_per_job`` of them), ``submitit_local``, ``slurm``, ``ray``
(``agent_trainer.inner_loop.run.launchers``). Results come back in request order. docs/scale_out.md, "Executors: the
Python side".
"""

from __future__ import annotations

import os
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from agent_trainer.registry import Registry
from agent_trainer.inner_loop.run.job_env import gpu_ids, usable_cores

if TYPE_CHECKING:
    from agent_trainer.inner_loop.run.request import JobRequest


def visible_gpus() -> list[str]:
    """The GPU ids this process may use, as the machine numbers them (its ``CUDA_VISIBLE_DEVICES``, else all)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return gpu_ids(env)
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch CUDA runtime: no GPU
        return []


def gpu_slots(gpus_per_job: int, max_parallel: int, gpus: list[str] | None = None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` values for up to ``max_parallel`` concurrent jobs of ``gpus_per_job`` GPUs each.

    Raises when not even one job's worth of GPUs is visible (a GPU config on a machine without them)."""
    gpus = visible_gpus() if gpus is None else gpus
    n = min(max_parallel, len(gpus) // gpus_per_job) if gpus_per_job > 0 else 0
    if n < 1:
        raise RuntimeError(f"{gpus_per_job} GPU(s) per job, but this process sees {len(gpus)} "
                           f"({', '.join(gpus) or 'none'}); use hardware=cpu or fewer gpus_per_job")
    return [",".join(gpus[i * gpus_per_job:(i + 1) * gpus_per_job]) for i in range(n)]


class SequentialExecutor:
    """Run jobs one at a time."""

    kind = "sequential"

    def __init__(self, max_parallel: int = 1, threads: int | None = None):
        self.max_parallel, self.threads = 1, threads

    def plan(self, requests: list[JobRequest] = ()) -> dict[str, Any]:
        return {"executor": self.kind, "max_parallel": 1, "threads_per_job": self.threads or "torch default"}

    def run(self, requests: list[JobRequest]) -> list:
        from agent_trainer.inner_loop.run.job import run_request
        from agent_trainer.inner_loop.run.request import with_threads

        return [run_request(r) for r in with_threads(requests, self.threads)]


class LocalParallelExecutor:
    """Run up to ``max_parallel`` jobs at once on this machine."""

    kind = "local_parallel"

    def __init__(self, max_parallel: int = 2, threads: int | None = None, gpus_per_job: int = 0):
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.max_parallel, self.threads, self.gpus_per_job = max_parallel, threads, gpus_per_job

    @staticmethod
    def _on_gpu(requests) -> bool:
        """Whether some job needs a GPU slot (``auto`` only where this process sees a GPU)."""
        wants = {r.settings.device for r in requests if r.settings.gpus is None} - {"cpu"}
        return "cuda" in wants or ("auto" in wants and bool(visible_gpus()))

    def plan(self, requests: list[JobRequest] = ()) -> dict[str, Any]:
        threads = self.threads or max(1, usable_cores() // self.max_parallel)
        out = {"executor": self.kind, "max_parallel": self.max_parallel, "threads_per_job": threads}
        if self.gpus_per_job > 0 and self._on_gpu(requests):
            try:
                out["gpu_slots"] = gpu_slots(self.gpus_per_job, self.max_parallel)
            except RuntimeError as e:
                out["gpu_slots"] = f"none: {e}"
        return out

    def run(self, requests: list[JobRequest]) -> list:
        from agent_trainer.inner_loop.run.job import run_request
        from agent_trainer.inner_loop.run.request import with_threads
        from agent_trainer.inner_loop.run.worker import stop_jobs_on_error

        reqs = with_threads(requests, self.threads or max(1, usable_cores() // self.max_parallel))
        if not (self.gpus_per_job > 0 and self._on_gpu(reqs)):
            with ThreadPoolExecutor(max_workers=self.max_parallel, thread_name_prefix="inner-job") as pool, \
                    stop_jobs_on_error(pool):
                return list(pool.map(run_request, reqs))
        free: queue.Queue[str] = queue.Queue()
        slots = gpu_slots(self.gpus_per_job, self.max_parallel)
        for slot in slots:
            free.put(slot)

        def on_gpus(r: JobRequest):
            if not self._on_gpu([r]):
                return run_request(r)
            slot = free.get()   # never waits long: at most len(slots) jobs run at once
            try:
                return run_request(r.with_settings(gpus=slot))
            finally:
                free.put(slot)

        with ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="inner-job") as pool, \
                stop_jobs_on_error(pool):
            return list(pool.map(on_gpus, reqs))


def _submitit(cluster: str):
    def make(**options):
        from agent_trainer.inner_loop.run.launchers import SubmititExecutor

        return SubmititExecutor, {**options, "cluster": cluster}
    return make


def _ray(**options):
    from agent_trainer.inner_loop.run.launchers import RayExecutor

    return RayExecutor, options


# kind -> options -> (executor class, its options); no engine is imported before ``run``.
EXECUTORS: Registry[Callable[..., tuple[type, dict]]] = Registry("executor", hint="set hardware.executor")
for _kind, _make in (("sequential", lambda **o: (SequentialExecutor, o)),
                     ("local_parallel", lambda **o: (LocalParallelExecutor, o)),
                     ("submitit_local", _submitit("local")), ("slurm", _submitit("slurm")), ("ray", _ray)):
    EXECUTORS.register(_kind, _make)


def make_executor(kind: str = "sequential", max_parallel: int = 1, **options: Any):
    """The executor called ``kind`` (none of them imports its engine before ``run``).

    ``options``: ``threads`` (torch threads per job) for all; for ``submitit_local``/``slurm``:
    ``folder``, ``partition``, ``gpus_per_job``, ``cpus_per_job``, ``mem_gb``, ``time_limit_min``,
    ``additional`` (extra sbatch options), ``jobs_per_task``, ``poll_s``; for ``ray``: ``address``,
    ``gpus_per_job``, ``cpus_per_job``, ``init_kwargs`` (``ray.init`` keywords). Options an executor does not take
    are ignored."""
    import inspect

    cls, options = EXECUTORS[kind](**options)
    accepted = inspect.signature(cls.__init__).parameters
    return cls(max_parallel=max_parallel, **{k: v for k, v in options.items() if k in accepted})
