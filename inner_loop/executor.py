"""Job executors: how a batch of inner jobs runs (one interface; the outer loop does not know which).

    >>> ex = make_executor("local_parallel", max_parallel=2)
    >>> results = ex.run([{"job_dir": d, "task": spec, "output_dir": out}, ...])   # run_job kwargs

- ``sequential``: one job after the other in this process's thread.
- ``local_parallel``: up to ``max_parallel`` jobs at once. Each job's training already runs in its
  own child process (``inner_loop.worker``), so threads here only wait on those children and run
  the harness's scoring; torch threads per job default to cores / max_parallel.

Results come back in the order of the requests, whatever order the jobs finish in.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class SequentialExecutor:
    """Run jobs one at a time."""

    def __init__(self, max_parallel: int = 1):
        self.max_parallel = 1

    def run(self, requests: list[dict[str, Any]]) -> list:
        from inner_loop.job import run_job

        return [run_job(**r) for r in requests]


class LocalParallelExecutor:
    """Run up to ``max_parallel`` jobs at once on this machine."""

    def __init__(self, max_parallel: int = 2):
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.max_parallel = max_parallel

    def run(self, requests: list[dict[str, Any]]) -> list:
        from inner_loop.job import run_job

        threads = max(1, (os.cpu_count() or 1) // self.max_parallel)
        reqs = [{"threads": threads, **r} if r.get("threads") is None else r for r in requests]
        with ThreadPoolExecutor(max_workers=self.max_parallel, thread_name_prefix="inner-job") as pool:
            return list(pool.map(lambda r: run_job(**r), reqs))


EXECUTORS = {"sequential": SequentialExecutor, "local_parallel": LocalParallelExecutor}


def make_executor(kind: str = "sequential", max_parallel: int = 1):
    """The executor called ``kind``; the message lists the ones this machine has."""
    if kind not in EXECUTORS:
        raise ValueError(f"executor {kind!r} is not available here; use one of: {', '.join(EXECUTORS)} "
                         f"(slurm and ray come with the scale-out extras)")
    return EXECUTORS[kind](max_parallel=max_parallel)
