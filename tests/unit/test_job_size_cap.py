"""A job cannot make the harness build unbounded data: the rows it declares (library items over its sources and
stages, and the rows of its data files) are capped before anything is built, checked or priced."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.spec.jobspec import MAX_JOB_ROWS, JobSpecError, load_job
from agent_trainer.inner_loop.spec.validate import validate_job

TASK = TaskSpec(name="calc_cap", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                budget={"max_steps": 400, "max_seconds": 60, "max_usd": 0.05})
HP = {"learning_rate": 1e-3, "batch_size": 32, "max_steps": 100}


def write(tmp_path, job: dict, rows: int = 0):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"base_model": "tiny-s", "seed": 0, **job}))
    if rows:
        (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}", "answer": "a"}) + "\n"
                                                     for i in range(rows)))
    return tmp_path


def sources(n: int, size: int) -> list[dict]:
    return [{"family": "calc_chain", "seed": i + 1, "size": size} for i in range(n)]


def test_sixteen_full_sources_are_refused_before_a_row_is_built(tmp_path):
    """16 x 100,000 items took the harness 133 s and 4.2 GB to validate (priced as 19 s of training)."""
    job = write(tmp_path, {"algorithm": "sft", "hyperparameters": HP, "data": {"sources": sources(16, 100_000)}})
    t0 = time.monotonic()
    report = validate_job(job, TASK, dry_run=False)
    assert time.monotonic() - t0 < 5
    [err] = report.errors
    assert err.field == "data.sources" and "1,600,000" in err.message and f"{MAX_JOB_ROWS:,}" in err.message
    assert "lower size" in err.hint


def test_stages_sharing_the_jobs_data_count_it_once(tmp_path):
    shared = {"stages": [{"algorithm": "sft", "hyperparameters": HP}, {"algorithm": "sft", "hyperparameters": HP}],
              "data": {"sources": sources(2, 30_000)}}
    assert len(load_job(write(tmp_path / "a", shared), "calc_chain").stage_specs()) == 2
    own = {"stages": [{"algorithm": "sft", "hyperparameters": HP, "data": {"sources": sources(2, 30_000)}},
                      {"algorithm": "sft", "hyperparameters": HP, "data": {"sources": sources(2, 30_000)}}]}
    with pytest.raises(JobSpecError, match=r"stages\.\d\.data\.sources.*120,000 items"):
        load_job(write(tmp_path / "b", own), "calc_chain")


def test_a_data_file_past_the_cap_is_a_finding(tmp_path):
    job = write(tmp_path, {"algorithm": "sft", "hyperparameters": HP,
                           "data": {"sources": sources(1, 1_000), "file": "data.jsonl"}}, rows=MAX_JOB_ROWS)
    report = validate_job(job, TASK, dry_run=False, sandbox=False)
    [err] = [f for f in report.errors if f.field == "data.file"]
    assert f"{MAX_JOB_ROWS + 1_000:,} rows" in err.message
