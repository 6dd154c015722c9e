"""Executors and the job cache with real inner jobs (TRL on a random-init tiny Qwen3, a few steps).

- the same batch of 3 jobs through sequential, local_parallel, submitit_local and (when Ray is
  installed: ``pip install -e '.[ray]'``) Ray gives the same results, in request order;
- a job run twice is a cache hit the second time: same numbers, marked cached, ~free; identical jobs
  submitted together run once (the second waits on the key's lock and gets the hit).

    .venv/bin/pytest tests/integration/test_executors.py -q        (~2 min on 2 cores, most of it submitit's fresh
                                                                    interpreters)
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.spec.cost import CostModel
from agent_trainer.inner_loop.run.executor import make_executor
from agent_trainer.inner_loop.run.job import RESULT_FILE
from agent_trainer.inner_loop.run.request import JobRequest

pytestmark = pytest.mark.slow

FAST_COSTS = CostModel(startup_s=0.0, grpo_step_s=1e-4, grpo_token_s=0.0, sft_step_s=1e-4, sft_sequence_s=0.0)
TASK = TaskSpec(name="calc_test", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                budget={"max_steps": 50, "max_seconds": 60, "max_usd": 0.05})
JOBS = {  # three different jobs, so that a mixed-up order would show
    "sft_a": {"algorithm": "sft", "hyperparameters": {"batch_size": 8, "learning_rate": 3e-3, "max_steps": 4}},
    "sft_b": {"algorithm": "sft", "hyperparameters": {"batch_size": 8, "learning_rate": 1e-2, "max_steps": 3},
              "seed": 1},
    "grpo": {"algorithm": "grpo", "hyperparameters": {"batch_size": 8, "learning_rate": 1e-3, "max_steps": 2,
                                                      "num_generations": 4, "max_completion_length": 4},
             "reward": {"functions": [{"name": "numeric_closeness", "weight": 1.0}]}},
}


def _write_jobs(root: Path) -> dict[str, Path]:
    out = {}
    for name, extra in JOBS.items():
        job = root / name
        job.mkdir(parents=True)
        spec = {"base_model": "tiny-s", "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]},
                "seed": 0, **extra}
        (job / "job.yaml").write_text(yaml.safe_dump(spec))
        out[name] = job
    return out


def _requests(jobs: dict[str, Path], base_dir: Path, out_root: Path, cache_dir: Path, **kw) -> list[JobRequest]:
    return [JobRequest.of(job, TASK, out_root / name, model_dir=base_dir, cache_dir=cache_dir, cost_model=FAST_COSTS,
                          progress=False, threads=1, **{"cache": False, "warm_workers": False, **kw})
            for name, job in jobs.items()]


def _numbers(r) -> tuple:
    return (r.status, r.steps, r.hidden_score, r.baseline, r.loss_curve, r.reward_curve)


# (executor, max_parallel, options, which jobs in which order). submitit_local starts a fresh
# interpreter per job (~20 s of imports each here), so it gets two of the jobs, reversed.
PATHS = [("local_parallel", 2, {}, [0, 1, 2]), ("submitit_local", 2, {}, [2, 1])]
if importlib.util.find_spec("ray") is not None:
    PATHS.append(("ray", 2, {"init_kwargs": {"include_dashboard": False}}, [0, 1, 2]))


@pytest.fixture(scope="module")
def reference(base_dir, tmp_path_factory):
    """The batch run one job after the other in this process: the results every executor must match."""
    root = tmp_path_factory.mktemp("executors")
    jobs = _write_jobs(root / "jobs")
    results = make_executor("sequential").run(_requests(jobs, base_dir, root / "sequential", root / "cache",
                                                        warm_workers=True))
    assert [r.status for r in results] == ["ok", "ok", "ok"], [r.detail + r.error for r in results]
    assert [r.device for r in results] == ["cpu"] * 3, "the default device is the CPU, and the result says so"
    return root, jobs, results


@pytest.mark.parametrize("kind,parallel,options,order", PATHS, ids=[p[0] for p in PATHS])
def test_every_executor_gives_the_same_results_in_request_order(reference, base_dir, kind, parallel, options, order,
                                                                tmp_path, monkeypatch):
    root, jobs, expected = reference
    ray_tmp = None
    if kind == "ray":  # a throwaway local Ray: no auth token in ~/.ray, its files in a short temp folder
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        ray_tmp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's unix sockets live under it
        options = {"init_kwargs": {**options["init_kwargs"], "_temp_dir": ray_tmp}}
    ex = make_executor(kind, max_parallel=parallel, folder=tmp_path / "submitit", **options)
    requests = _requests(jobs, base_dir, tmp_path / kind, root / "cache", warm_workers=kind == "local_parallel")
    try:
        got = ex.run([requests[i] for i in order])
    finally:
        getattr(ex, "close", lambda: None)()
        if ray_tmp:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    assert [_numbers(r) for r in got] == [_numbers(expected[i]) for i in order]
    assert all(not r.cached for r in got)
    for i, r in zip(order, got):
        on_disk = json.loads((tmp_path / kind / list(jobs)[i] / RESULT_FILE).read_text())
        assert on_disk["hidden_score"] == r.hidden_score and on_disk["loss_curve"] == r.loss_curve


def test_a_repeated_job_is_a_cache_hit_with_the_same_result(reference, base_dir, tmp_path):
    root, jobs, expected = reference
    cache = tmp_path / "cache"
    job = jobs["sft_a"]
    # Two identical jobs at once: one runs, the other waits on the key's lock and gets the hit.
    pair = [JobRequest.of(job, TASK, tmp_path / f"run{i}", model_dir=base_dir, cache_dir=cache, cost_model=FAST_COSTS,
                          progress=False, threads=1, warm_workers=True, cache=True) for i in (1, 2)]
    first, second = make_executor("local_parallel", max_parallel=2).run(pair)
    assert sorted([first.cached, second.cached]) == [False, True]
    miss, hit = (first, second) if second.cached else (second, first)
    assert _numbers(miss) == _numbers(expected[0]), "the cache changes nothing about a run"
    assert _numbers(hit) == _numbers(miss) and hit.cache_key == miss.cache_key
    assert hit.cached_from == str(Path(miss.output_dir).resolve())
    assert hit.seconds["train"] == miss.seconds["train"]

    # Later, sequentially: a hit again, costing a tiny fraction of the run (the ledger charges seconds["total"]).
    third = make_executor("sequential").run([replace(pair[0], output_dir=tmp_path / "run3")])[0]
    assert third.cached and _numbers(third) == _numbers(miss)
    assert third.seconds["total"] < 0.05 * miss.seconds["total"], (third.seconds, miss.seconds)
    assert third.usd < 0.05 * miss.usd
    assert json.loads((tmp_path / "run3" / RESULT_FILE).read_text())["cached"] is True

    # Off by config: the same job runs again.
    fresh = make_executor("sequential").run(
        [replace(pair[0], output_dir=tmp_path / "run4").with_settings(cache=False)])[0]
    assert not fresh.cached and fresh.cache_key is None and _numbers(fresh) == _numbers(miss)


@pytest.mark.gpu
def test_the_batch_trains_and_is_scored_on_the_gpus(reference, base_dir, tmp_path):
    """hardware=gpu_node's path: local_parallel with one GPU per job, each job on its own CUDA_VISIBLE_DEVICES."""
    root, jobs, expected = reference
    requests = _requests(jobs, base_dir, tmp_path / "gpu", tmp_path / "cache", warm_workers=True, device="cuda")
    got = make_executor("local_parallel", max_parallel=2, gpus_per_job=1).run(requests)
    assert [r.status for r in got] == ["ok"] * 3, [r.detail + r.error for r in got]
    assert [r.device for r in got] == ["cuda"] * 3
    for name in jobs:
        trl = json.loads((tmp_path / "gpu" / name / "trl_config.json").read_text())
        assert trl["use_cpu"] is False
    assert all(r.hidden_score is not None and r.baseline == e.baseline for r, e in zip(got, expected))
