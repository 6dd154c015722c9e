"""Inner jobs on a real SLURM cluster (with accounting) and a real two-node Ray cluster, and their faults.

The clusters run on this machine, started by ``bash scripts/cluster.sh slurm|ray start`` (``make test`` starts
them through scripts/with_clusters.sh and stops them after); where one is not running its tests are skipped with
the command that starts it. Jobs are tiny (a random-init Qwen3, a few steps) so that the engines are what is tested:

- a batch as a SLURM job array gives the numbers the jobs give in this process, in request order; each result
  says where it ran (array task, node, submitit's log files) and ``sacct`` has the tasks COMPLETED;
- one array of three tasks of two jobs meets three faults: a task cancelled (``scancel``) after its first job
  ended, one past its time limit, and slurmd stopped under the third (the node set DOWN): the finished job keeps
  its result, every other job comes back ``crashed`` with the reason, slurmd is restored;
- at-train stopped by SIGTERM while its array runs cancels the tasks (none left running); ``resume=`` plays the
  step again as a new array, each job completed once;
- ``at-train -m ... hydra/launcher=submitit_slurm``: the runs are SLURM jobs logging at once to one MLflow server
  (``scripts/cluster.sh mlflow``), the sweep's table printed;
- a batch as Ray tasks on the head and the worker node gives the same numbers, each result naming its node;
- a Ray worker node killed mid-job gives a ``crashed`` result; a process stopped by SIGTERM while its Ray task
  runs cancels it (the two faults in one test, at once);
- at-train with an unreachable SLURM controller or Ray head stops at once: one line naming it, exit 2.

    .venv/bin/pytest tests/integration/test_clusters.py -q      (~13 min on 2 cores at load 8-22, clusters started)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.run.executor import make_executor
from agent_trainer.inner_loop.run.request import JobRequest
from agent_trainer.inner_loop.spec.cost import CostModel

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR", "/tmp/agent-trainer-cluster"))
SLURM_CONF = CLUSTER_DIR / "slurm" / "slurm.conf"
pytestmark = pytest.mark.slow
RAY_ADDRESS = os.environ.get("AT_TEST_RAY_ADDRESS", "127.0.0.1:6389")   # scripts/cluster.sh's RAY_PORT

FAST_COSTS = CostModel(startup_s=0.0, grpo_step_s=1e-4, grpo_token_s=0.0, sft_step_s=1e-4, sft_sequence_s=0.0)
TASK = TaskSpec(name="calc_test", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                budget={"max_steps": 50, "max_seconds": 60, "max_usd": 0.05})
# A job that trains for minutes: time for a fault to reach it while it runs.
LONG_TASK = TaskSpec(name="calc_long", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                     budget={"max_steps": 100_000, "max_seconds": 600, "max_usd": 5.0})
SHORT = {"sft_a": {"batch_size": 8, "learning_rate": 3e-3, "max_steps": 3},
         "sft_b": {"batch_size": 8, "learning_rate": 1e-2, "max_steps": 2}}


def _jobs(root: Path, hyper: dict[str, dict]) -> dict[str, Path]:
    out = {}
    for name, hp in hyper.items():
        job = root / name
        job.mkdir(parents=True)
        spec = {"base_model": "tiny-s", "algorithm": "sft", "hyperparameters": hp, "seed": 0,
                "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]}}
        (job / "job.yaml").write_text(yaml.safe_dump(spec))
        out[name] = job
    return out


def _requests(jobs: dict[str, Path], base_dir: Path, out: Path, task: TaskSpec = TASK) -> list[JobRequest]:
    return [JobRequest.of(job, task, out / name, model_dir=base_dir, cost_model=FAST_COSTS, progress=False,
                          threads=1, cache=False, warm_workers=False) for name, job in jobs.items()]


def _numbers(r) -> tuple:
    return (r.status, r.steps, r.hidden_score, r.baseline, r.loss_curve)


@pytest.fixture(scope="module")
def reference(base_dir, tmp_path_factory):
    """The short jobs run one after the other in this process: what every engine must give back."""
    root = tmp_path_factory.mktemp("clusters")
    jobs = _jobs(root / "jobs", SHORT)
    results = make_executor("sequential").run(_requests(jobs, base_dir, root / "sequential"))
    assert [r.status for r in results] == ["ok", "ok"], [r.detail + r.error for r in results]
    return jobs, results


@contextlib.contextmanager
def _one_at_a_time(engine: str):
    """One cluster test of an engine at a time across pytest-xdist's workers: a node set DOWN or a worker node
    killed takes every task on it, another test's too."""
    import fcntl

    CLUSTER_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER_DIR / f"{engine}.test-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ------------------------------------------------------------------------------------------------ SLURM

def _slurm(*args: str, check: bool = True) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout



def _started(engine: str, timeout: float = 900.0) -> None:
    """``make test`` starts the clusters beside the first tests (scripts/with_clusters.sh): while its start marker
    names a live process, wait for that start to end."""
    marker = CLUSTER_DIR / f"starting-{engine}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(int(marker.read_text().strip()), 0)
        except (OSError, ValueError):   # no marker, a stale one, or the start has ended
            return
        time.sleep(2)


@pytest.fixture
def slurm(monkeypatch, tmp_path):
    """The cluster of scripts/cluster.sh (its SLURM_CONF), skipped with the command to start it when down."""
    _started("slurm")
    if shutil.which("sinfo") is None or not SLURM_CONF.is_file():
        pytest.skip("no SLURM cluster: bash scripts/cluster.sh slurm start")
    monkeypatch.setenv("SLURM_CONF", str(SLURM_CONF))
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"the SLURM cluster does not answer ({done.stderr.strip()[:100]}): "
                    "bash scripts/cluster.sh slurm start")
    node = _slurm("sinfo", "-h", "-o", "%N").strip()
    with _one_at_a_time("slurm"):
        yield node
    # A fault test leaves none of its tasks running and the node back in service, whatever happened.
    for task in _tasks(tmp_path):
        _slurm("scancel", task, check=False)
    _slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def _sacct_states(job_id: str) -> dict[str, str]:
    """Array task id -> final state, as accounting has it."""
    out = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State")
    return dict(line.split("|")[:2] for line in out.splitlines() if line)


def _sacct_settled(job_id: str, expected: dict[str, str], timeout: float = 60.0) -> dict[str, str]:
    """sacct's states of ``job_id`` once they equal ``expected`` (or after ``timeout``): a task ends a little after
    its result is written (the interpreter exits), and accounting hears of it from slurmctld a little later."""
    deadline, states = time.time() + timeout, {}
    while time.time() < deadline:
        states = {k: v.split()[0] for k, v in _sacct_states(job_id).items()}   # "CANCELLED by 0" -> CANCELLED
        if states == expected:
            break
        time.sleep(1)
    return states


def _tasks(folder: Path, state: str = "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING") -> list[str]:
    """Job ids of the array tasks that submitit submitted from ``folder`` (this test's; not another run's) that
    are in ``state`` (default: not ended; squeue keeps ended jobs for MinJobAge)."""
    out = _slurm("squeue", "-h", "-t", state, "-o", "%i %o")
    return sorted(line.split()[0] for line in out.splitlines() if str(folder) in line)


def _wait_running(folder: Path, n: int, timeout: float = 120.0, besides: tuple[str, ...] = ()) -> list[str]:
    """The job ids of ``n`` RUNNING tasks submitted from ``folder`` (their jobs train for minutes), ``besides``
    not counted."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        running = [t for t in _tasks(folder, "RUNNING") if t not in besides]
        if len(running) >= n:
            return running
        time.sleep(1)
    raise AssertionError(f"{n} tasks did not start within {timeout:.0f} s: {_slurm('squeue')}")


@pytest.mark.slurm
def test_a_batch_runs_as_a_slurm_array_with_the_local_numbers(reference, base_dir, slurm, tmp_path):
    jobs, expected = reference
    ex = make_executor("slurm", max_parallel=2, folder=tmp_path / "submitit", threads=1)
    got = ex.run(_requests(jobs, base_dir, tmp_path / "out"))
    assert [_numbers(r) for r in got] == [_numbers(e) for e in expected], [r.detail + r.error for r in got]
    array = got[0].placement["array_job_id"]
    assert [r.placement["job_id"] for r in got] == [f"{array}_0", f"{array}_1"]
    for r in got:
        where = r.placement
        assert where["engine"] == "slurm" and where["node"] == slurm and where["state"] == "COMPLETED"
        assert Path(where["stdout"]).is_file() and Path(where["stderr"]).is_file()
        assert yaml.safe_load(Path(r.output_dir, "result.json").read_text())["placement"] == where
    assert _sacct_states(array) == {f"{array}_0": "COMPLETED", f"{array}_1": "COMPLETED"}


def _cluster_sh(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "cluster.sh"), *args], capture_output=True, text=True,
                          timeout=timeout)


def _trainers_in(folder: Path) -> list[int]:
    """Pids of the processes working in ``folder`` (a job's training process runs in ``<output>/.home``)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cwd"]):
        if (proc.info.get("cwd") or "").startswith(str(folder)):
            found.append(proc.pid)
    return found


def _none_left(folder: Path, timeout: float = 30.0) -> list[int]:
    deadline = time.time() + timeout
    while (left := _trainers_in(folder)) and time.time() < deadline:
        time.sleep(1)
    return left


@pytest.mark.slurm
def test_cancelled_timed_out_and_lost_node_tasks_come_back_crashed_with_slurms_state(base_dir, slurm, tmp_path):
    """One array of three tasks of two jobs each, two tasks at a time. The first task's short job ends, then the
    task is cancelled (``scancel``) during its long one; the second task runs past its time limit (cut to one
    minute); then the node's slurmd stops under the third and the node is set DOWN (a lost node, as slurmctld
    marks it after SlurmdTimeout; set at once here). The finished job keeps its result; every other job comes back
    ``crashed`` with SLURM's state, the ones a task never reached too. slurmd started again, no process of the lost
    task is left."""
    from agent_trainer.inner_loop.run.launchers import finished_path

    long = {"batch_size": 8, "max_steps": 100_000}
    jobs = _jobs(tmp_path / "jobs", {"done": SHORT["sft_a"], **{name: long for name in (
        "cancelled", "timed_out", "never_ran", "lost", "lost_later")}})
    requests = _requests(jobs, base_dir, tmp_path / "out", LONG_TASK)
    requests[0] = _requests({"done": jobs["done"]}, base_dir, tmp_path / "out")[0]
    launched = tmp_path / "submitit"
    # 5 min a job, 10 a task: short enough that submitit takes the early signal of the cut limit for a time limit
    # (with a limit over 10 min it would take it for a preemption and try to requeue)
    ex = make_executor("slurm", max_parallel=2, folder=launched, threads=1, time_limit_min=5, jobs_per_task=2,
                       poll_s=1)
    box: dict = {}
    runner = threading.Thread(target=lambda: box.update(results=ex.run(requests)))
    runner.start()
    try:
        first, second = _wait_running(launched, 2)
        _slurm("scontrol", "update", f"jobid={second}", "timelimit=1")
        deadline = time.time() + 300
        while not finished_path(launched / first, first, 0).is_file():   # the first task's short job has ended
            assert time.time() < deadline and runner.is_alive(), "the first task's short job did not end"
            time.sleep(1)
        _slurm("scancel", first)
        # the third starts in the place of the first or of the second (whichever ended first)
        (third,) = _wait_running(launched, 1, besides=(first, second))
        deadline = time.time() + 150   # a minute's limit, enforced within slurmctld's 30 s timer
        while second in _tasks(launched) and time.time() < deadline:
            time.sleep(1)
        assert second not in _tasks(launched), f"{second} outlived its time limit"
        assert _cluster_sh("slurm", "stop-slurmd").returncode == 0
        _slurm("scontrol", "update", f"nodename={slurm}", "state=down", "reason=lost-node-test")
        runner.join(timeout=120)
        assert not runner.is_alive(), "the executor did not return after its tasks were lost"
    finally:   # slurmd back, for the tests and users after (the node returns to service as it registers)
        again = _cluster_sh("slurm", "start")
    assert again.returncode == 0, again.stdout + again.stderr
    done, cancelled, timed_out, never_ran, lost, lost_later = box["results"]
    assert [r.placement["job_id"] for r in box["results"]] == [first, first, second, second, third, third]
    assert done.status == "ok" and done.steps == 3 and done.placement["task_job"] == "1 of 2", done.detail
    assert cancelled.status == "crashed" and "SLURM state CANCELLED" in cancelled.detail, cancelled.detail
    # submitit's signal comes before the limit and ends the task (sacct: FAILED); the result names the limit.
    for r in (timed_out, never_ran):
        assert r.status == "crashed" and "SLURM time limit: the task was timed-out and not checkpointable" \
            in r.detail, r.detail
    for r in (lost, lost_later):
        assert r.status == "crashed" and "SLURM state NODE_FAIL" in r.detail, r.detail
    assert all(json.loads(Path(r.output_dir, "result.json").read_text())["status"] == r.status
               for r in box["results"]), "result.json says otherwise"
    assert not _tasks(launched), "no task may stay queued or running"
    # The lost task's processes outlived its slurmd (slurmstepd runs on); the slurmd that comes back ends them.
    assert not _none_left(tmp_path / "out", timeout=60), "a process of a lost task is still running"


def _arrays_of(run: Path, step: int) -> set[str]:
    """The SLURM arrays whose tasks gave the results of ``step``'s episodes in at-train's run folder."""
    return {json.loads(p.read_text())["placement"]["array_job_id"]
            for p in run.glob(f"episodes/s{step:04d}-*/jobs/*/output/result.json")}


@pytest.mark.slurm
def test_at_train_stopped_while_its_array_runs_cancels_it_and_resumes_each_job_once(built_agent, slurm, tmp_path):
    """SIGTERM to at-train during step 2's array: the tasks are cancelled (none left running), the run is killed;
    ``resume=`` plays step 2 again as a new array. Each job completed once: step 1's array and the resumed one
    COMPLETED, the stopped one CANCELLED, none crashed."""
    import signal

    at_train = str(Path(sys.executable).parent / "at-train")
    run, launched = tmp_path / "r", tmp_path / "submitit"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    # No job cache: every job runs as a task, none is answered from an earlier run's result.
    proc = subprocess.Popen([at_train, "experiment=smoke", "outer.steps=2", "hardware.executor=slurm",
                             "inner.cache=false", f"runs_dir={tmp_path}", "run_id=r"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 400
        while (json.loads((run / "run.json").read_text()).get("steps_completed") if (run / "run.json").is_file()
               else None) != 1:
            assert proc.poll() is None and time.time() < deadline, "at-train ended before its first step"
            time.sleep(2)
        first = _arrays_of(run, 0)
        while len(stopped := [t for t in _tasks(launched, "RUNNING") if t.split("_")[0] not in first]) < 2:
            assert proc.poll() is None and time.time() < deadline, "step 2's tasks did not run"
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) != 0
    finally:
        proc.kill()
    assert "terminated (SIGTERM)" in proc.stderr.read()
    assert json.loads((run / "run.json").read_text())["status"] == "killed"
    array = stopped[0].split("_")[0]
    cancelled = {f"{array}_{i}": "CANCELLED" for i in (0, 1)}
    assert _sacct_settled(array, cancelled) == cancelled
    assert not _tasks(launched) and not _none_left(run), "a task or its process outlived at-train"
    done = subprocess.run([at_train, f"resume={run}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run / "run.json").read_text())
    assert (record["status"], record["steps_completed"], record["jobs"], record["jobs_crashed"]) == ("ok", 2, 4, 0)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    (again,) = _arrays_of(run, 1)
    assert _arrays_of(run, 0) == first and again != array and len(first) == 1
    for completed in (*first, again):
        expected = {f"{completed}_{i}": "COMPLETED" for i in (0, 1)}
        assert _sacct_settled(completed, expected) == expected


# A process that waits on Ray tasks and takes SIGTERM as at-train does (argv: requests, head address, resource).
HARNESS = """
import pickle, signal, sys
from agent_trainer.inner_loop.run.executor import make_executor

def terminated(signum, frame):   # what at-train does with SIGTERM (agent_trainer.cli): an interrupt
    raise KeyboardInterrupt()

signal.signal(signal.SIGTERM, terminated)
requests = pickle.loads(open(sys.argv[1], "rb").read())
make_executor("ray", max_parallel=1, address=sys.argv[2], threads=1, cpus_per_job=1,
              resources={sys.argv[3]: 1}).run(requests)
"""


@pytest.fixture(scope="module")
def mlflow_server():
    """The MLflow server of ``scripts/cluster.sh mlflow`` (make test starts it with the clusters); started here when
    it is not running, and then stopped after this module's tests."""
    _started("mlflow")
    script = ["bash", str(ROOT / "scripts" / "cluster.sh"), "mlflow"]
    up = subprocess.run([*script, "status"], capture_output=True, text=True, timeout=60).returncode == 0
    if not up:
        done = subprocess.run([*script, "start"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    port = os.environ.get("MLFLOW_PORT", "6920")
    yield f"http://{socket.gethostname().split('.')[0]}:{port}"
    if not up:
        subprocess.run([*script, "stop"], capture_output=True, text=True, timeout=60)


@pytest.mark.slurm
def test_a_sweep_runs_as_slurm_jobs_into_one_mlflow_store(built_agent, slurm, mlflow_server, tmp_path):
    """``at-train -m ... hydra/launcher=submitit_slurm``: each run is a SLURM job (its outer update inside it, with
    SLURM's variables around), both log at once to the MLflow server, and the sweep's table is printed."""
    import mlflow

    from agent_trainer.tracking import bare_key

    experiment = f"sweep-{tmp_path.name}"   # this test's runs only, in a server other runs share
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    done = subprocess.run([str(Path(sys.executable).parent / "at-train"), "-m", "experiment=smoke", "seed=0,1",
                           "outer.steps=1", "hydra/launcher=submitit_slurm", f"runs_dir={tmp_path}",
                           "tracking=server", f"tracking.tracking_uri={mlflow_server}",
                           f"tracking.experiment={experiment}"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ": 2 ok, 0 failed" in done.stdout and "| job | status | value (reward_last3) |" in done.stdout
    (sweep,) = [p for p in tmp_path.iterdir() if (p / "multirun.yaml").is_file()]
    records = [json.loads((sweep / str(n) / "run.json").read_text()) for n in (0, 1)]
    # Each run was a task of one SLURM array (its log is submitit's file of that task), COMPLETED in accounting.
    tasks = [Path(r["log"]).parent.name for r in records]
    array = tasks[0].split("_")[0]
    assert tasks == [f"{array}_0", f"{array}_1"], tasks
    assert _sacct_settled(array, {t: "COMPLETED" for t in tasks}) == {t: "COMPLETED" for t in tasks}
    mlflow.set_tracking_uri(mlflow_server)
    runs = mlflow.search_runs(experiment_names=[experiment], filter_string=f"tags.sweep = '{sweep.name}'",
                              order_by=["tags.`sweep.job` ASC"])
    assert [n.split(" · ")[0] for n in runs["tags.mlflow.runName"]] == ["seed=0", "seed=1"]
    assert list(runs["status"]) == ["FINISHED"] * 2 and list(runs.run_id) == [r["mlflow_run_id"] for r in records]
    client = mlflow.MlflowClient(mlflow_server)
    for n, run_id in enumerate(runs.run_id):
        # Nothing lost while both wrote: every number of the run's metrics.jsonl is in MLflow, every episode is
        # a nested run, and the outer update ran inside the SLURM job.
        (row,) = [json.loads(line) for line in (sweep / str(n) / "metrics.jsonl").read_text().splitlines()]
        logged = {bare_key(k): v for k, v in client.get_run(run_id).data.metrics.items()}
        expected = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        assert {k: logged.get(k) for k in expected} == pytest.approx(expected)
        assert any(k.startswith("update_") for k in expected), sorted(expected)
        children = client.search_runs(runs.experiment_id[n], f"tags.mlflow.parentRunId = '{run_id}'")
        assert len(children) == len(list((sweep / str(n) / "episodes").glob("*/summary.json"))) == 2


# ------------------------------------------------------------------------------------------------ Ray

@pytest.fixture
def ray_cluster(monkeypatch):
    """The two-node cluster of scripts/cluster.sh, skipped with the command to start it when down."""
    _started("ray")
    import socket

    pytest.importorskip("ray")
    host, port = RAY_ADDRESS.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        pytest.skip(f"no Ray cluster at {RAY_ADDRESS}: bash scripts/cluster.sh ray start")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    import ray

    with _one_at_a_time("ray"):
        yield RAY_ADDRESS
    ray.shutdown()


@pytest.mark.ray_cluster
def test_a_batch_runs_on_both_ray_nodes_with_the_local_numbers(reference, base_dir, ray_cluster, tmp_path):
    jobs, expected = reference
    ex = make_executor("ray", max_parallel=2, address=ray_cluster, threads=1, cpus_per_job=1)
    got = ex.run(_requests(jobs, base_dir, tmp_path / "out"))
    assert [_numbers(r) for r in got] == [_numbers(e) for e in expected], [r.detail + r.error for r in got]
    import ray

    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    where = [r.placement for r in got]
    assert all(p["engine"] == "ray" and p["node_id"] in nodes and Path(p["logs"]).is_dir() for p in where), where
    assert [yaml.safe_load(Path(r.output_dir, "result.json").read_text())["placement"] for r in got] == where
    # One CPU per node and one per job: the two jobs ran at once, one on each node.
    assert {p["node_id"] for p in where} == set(nodes), where


@pytest.mark.ray_cluster
def test_a_killed_ray_worker_node_and_a_stopped_harness(base_dir, ray_cluster, tmp_path):
    """Two long jobs at once: one on the worker node, which is killed mid-job (its result: ``crashed``); one on the
    head, run by another process that is then stopped by SIGTERM (its task cancelled, no process left)."""
    import pickle
    import signal

    jobs = _jobs(tmp_path / "jobs", {name: {"batch_size": 8, "max_steps": 100_000} for name in ("lost", "stopped")})
    lost, stopped = _requests(jobs, base_dir, tmp_path / "out", LONG_TASK)
    (tmp_path / "requests.pkl").write_bytes(pickle.dumps([stopped]))
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path / "requests.pkl"), ray_cluster,
                                "head_node"], cwd=ROOT)
    ex = make_executor("ray", max_parallel=1, address=ray_cluster, threads=1, cpus_per_job=1,
                       resources={"worker_node": 1})   # the node that dies
    box: dict = {}
    runner = threading.Thread(target=lambda: box.update(results=ex.run([lost])))
    runner.start()
    try:
        deadline = time.time() + 180
        while not all((r.out / "train_log.jsonl").is_file() for r in (lost, stopped)) and time.time() < deadline:
            time.sleep(1)   # training has begun in both: each job is mid-way when its fault comes
        assert _trainers_in(stopped.out), "the stopped job's training process was not found"
        harness.send_signal(signal.SIGTERM)
        assert _cluster_sh("ray", "kill-worker", timeout=120).returncode == 0
        assert harness.wait(timeout=60) != 0
        runner.join(timeout=120)
        assert not runner.is_alive(), "the executor did not return after its node died"
    finally:   # the worker node back, for the tests and users after
        harness.kill()
        again = _cluster_sh("ray", "start")
    assert again.returncode == 0 and "worker node again" in again.stdout, again.stdout + again.stderr
    (res,) = box["results"]
    assert res.status == "crashed" and "Ray" in res.detail, res.detail
    assert not _none_left(tmp_path / "out"), "a Ray task's process outlived its harness or its node"


# ------------------------------------------------------------------------------------------------ start-up

@pytest.mark.parametrize("engine", ["slurm", "ray"])
def test_at_train_refuses_to_start_when_the_engine_does_not_answer(engine, tmp_path):
    """One line naming the controller or head, exit 2, before any episode (no cluster needed: nothing answers)."""
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "slurm.conf")}
    if engine == "slurm":
        if shutil.which("sinfo") is None:
            pytest.skip("no SLURM client here: bash scripts/cluster.sh slurm start installs it")
        # A controller on a port where nothing listens.
        (tmp_path / "slurm.conf").write_text("ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\n"
                                             "SlurmctldPort=1\nAuthType=auth/none\nNodeName=x CPUs=1\n"
                                             "PartitionName=p Nodes=x\n")
        args = ["hardware.executor=slurm"]
    else:
        pytest.importorskip("ray")
        args = ["hardware.executor=ray", "hardware.ray_address=127.0.0.1:1"]
    done = subprocess.run([str(Path(sys.executable).parent / "at-train"), "experiment=smoke",
                           f"runs_dir={tmp_path}/runs", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("at-train: error: hardware.") and ("SLURM controller" in last or "Ray head" in last), \
        done.stderr[-2000:]
    assert not list((tmp_path / "runs").rglob("episodes")), "nothing may have run"
