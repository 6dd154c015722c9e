"""Job executors: how a batch of inner jobs runs (one interface; the outer loop does not know which).

    >>> ex = make_executor("local_parallel", max_parallel=2)
    >>> results = ex.run([{"job_dir": d, "task": spec, "output_dir": out}, ...])   # run_job kwargs

- ``sequential``: one job after the other in this process's thread.
- ``local_parallel``: up to ``max_parallel`` jobs at once. Each job's training already runs in its
  own child process (``inner_loop.worker``), so threads here only wait on those children and run
  the harness's scoring; torch threads per job default to cores / max_parallel.
- ``submitit_local``, ``slurm``, ``ray``: the scale-out engines (``inner_loop.launchers``).

Results come back in the order of the requests, whatever order the jobs finish in. Every executor
also has ``plan(requests)``: what it would run, without running it (``dry_run=true``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class SequentialExecutor:
    """Run jobs one at a time."""

    kind = "sequential"

    def __init__(self, max_parallel: int = 1, threads: int | None = None):
        self.max_parallel, self.threads = 1, threads

    def plan(self, requests: list[dict[str, Any]] = ()) -> dict[str, Any]:
        return {"executor": self.kind, "max_parallel": 1, "threads_per_job": self.threads or "torch default"}

    def run(self, requests: list[dict[str, Any]]) -> list:
        from inner_loop.job import run_job

        return [run_job(**({"threads": self.threads, **r} if r.get("threads") is None else r)) for r in requests]


class LocalParallelExecutor:
    """Run up to ``max_parallel`` jobs at once on this machine."""

    kind = "local_parallel"

    def __init__(self, max_parallel: int = 2, threads: int | None = None):
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.max_parallel, self.threads = max_parallel, threads

    def plan(self, requests: list[dict[str, Any]] = ()) -> dict[str, Any]:
        threads = self.threads or max(1, (os.cpu_count() or 1) // self.max_parallel)
        return {"executor": self.kind, "max_parallel": self.max_parallel, "threads_per_job": threads}

    def run(self, requests: list[dict[str, Any]]) -> list:
        from inner_loop.job import run_job

        threads = self.threads or max(1, (os.cpu_count() or 1) // self.max_parallel)
        reqs = [{"threads": threads, **r} if r.get("threads") is None else r for r in requests]
        with ThreadPoolExecutor(max_workers=self.max_parallel, thread_name_prefix="inner-job") as pool:
            return list(pool.map(lambda r: run_job(**r), reqs))


EXECUTORS = ("sequential", "local_parallel", "submitit_local", "slurm", "ray")


def make_executor(kind: str = "sequential", max_parallel: int = 1, **options: Any):
    """The executor called ``kind`` (none of them imports its engine before ``run``).

    ``options``: ``threads`` (torch threads per job) for all; for ``submitit_local``/``slurm``:
    ``folder``, ``partition``, ``gpus_per_job``, ``cpus_per_job``, ``mem_gb``, ``time_limit_min``,
    ``additional`` (extra sbatch options); for ``ray``: ``address``, ``gpus_per_job``, ``cpus_per_job``,
    ``init_kwargs`` (``ray.init`` keywords). Options an executor does not take are ignored."""
    import inspect

    from inner_loop import launchers

    if kind not in EXECUTORS:
        raise ValueError(f"unknown executor {kind!r}; use one of: {', '.join(EXECUTORS)}")
    if kind in ("submitit_local", "slurm"):
        cls, options = launchers.SubmititExecutor, {**options, "cluster": "local" if kind == "submitit_local" else "slurm"}
    else:
        cls = {"sequential": SequentialExecutor, "local_parallel": LocalParallelExecutor,
               "ray": launchers.RayExecutor}[kind]
    accepted = inspect.signature(cls.__init__).parameters
    return cls(max_parallel=max_parallel, **{k: v for k, v in options.items() if k in accepted})
