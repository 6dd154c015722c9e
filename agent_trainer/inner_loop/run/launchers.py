"""Scale-out executors for inner jobs: submitit (SLURM, or local processes) and Ray.

    ex = SubmititExecutor("slurm", max_parallel=8, partition="gpu", gpus_per_job=1)
    ex.plan(requests)["sbatch"]          # the sbatch script submitit would write
    results = ex.run(requests)           # one array job, 8 tasks at a time; JobResults in request order

Same interface as ``agent_trainer.inner_loop.run.executor``; every job still runs through ``run_job`` on the remote
side. Why the engines and not Hydra's launcher plugins: docs/inner_loop.md, "Executors".
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from agent_trainer.inner_loop.run.request import JobRequest, with_threads
from agent_trainer.registry import REGISTRY_ENV, configured_env

# Time a job needs beyond its training deadline: interpreter start, imports, hidden evaluation.
EVAL_MARGIN_S = 600.0


def run_request(request: JobRequest, registry_env: dict[str, str] | None = None):
    """Run one request on the remote side (a module-level function: submitit and Ray pickle it by name).

    ``registry_env`` (the harness's ``agent_trainer.registry.configured_env()``) is set in the worker before the job
    runs: a Ray or SLURM worker on another node does not have the harness's environment, and a data family or
    configured base model must be found there as it is here."""
    from agent_trainer.inner_loop.run.job import run_request as run

    if registry_env is not None:
        for key in REGISTRY_ENV:
            os.environ.pop(key, None)
        os.environ.update(registry_env)
    return run(request)


def lost(request: JobRequest, message: str):
    """A ``crashed`` result (with ``result.json``) for a job the engine lost; the harness keeps going."""
    from agent_trainer.inner_loop.run.result import (
        RESULT_FILE, JobResult, job_hash, library_versions, write_json_atomic,
    )

    res = JobResult(status="crashed", task=request.task.name, family=request.task.family,
                    job_dir=str(request.job_dir), output_dir=str(request.out), job_hash=job_hash(request.job_dir),
                    hidden_n=request.hidden_n,
                    detail="the launcher lost the job before it reported a result (node failure, time limit, "
                           "cancelled?)", error=message[-3000:], libraries=library_versions())
    request.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(request.out / RESULT_FILE, res.as_dict())
    return res


def deadline_s(requests: list[JobRequest]) -> float:
    """The longest hard deadline among the requests (``timeout_s``, else ``request.safety_cap`` of the task's
    budget)."""
    return max((r.deadline_s for r in requests), default=0.0)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class SubmititExecutor:
    """Inner jobs as submitit jobs: a SLURM array (``cluster="slurm"``) or local processes (``"local"``)."""

    def __init__(self, cluster: str = "slurm", max_parallel: int = 1, folder: str | Path = "runs/submitit",
                 partition: str | None = None, gpus_per_job: int = 0, cpus_per_job: int | None = None,
                 mem_gb: int | None = None, time_limit_min: int | None = None,
                 additional: dict[str, Any] | None = None, threads: int | None = None):
        if cluster not in ("slurm", "local"):
            raise ValueError(f"submitit cluster must be slurm or local, got {cluster!r}")
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.cluster, self.max_parallel, self.folder = cluster, max_parallel, Path(folder)
        self.partition, self.gpus_per_job, self.cpus_per_job = partition, gpus_per_job, cpus_per_job
        self.mem_gb, self.time_limit_min, self.additional = mem_gb, time_limit_min, dict(additional or {})
        self.threads = threads

    @property
    def kind(self) -> str:
        return "slurm" if self.cluster == "slurm" else "submitit_local"

    def timeout_min(self, requests: list[JobRequest]) -> int:
        """The per-job time limit: ``time_limit_min``, else the longest job deadline plus the eval margin."""
        if self.time_limit_min:
            return int(self.time_limit_min)
        return max(1, math.ceil((deadline_s(requests) + EVAL_MARGIN_S) / 60)) if requests else 60

    def parameters(self, requests: list[JobRequest]) -> dict[str, Any]:
        """``AutoExecutor.update_parameters`` keywords (hydra-submitit-launcher's names, submitit's prefixes)."""
        p: dict[str, Any] = {"name": "inner-job", "timeout_min": self.timeout_min(requests),
                             "cpus_per_task": self.cpus_per_job or self.threads or 1, "nodes": 1, "tasks_per_node": 1}
        if self.gpus_per_job:
            p["gpus_per_node"] = self.gpus_per_job
        if self.mem_gb:
            p["mem_gb"] = self.mem_gb
        if self.cluster == "slurm":
            p["slurm_array_parallelism"] = self.max_parallel
            if self.partition:
                p["slurm_partition"] = self.partition
            if self.additional:
                p["slurm_additional_parameters"] = dict(self.additional)
        return p

    def sbatch(self, requests: list[JobRequest]) -> str:
        """The sbatch script submitit would write for this batch (built without a cluster: for dry runs)."""
        from submitit.slurm.slurm import _make_sbatch_string

        p = self.parameters(requests)
        return _make_sbatch_string(
            command=f"{sys.executable} -u -m submitit.core._submit {self.folder.resolve() / '%j'}",
            folder=self.folder.resolve() / "%j", job_name=p["name"], partition=p.get("slurm_partition"),
            time=p["timeout_min"], nodes=1, cpus_per_task=p["cpus_per_task"], gpus_per_node=p.get("gpus_per_node"),
            mem=f"{p['mem_gb']}GB" if p.get("mem_gb") else None, array_parallelism=self.max_parallel,
            map_count=max(1, len(requests)), additional_parameters=p.get("slurm_additional_parameters"))

    def plan(self, requests: list[JobRequest] = ()) -> dict[str, Any]:
        """What ``run`` would submit, without submitting."""
        requests = list(requests)
        out: dict[str, Any] = {"executor": self.kind, "engine": "submitit", "max_parallel": self.max_parallel,
                               "folder": str(self.folder), "parameters": self.parameters(requests),
                               "engine_installed": _installed("submitit")}
        if not out["engine_installed"]:
            out["install"] = "pip install -e '.[slurm]'"
        elif self.cluster == "slurm":
            out["sbatch"] = self.sbatch(requests)
        return out

    def run(self, requests: list[JobRequest]) -> list:
        if not requests:
            return []
        try:
            import submitit
        except ImportError:
            raise RuntimeError(
                "hardware.executor=slurm/submitit_local needs submitit: pip install -e '.[slurm]'") from None
        reqs = [r.absolute() for r in with_threads(requests, self.threads)]
        self.folder.mkdir(parents=True, exist_ok=True)
        ex = submitit.AutoExecutor(folder=self.folder / "%j", cluster=self.cluster)
        ex.update_parameters(**self.parameters(reqs))
        # SLURM throttles the array itself; local processes all start at once, so go max_parallel at a time.
        size = len(reqs) if self.cluster == "slurm" else self.max_parallel
        results = []
        for start in range(0, len(reqs), size):
            chunk = reqs[start:start + size]
            jobs = ex.map_array(run_request, chunk, [configured_env()] * len(chunk))
            for job, req in zip(jobs, chunk):
                try:
                    results.append(job.result())
                except Exception as e:  # noqa: BLE001 - whatever the engine raises, the batch goes on
                    results.append(lost(req, f"{type(e).__name__}: {e}"))
        return results


class RayExecutor:
    """Inner jobs as Ray tasks, on a local Ray (started on first use) or an existing cluster (``address``)."""

    kind = "ray"

    def __init__(self, max_parallel: int = 1, address: str | None = None, gpus_per_job: int = 0,
                 cpus_per_job: int | None = None, threads: int | None = None, init_kwargs: dict | None = None):
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.max_parallel, self.address, self.gpus_per_job = max_parallel, address, gpus_per_job
        self.cpus_per_job = cpus_per_job or threads or 1
        self.threads = threads
        self.init_kwargs = dict(init_kwargs or {})
        self._started = False

    def plan(self, requests: list[JobRequest] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {"executor": "ray", "engine": "ray", "max_parallel": self.max_parallel,
                               "address": self.address or "local (started on first use)",
                               "task_resources": {"num_cpus": self.cpus_per_job, "num_gpus": self.gpus_per_job},
                               "engine_installed": _installed("ray")}
        if not self.address:
            out["local_cpus"] = self.max_parallel * self.cpus_per_job
        if not out["engine_installed"]:
            out["install"] = "pip install -e '.[ray]'"
        return out

    def _init(self):
        try:
            import ray
        except ImportError:
            raise RuntimeError("hardware.executor=ray needs Ray: pip install -e '.[ray]'") from None
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, **self.init_kwargs}
            if self.address:
                ray.init(address=self.address, **kwargs)
            else:
                ray.init(num_cpus=self.max_parallel * self.cpus_per_job, num_gpus=None if self.gpus_per_job else 0,
                         **kwargs)
            self._started = True
        return ray

    def run(self, requests: list[JobRequest]) -> list:
        if not requests:
            return []
        ray = self._init()
        reqs = [r.absolute() for r in with_threads(requests, self.threads)]
        task = ray.remote(num_cpus=self.cpus_per_job, num_gpus=self.gpus_per_job, max_retries=0)(run_request)
        env = configured_env()
        refs = [task.remote(r, env) for r in reqs]
        results = []
        for ref, req in zip(refs, reqs):
            try:
                results.append(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - a lost worker or node: the batch goes on
                results.append(lost(req, f"{type(e).__name__}: {e}"))
        return results

    def close(self) -> None:
        """Stop the local Ray this executor started (an existing cluster is left alone)."""
        if self._started:
            import ray

            ray.shutdown()
            self._started = False

