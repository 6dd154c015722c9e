"""Scale-out executors for inner jobs: submitit (SLURM, or local processes) and Ray.

    ex = SubmititExecutor("slurm", max_parallel=8, partition="gpu", gpus_per_job=1)
    ex.plan(requests)["sbatch"]          # the sbatch script submitit would write
    results = ex.run(requests)           # one job array, 8 tasks at a time; JobResults in request order

A SLURM (or submitit-local) batch of N jobs is ``max_parallel`` array tasks (``jobs_per_task`` sets it), each
running its share of the jobs one after another in one process, as a ``local_parallel`` slot does: a task's
interpreter start, its imports of torch/transformers/TRL and its warm worker are paid once per task, not once
per job (bench/RESULTS.md, "Schedulers").

Same interface as ``agent_trainer.inner_loop.run.executor``; every job still runs through ``run_job`` on the remote
side. Why the engines and not Hydra's launcher plugins: docs/scale_out.md, "Executors: the Python side".
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from agent_trainer.inner_loop.run.request import JobRequest, with_threads
from agent_trainer.registry import REGISTRY_ENV, configured_env

UNKNOWN_LOSS = "node failure, time limit or cancelled?"
# What submitit's handler of the signal before a SLURM time limit raises in a task that has no checkpoint method.
TIMED_OUT = "timed-out and not checkpointable"
# Time a job needs beyond its training deadline: interpreter start, imports, hidden evaluation.
EVAL_MARGIN_S = 600.0
# How often the harness asks SLURM's accounting about a task that has not written its result (submitit's own
# watcher backs off to once per 10 minutes, so a lost task would be noticed that late).
SACCT_POLL_S = 10.0
# SLURM states in which a task ended without writing a result: no wait for its result file to appear.
NO_RESULT_STATES = ("CANCELLED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")


def run_request(request: JobRequest, registry_env: dict[str, str] | None = None):
    """Run one request on the remote side (a module-level function: submitit and Ray pickle it by name).

    ``registry_env`` (the harness's ``agent_trainer.registry.configured_env()``) is set in the worker before the job
    runs: a Ray or SLURM worker on another node does not have the harness's environment, and a data family or
    configured base model must be found there as it is here. The result says where it ran (``placement``)."""
    from agent_trainer.inner_loop.run.job import run_request as run

    if registry_env is not None:
        for key in REGISTRY_ENV:
            os.environ.pop(key, None)
        os.environ.update(registry_env)
    _engine_stops_as_base_exception()
    try:
        res = run(request)
    except EngineStop as e:
        raise e.__cause__ from None   # submitit writes it to the task's result: the harness reads the reason there
    if hasattr(res, "placement"):   # a JobResult (tests stand other values in)
        res.placement = {**res.placement, **placement_here()}
    return res


def run_requests(requests: list[JobRequest], registry_env: dict[str, str] | None = None) -> list:
    """Several requests one after another in this process (one array task: its imports and warm worker serve them
    all). Each finished job's result is also pickled at once beside the task's submitit files
    (``finished_path``), so that the harness keeps the jobs a task finished before the engine ended it
    (cancelled, time limit, lost node); the others come back ``crashed`` with the engine's reason."""
    import pickle

    folder = _task_folder()
    out = []
    for i, request in enumerate(requests):
        res = run_request(request, registry_env)
        if folder is not None:
            path = finished_path(*folder, i)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(pickle.dumps(res))
            os.replace(tmp, path)
        out.append(res)
    return out


def finished_path(folder: Path, job_id: str, index: int) -> Path:
    """Where an array task keeps the result of its ``index``-th job once it has finished."""
    return Path(folder) / f"{job_id}_job{index}_result.pkl"


def _task_folder() -> tuple[Path, str] | None:
    """``(folder, job_id)`` of the submitit task this process is, or None outside submitit."""
    if "SUBMITIT_FOLDER" not in os.environ:
        return None
    from submitit import JobEnvironment

    env = JobEnvironment()
    return env.paths.folder, env.job_id


def _finished(folder: Path, job_id: str, index: int):
    """The result an ended task pickled for its ``index``-th job, or None when that job had not finished."""
    import pickle

    try:
        return pickle.loads(finished_path(folder, job_id, index).read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def packed(requests: list, tasks: int) -> list[list]:
    """``requests`` in ``tasks`` consecutive groups whose sizes differ by at most one (request order kept)."""
    tasks = max(1, min(tasks, len(requests)))
    size, extra = divmod(len(requests), tasks)
    groups, start = [], 0
    for t in range(tasks):
        end = start + size + (t < extra)
        groups.append(requests[start:end])
        start = end
    return groups


class EngineStop(BaseException):
    """The engine ends the task (submitit's handler of the signal before a SLURM time limit raised): a
    ``BaseException``, so that no ``except Exception`` of the job's stages (validation reports what it catches as
    a finding of the job) takes the time limit for the job's own error."""


def _engine_stops_as_base_exception() -> None:
    """Under submitit, wrap its handler of the time-limit signal: what it raises comes as ``EngineStop``. SLURM's
    SIGTERM (the task cancelled, or at its limit; submitit only logs it) ends the task as ``EngineStop`` too: the
    job's training process gets the same signal, and its death must not be taken for the job's own crash (the
    harness gives the job SLURM's state instead)."""
    import signal

    try:
        from submitit.core.job_environment import JobEnvironment, SignalHandler
    except ImportError:   # not under submitit
        return
    sig = JobEnvironment._usr_sig()
    handler = signal.getsignal(sig)
    if not isinstance(getattr(handler, "__self__", None), SignalHandler):
        return   # not a submitit task (Ray, a local call), or wrapped already

    def stop(signum, frame):
        try:
            handler(signum, frame)
        except Exception as e:
            raise EngineStop(str(e)) from e

    def terminated(signum, frame):
        why = "SIGTERM from SLURM: the task was cancelled, reached its time limit or lost its node"
        raise EngineStop(why) from RuntimeError(why)

    signal.signal(sig, stop)
    signal.signal(signal.SIGTERM, terminated)


def placement_here() -> dict[str, Any]:
    """Where this process runs, as the engine names it: the SLURM job, array task and node, or the Ray node,
    worker and its log folder; ``{"host": ...}`` outside both."""
    import socket

    out: dict[str, Any] = {"host": socket.gethostname()}
    env = os.environ
    if "SLURM_JOB_ID" in env:
        out.update(engine="slurm", job_id=env["SLURM_JOB_ID"], node=env.get("SLURMD_NODENAME"),
                   array_job_id=env.get("SLURM_ARRAY_JOB_ID"), array_task_id=env.get("SLURM_ARRAY_TASK_ID"))
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            node = ray._private.worker.global_worker.node
            out.update(engine="ray", node_id=ctx.get_node_id(), worker_id=ctx.get_worker_id(), pid=os.getpid(),
                       node_ip=node.node_ip_address, logs=node.get_logs_dir_path())
    except Exception:  # noqa: BLE001 - no Ray here, or an older one: where it ran is a courtesy, not the result
        pass
    return out


def record_placement(request: JobRequest, res, **extra: Any):
    """Add the harness's side of where a job ran (its engine id, its log files) to ``res`` and its ``result.json``."""
    from agent_trainer.inner_loop.run.result import RESULT_FILE, write_json_atomic

    res.placement = {**res.placement, **{k: v for k, v in extra.items() if v is not None}}
    if request.out.is_dir():
        write_json_atomic(request.out / RESULT_FILE, res.as_dict())
    return res


def lost(request: JobRequest, message: str, reason: str = ""):
    """A ``crashed`` result (with ``result.json``) for a job the engine lost; the harness keeps going.

    ``reason``: the engine's word for it (SLURM's state: CANCELLED, TIMEOUT, NODE_FAIL; Ray's error)."""
    from agent_trainer.inner_loop.run.result import (
        RESULT_FILE, JobResult, job_hash, library_versions, write_json_atomic,
    )

    res = JobResult(status="crashed", task=request.task.name, family=request.task.family,
                    job_dir=str(request.job_dir), output_dir=str(request.out), job_hash=job_hash(request.job_dir),
                    hidden_n=request.hidden_n,
                    detail=f"the launcher lost the job before it reported a result: {reason or UNKNOWN_LOSS}",
                    error=message[-3000:], libraries=library_versions())
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
    """Inner jobs as submitit jobs: a SLURM array (``cluster="slurm"``) or local processes (``"local"``).

    ``jobs_per_task``: how many jobs one task runs, one after another (None: the batch spread evenly over
    ``max_parallel`` tasks; 1: a task per job, so a lost task loses one job only)."""

    def __init__(self, cluster: str = "slurm", max_parallel: int = 1, folder: str | Path = "runs/submitit",
                 partition: str | None = None, gpus_per_job: int = 0, cpus_per_job: int | None = None,
                 mem_gb: int | None = None, time_limit_min: int | None = None,
                 additional: dict[str, Any] | None = None, threads: int | None = None,
                 jobs_per_task: int | None = None, poll_s: float = SACCT_POLL_S):
        if cluster not in ("slurm", "local"):
            raise ValueError(f"submitit cluster must be slurm or local, got {cluster!r}")
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        if jobs_per_task is not None and jobs_per_task < 1:
            raise ValueError(f"jobs_per_task must be >= 1 or None, got {jobs_per_task}")
        self.cluster, self.max_parallel, self.folder = cluster, max_parallel, Path(folder)
        self.partition, self.gpus_per_job, self.cpus_per_job = partition, gpus_per_job, cpus_per_job
        self.mem_gb, self.time_limit_min, self.additional = mem_gb, time_limit_min, dict(additional or {})
        self.threads, self.jobs_per_task, self.poll_s = threads, jobs_per_task, poll_s

    @property
    def kind(self) -> str:
        return "slurm" if self.cluster == "slurm" else "submitit_local"

    def groups(self, requests: list) -> list[list]:
        """The batch as array tasks: each group is one task's jobs."""
        if not requests:
            return []
        tasks = math.ceil(len(requests) / self.jobs_per_task) if self.jobs_per_task else self.max_parallel
        return packed(list(requests), tasks)

    def timeout_min(self, requests: list[JobRequest]) -> int:
        """A task's time limit (one for the whole array): per job ``time_limit_min``, else the longest job
        deadline plus the eval margin, times the jobs of the fullest task (they run one after another)."""
        per_task = max((len(g) for g in self.groups(requests)), default=1)
        if self.time_limit_min:
            return int(self.time_limit_min) * per_task
        return max(1, math.ceil(per_task * (deadline_s(requests) + EVAL_MARGIN_S) / 60)) if requests else 60

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
            # A job SLURM would requeue after a node failure could run twice; the outer loop decides instead.
            p["slurm_additional_parameters"] = {"no_requeue": True}
            # submitit's warning signal comes this long before the time limit (default 90 s: longer than a
            # one-minute limit).
            p["slurm_signal_delay_s"] = min(90, 15 * p["timeout_min"])
            if self.partition:
                p["slurm_partition"] = self.partition
            if self.additional:
                p["slurm_additional_parameters"].update(self.additional)
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
            map_count=max(1, len(self.groups(requests))), additional_parameters=p.get("slurm_additional_parameters"),
            signal_delay_s=p.get("slurm_signal_delay_s", 90))

    def plan(self, requests: list[JobRequest] = ()) -> dict[str, Any]:
        """What ``run`` would submit, without submitting."""
        requests = list(requests)
        out: dict[str, Any] = {"executor": self.kind, "engine": "submitit", "max_parallel": self.max_parallel,
                               "jobs_per_task": [len(g) for g in self.groups(requests)],
                               "folder": str(self.folder), "parameters": self.parameters(requests),
                               "engine_installed": _installed("submitit")}
        if not out["engine_installed"]:
            out["install"] = "pip install -e '.[slurm]'"
        elif self.cluster == "slurm":
            out["sbatch"] = self.sbatch(requests)
        return out

    def check(self) -> None:
        """Raise a one-line ``RuntimeError`` naming the controller when SLURM does not answer (before any work)."""
        if self.cluster != "slurm":
            return
        import shutil

        from agent_trainer.inner_loop.isolation.launcher import run_check

        if shutil.which("sinfo") is None:
            raise RuntimeError("hardware.executor=slurm: no SLURM client here (sinfo not found); run at-train on a "
                               "SLURM login node, or bash scripts/cluster.sh slurm start on this machine")
        # The launcher scrubs the environment; SLURM_CONF (which cluster) is passed on through env(1).
        conf = [f"SLURM_CONF={os.environ['SLURM_CONF']}"] if os.environ.get("SLURM_CONF") else []
        try:
            done = run_check(["env", *conf, "sinfo", "-h", "-o", "%P"], timeout_s=30)
        except Exception as e:  # noqa: BLE001 - a timeout: the controller does not answer
            raise RuntimeError(f"hardware.executor=slurm: the SLURM controller did not answer sinfo "
                               f"({type(e).__name__}: {e})") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"hardware.executor=slurm: the SLURM controller is unreachable ({why}); "
                               f"check slurmctld (scontrol ping), or SLURM_CONF")

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
        # At most max_parallel groups run at once: SLURM throttles the array; local processes start together.
        groups = self.groups(reqs)
        jobs = ex.map_array(run_requests, groups, [configured_env()] * len(groups))
        results = []
        try:
            for job, group in zip(jobs, groups):
                results += self._results(job, group)
        except BaseException:
            # at-train stopped (SIGTERM, Ctrl-C) while the tasks run: cancel them, leave no orphan behind.
            for job in jobs:
                if not job.done():
                    job.cancel(check=False)
            raise
        return results

    def _wait(self, job) -> None:
        """Until the task has ended: its result file checked every second, SLURM's accounting every ``poll_s``.
        A task that ended without a result (cancelled, lost node) is not waited for again by ``result``."""
        import time

        if self.cluster != "slurm":
            job.wait()
            return
        asked = -math.inf
        while not job.paths.result_pickle.exists():
            if time.monotonic() - asked >= self.poll_s:
                asked = time.monotonic()
                if job.watcher.is_done(job.job_id, mode="force"):
                    if job.state.split()[0] in NO_RESULT_STATES:
                        job._results_timeout_s = 0   # submitit would wait 15 s (twice) for a file never written
                    return
            time.sleep(1)

    def _results(self, job, group: list[JobRequest]) -> list:
        """The task's results: its jobs' own, or for those it had not finished when it ended, a ``crashed`` one
        with the engine's state; either way with where they ran."""
        paths = job.paths
        self._wait(job)
        try:
            results = job.result()
        except Exception as e:  # noqa: BLE001 - whatever the engine raises, the batch goes on
            state = _final_state(job) if self.cluster == "slurm" else ""
            reason = f"SLURM state {state}" if state else type(e).__name__
            if TIMED_OUT in str(e):
                # submitit's signal, sent before the time limit, ended the task: SLURM records FAILED, not TIMEOUT.
                reason = f"SLURM time limit: the task was {TIMED_OUT} ({reason})"
            results = [_finished(paths.folder, job.job_id, i) or lost(req, f"{type(e).__name__}: {e}", reason)
                       for i, req in enumerate(group)]
        if self.cluster != "slurm":
            return results
        state = _final_state(job)
        return [record_placement(req, res, engine="slurm", job_id=job.job_id, stdout=str(paths.stdout),
                                 stderr=str(paths.stderr), state=state,
                                 task_job=f"{i + 1} of {len(group)}" if len(group) > 1 else None)
                for i, (req, res) in enumerate(zip(group, results))]


def _final_state(job, wait_s: float = 30.0) -> str:
    """SLURM's final state of ``job`` as accounting has it (COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, ...).

    submitit's view can lag accounting by a poll; a finished job's state reaches sacct within seconds."""
    import time

    deadline = time.time() + wait_s
    while True:
        try:
            job.watcher.update()
            state = job.state.split()[0]   # "CANCELLED by 0" -> CANCELLED
        except Exception:  # noqa: BLE001 - sacct unreachable: say so rather than fail the batch
            return "UNKNOWN"
        if state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "UNKNOWN") or time.time() > deadline:
            return state
        time.sleep(0.5)


class RayExecutor:
    """Inner jobs as Ray tasks, on a local Ray (started on first use) or an existing cluster (``address``)."""

    kind = "ray"

    def __init__(self, max_parallel: int = 1, address: str | None = None, gpus_per_job: int = 0,
                 cpus_per_job: int | None = None, threads: int | None = None, init_kwargs: dict | None = None,
                 resources: dict[str, float] | None = None):
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.max_parallel, self.address, self.gpus_per_job = max_parallel, address, gpus_per_job
        self.resources = dict(resources or {})   # custom resources per task: which nodes may take a job
        self.cpus_per_job = cpus_per_job or threads or 1
        self.threads = threads
        self.init_kwargs = dict(init_kwargs or {})
        self._started = False

    def plan(self, requests: list[JobRequest] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {"executor": "ray", "engine": "ray", "max_parallel": self.max_parallel,
                               "address": self.address or "local (started on first use)",
                               "task_resources": {"num_cpus": self.cpus_per_job, "num_gpus": self.gpus_per_job,
                                                  **self.resources},
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

    def check(self) -> None:
        """Raise a one-line ``RuntimeError`` naming the head when ``address`` names a cluster that does not answer
        (a local Ray, no address, is started by ``run``)."""
        if not self.address:
            return
        import socket

        try:
            from ray._private.services import get_ray_address_from_environment
        except ImportError:
            raise RuntimeError("hardware.executor=ray needs Ray: pip install -e '.[ray]'") from None
        try:
            address = get_ray_address_from_environment(self.address, None)
        except ConnectionError:
            raise RuntimeError(f"hardware.ray_address={self.address}: no running Ray cluster found on this machine "
                               f"(start one: ray start --head, or bash scripts/cluster.sh ray start)") from None
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except (OSError, ValueError) as e:
            raise RuntimeError(f"hardware.ray_address={self.address}: the Ray head at {address} is unreachable "
                               f"({e.strerror or e}); start it, or set hardware.ray_address") from None

    def run(self, requests: list[JobRequest]) -> list:
        if not requests:
            return []
        ray = self._init()
        reqs = [r.absolute() for r in with_threads(requests, self.threads)]
        task = ray.remote(num_cpus=self.cpus_per_job, num_gpus=self.gpus_per_job, resources=self.resources,
                          max_retries=0)(run_request)
        env = configured_env()
        refs = [task.remote(r, env) for r in reqs]
        results = []
        try:
            for ref, req in zip(refs, reqs):
                try:
                    results.append(record_placement(req, ray.get(ref)))   # the worker's placement, on disk too
                except Exception as e:  # noqa: BLE001 - a lost worker or node: the batch goes on
                    results.append(lost(req, f"{type(e).__name__}: {e}", f"Ray {type(e).__name__}"))
        except BaseException:
            # at-train stopped (SIGTERM, Ctrl-C) while the tasks run: cancel them, leave no orphan behind.
            for ref in refs:
                ray.cancel(ref, force=True)
            raise
        return results

    def close(self) -> None:
        """Stop the local Ray this executor started (an existing cluster is left alone)."""
        if self._started:
            import ray

            ray.shutdown()
            self._started = False

