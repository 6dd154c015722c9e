"""Job cache: what changes the key, what is stored, and what a hit looks like (no training here).

    .venv/bin/pytest tests/unit/test_cache.py -q          (~5 s)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.salt import SALT_ENV
from agent_trainer.inner_loop.run.cache import CACHED_FROM_FILE, JobCache, cache_counts, cache_key, key_parts
from agent_trainer.inner_loop.run.job import Job
from agent_trainer.inner_loop.run.request import JobRequest
from agent_trainer.inner_loop.run.job import RESULT_FILE, JobResult, run_job


def _task(**budget) -> TaskSpec:
    return TaskSpec(name="calc_test", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                    budget={"max_steps": 50, "max_seconds": 60, "max_usd": 0.05, **budget})


def _job(root: Path, name: str = "job", seed: int = 0, lr: float = 1e-3) -> Path:
    job = root / name
    job.mkdir(parents=True)
    spec = {"base_model": "tiny-s", "algorithm": "sft", "hyperparameters": {"batch_size": 8, "learning_rate": lr,
            "max_steps": 3}, "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]}, "seed": seed}
    (job / "job.yaml").write_text(yaml.safe_dump(spec))
    return job


def _key(job: Path, base: Path, task: TaskSpec | None = None, hidden_n: int = 16, **settings) -> str:
    request = JobRequest.of(job, task or _task(), hidden_n=hidden_n, model_dir=base, **settings)
    return cache_key(key_parts(Job.open(request)))


def test_same_content_same_key_wherever_the_folder_is(base_dir, tmp_path):
    a, b = _job(tmp_path, "a"), _job(tmp_path, "b")
    (a / "output").mkdir()
    (a / "output" / "result.json").write_text("{}")  # the default output folder is not the job's content
    assert _key(a, base_dir) == _key(b, base_dir)


def test_every_part_of_a_jobs_content_changes_the_key(base_dir, tmp_path, monkeypatch):
    ref = _key(_job(tmp_path, "ref"), base_dir)
    assert _key(_job(tmp_path, "seed", seed=1), base_dir) != ref
    assert _key(_job(tmp_path, "lr", lr=2e-3), base_dir) != ref
    helper = _job(tmp_path, "helper")
    (helper / "helpers.py").write_text("X = 1\n")  # a file a reward could import
    assert _key(helper, base_dir) != ref
    assert _key(_job(tmp_path, "task"), base_dir, task=_task(max_steps=40)) != ref
    assert _key(_job(tmp_path, "n"), base_dir) == ref
    assert _key(_job(tmp_path, "n2"), base_dir, hidden_n=32) != ref
    assert _key(_job(tmp_path, "sandbox"), base_dir, wrap=lambda argv: argv) != ref, "sandboxed"

    # Another hidden set (task.hidden_salt): its own score and contamination verdict, never the other salt's.
    monkeypatch.setenv(SALT_ENV, "public:other")
    assert _key(_job(tmp_path, "salt"), base_dir) != ref
    monkeypatch.setenv(SALT_ENV, "public")
    assert _key(_job(tmp_path, "salt_public"), base_dir) == ref, "the default salt keeps the keys it had"

    # Another kernel path (torch's level, MKL's code branch) rounds differently: never a hit for the other one.
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert _key(_job(tmp_path, "kernels"), base_dir) != ref
    monkeypatch.delenv("MKL_CBWR")

    other_weights = tmp_path / "base2"
    shutil.copytree(base_dir, other_weights)
    assert _key(_job(tmp_path, "copy"), other_weights) == ref, "a copy of the same weights is the same base model"
    from safetensors.torch import load_file, save_file

    w = load_file(other_weights / "model.safetensors")
    first = sorted(w)[0]
    w[first] = w[first] + 1e-3
    save_file(w, other_weights / "model.safetensors", metadata={"format": "pt"})
    assert _key(_job(tmp_path, "new_weights"), other_weights) != ref


def _result(out: Path, status: str = "ok") -> JobResult:
    out.mkdir(parents=True, exist_ok=True)
    (out / "model").mkdir(exist_ok=True)
    (out / "model" / "config.json").write_text("{}")
    (out / "train_log.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    return JobResult(status=status, task="calc_test", family="calc_chain", job_dir="j", output_dir=str(out),
                     job_hash="h", hidden_score=0.25, baseline=0.125, uplift=0.125, steps=3,
                     seconds={"validate": 1.0, "train": 4.0, "process": 9.0, "eval": 2.0, "total": 13.0}, usd=0.001)


def test_only_reproducible_outcomes_are_stored(tmp_path):
    cache = JobCache(tmp_path / "jobs")
    for status in ("timeout", "crashed", "invalid", "over_budget"):
        assert not cache.put(f"{status:0<64}", _result(tmp_path / status, status), {})
        assert cache.get(f"{status:0<64}") is None
    assert cache.put("ab" * 32, _result(tmp_path / "ok"), {"seed": 0})
    assert cache.put("cd" * 32, _result(tmp_path / "div", "diverged"), {})
    entry = cache.get("ab" * 32)
    assert entry["result"]["hidden_score"] == 0.25 and entry["model_dir"].endswith("ok/model")
    assert not (cache.entry_dir("ab" * 32) / "model").exists(), "weights are pointed at, never copied"


def test_a_hit_is_marked_cached_and_costs_only_the_lookup(tmp_path):
    import time

    cache = JobCache(tmp_path / "jobs")
    key = "ef" * 32
    cache.put(key, _result(tmp_path / "first"), {})
    out = tmp_path / "second"
    hit = cache.restore(key, cache.get(key), tmp_path / "job2", out, time.monotonic(), price_per_hour=3.6)
    assert hit.cached and hit.cache_key == key and hit.cached_from == str((tmp_path / "first").resolve())
    assert (hit.hidden_score, hit.uplift, hit.steps) == (0.25, 0.125, 3)
    assert hit.seconds["train"] == 4.0, "the staged reward's speed stage sees the original training time"
    assert hit.seconds["total"] < 1.0 and hit.usd < 1e-3, "the ledger charges the lookup, not the original run"
    on_disk = json.loads((out / RESULT_FILE).read_text())
    assert on_disk["cached"] is True and on_disk["output_dir"] == str(out)
    assert (out / "train_log.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n'
    pointer = json.loads((out / CACHED_FROM_FILE).read_text())
    assert pointer["model_exists"] and pointer["original_seconds"]["total"] == 13.0


def test_a_damaged_entry_is_a_miss(tmp_path):
    cache = JobCache(tmp_path / "jobs")
    key = "12" * 32
    cache.put(key, _result(tmp_path / "first"), {})
    (cache.entry_dir(key) / "entry.json").write_text("{not json")
    assert cache.get(key) is None


def test_an_entry_whose_weights_were_deleted_is_a_miss(tmp_path):
    cache = JobCache(tmp_path / "jobs")
    key = "34" * 32
    cache.put(key, _result(tmp_path / "first"), {})
    assert cache.get(key) is not None
    shutil.rmtree(tmp_path / "first" / "model")
    assert cache.get(key) is None, "a hit must come with weights to score, fork or continue from"


def test_cache_counts():
    rs = [JobResult("ok", "t", "f", "j", "o", "h", cache_key="k", cached=True),
          JobResult("ok", "t", "f", "j", "o", "h", cache_key="k2"),
          JobResult("invalid", "t", "f", "j", "o", "h")]
    assert cache_counts(rs) == {"hits": 1, "misses": 1}


def test_a_job_the_key_cannot_be_computed_for_runs_uncached(base_dir, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text("base_model: [unclosed\n")
    res = run_job(job, _task(), model_dir=base_dir, cache_dir=tmp_path / "cache", progress=False, cache=True)
    assert res.status == "invalid" and res.cache_key is None and not res.cached
    assert not list((tmp_path / "cache" / "jobs").glob("??/*"))


def test_the_outer_step_counts_hits_misses_and_only_real_job_time():
    from agent_trainer.outer_loop.rl.rollouts import JobRunner

    secs = {"validate": 1.0, "train": 4.0, "process": 9.0, "eval": 2.0, "total": 12.0}
    rs = [JobResult("ok", "t", "f", "j", "o", "h", cache_key="k", cached=True, seconds=dict(secs)),
          JobResult("ok", "t", "f", "j", "o", "h", cache_key="k2", seconds=dict(secs))]
    jobs = JobRunner(None, None)
    jobs.count(rs)
    jobs.count(rs[1:])
    assert jobs.stats == {"cache_hits": 1, "cache_misses": 2, "seconds_jobs_validate": 2.0,
                          "seconds_jobs_process": 18.0, "seconds_jobs_eval": 4.0}


@pytest.mark.slow   # a real training process (~30 s): make test runs it, make test-fast does not
def test_job_yaml_is_read_once_and_the_process_trains_what_was_validated(base_dir, tmp_path, monkeypatch):
    """One read of job.yaml per job, cache key included; the training process gets the parsed spec, so a
    job.yaml rewritten after validation changes nothing about the run."""
    import agent_trainer.inner_loop.spec.jobspec as jobspec
    import agent_trainer.inner_loop.spec.validate as validate
    from agent_trainer.inner_loop.run.job import execute

    reads = []
    real = jobspec.read_job_yaml
    monkeypatch.setattr(validate, "read_job_yaml", lambda path: reads.append(path) or real(path))
    monkeypatch.setattr(jobspec, "read_job_yaml", lambda path: reads.append(path) or real(path))
    job = _job(tmp_path)
    request = JobRequest.of(job, _task(), tmp_path / "out", model_dir=base_dir, cache_dir=tmp_path / "cache",
                            progress=False, dry_run=False, threads=1, cache=True)
    opened = Job.open(request)
    assert len(reads) == 1 and opened.spec.hyperparameters.max_steps == 3
    spec = yaml.safe_load((job / "job.yaml").read_text())
    spec["hyperparameters"]["max_steps"] = 7
    (job / "job.yaml").write_text(yaml.safe_dump(spec))
    res = execute(opened)
    assert res.status == "ok", res.detail + res.error
    assert res.planned_steps == 3 and res.steps == 3, "the process trained the validated spec"
    assert len(reads) == 1, reads
    assert json.loads((tmp_path / "out" / "job_spec.json").read_text())["hyperparameters"]["max_steps"] == 3
