"""Bounded work in the harness: agent text that expands under Unicode normalisation costs the harness nothing.

A data file of the size cap whose one extra column holds millions of U+FDFA (18 characters each after
NFKD) ends ``invalid`` at once (every string value of a row has a length cap); a text that expands
past the fold cap is refused while folding, chunk by chunk; and the contamination check runs in a child
with rlimits and a deadline, whose failure flags the job.
"""

from __future__ import annotations

import json
import resource
import time

import pytest
import yaml

from agent_trainer.evaluation.contamination import MAX_FOLDED_CHARS, FoldTooLarge, fold
from agent_trainer.inner_loop.isolation.contamination import check_job, in_check_child
from agent_trainer.inner_loop.spec.cost import row_tokens
from agent_trainer.inner_loop.spec.jobfiles import MAX_FIELD_CHARS
from agent_trainer.inner_loop.spec.jobspec import load_job
from agent_trainer.inner_loop.train.data import MAX_DATA_FILE_BYTES as MAX_FILE_BYTES, build_rows

EXPANDS = "\ufdfa"  # ARABIC LIGATURE SALLALLAHOU ALAYHE WASALLAM: 18 characters after NFKD
TASK = "examples/tasks/calc_chain_v1_fast.json"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _job(folder, rows=(), reward: str | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"base_model": "tiny-s", "algorithm": "sft", "seed": 0,
            "hyperparameters": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 2},
            "data": {"file": "data.jsonl"}}
    if reward is not None:
        spec.update(algorithm="grpo", reward={"file": "reward.py", "functions": [{"name": "r", "source": "file"}]})
        (folder / "reward.py").write_text(reward, encoding="utf-8")
    (folder / "job.yaml").write_text(yaml.safe_dump(spec))
    (folder / "data.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                       encoding="utf-8")
    return folder


def test_an_expansion_job_at_the_size_cap_ends_invalid_at_once_in_a_small_harness(tmp_path):
    import agent_trainer.inner_loop.models  # noqa: F401  (torch and transformers: a harness has them imported)
    from agent_trainer.inner_loop.run.job import run_job

    pad = (MAX_FILE_BYTES - 200) // len(EXPANDS.encode())
    job = _job(tmp_path / "job", [{"prompt": "calc: 1+2=", "answer": "3", "note": EXPANDS * pad}])
    assert MAX_FILE_BYTES - 1024 < (job / "data.jsonl").stat().st_size <= MAX_FILE_BYTES
    before, t0 = _peak_rss_mb(), time.process_time()   # CPU time of this process: the bound holds under load
    res = run_job(job, TASK, output_dir=tmp_path / "out", threads=1, cache=False, warm_workers=False)
    seconds = time.process_time() - t0
    assert res.status == "invalid", res.findings
    assert any(f"under {MAX_FIELD_CHARS}" in f["message"] for f in res.findings), res.findings
    assert seconds < 10, f"{seconds:.1f} s"
    assert _peak_rss_mb() < max(before, 0) + 400 and _peak_rss_mb() < 1024 + before, (before, _peak_rss_mb())


def test_folding_refuses_an_expansion_chunk_by_chunk():
    t0 = time.process_time()
    with pytest.raises(FoldTooLarge):
        fold(EXPANDS * (MAX_FOLDED_CHARS // 17))
    assert time.process_time() - t0 < 5
    assert fold("CALC\u00a0١") == "calc 1"


def test_a_reward_file_that_expands_past_the_fold_cap_flags_the_job_and_costs_only_the_child(tmp_path):
    source = "def r(prompts, completions, **kw):\n    return [0.0 for _ in prompts]\n# " + EXPANDS * 80_000 + "\n"
    job = _job(tmp_path / "job", [{"prompt": "calc: 1+2=", "answer": "3"}], reward=source)
    before = _peak_rss_mb()
    r = check_job(load_job(job), job, "calc_chain", 200)
    assert r.flagged and "Unicode normalisation" in r.error and "reward.py" in r.error, r.to_dict()
    assert _peak_rss_mb() < before + 100


def test_a_check_child_past_its_deadline_or_limits_flags_the_job(tmp_path):
    job = _job(tmp_path / "job", [{"prompt": "calc: 1+2=", "answer": "3"}])
    spec = load_job(job)
    late = in_check_child("job", spec, job, None, "calc_chain", 200, deadline_s=0.05)
    assert late.flagged and "deadline" in late.error
    small = in_check_child("job", spec, job, None, "calc_chain", 200, limits={"RLIMIT_AS": 16 * 2**20})
    assert small.flagged and "failed" in small.error
    assert not check_job(spec, job, "calc_chain", 200).flagged


def test_the_validation_parses_agent_data_in_a_child_first(tmp_path, monkeypatch):
    """Every agent data file, a small one too, is parsed and tokenized in the bounded child: one path, and agent text
    is never tokenized in the harness process."""
    from agent_trainer.inner_loop.isolation import contamination
    from agent_trainer.inner_loop.spec import cost
    from agent_trainer.inner_loop.spec.validate import validate_job

    job = _job(tmp_path / "job", [{"prompt": "calc: 1+2=", "answer": "3"}] * 8)
    parsed = contamination.parse_in_child(load_job(job), job, "calc_chain")
    assert parsed.error == "" and parsed.tokens == [row_tokens(build_rows(load_job(job), job, "calc_chain"))]
    assert "deadline" in contamination.parse_in_child(load_job(job), job, "calc_chain", deadline_s=0.05).error

    def no_tokenizing_here(texts):
        raise AssertionError(f"agent text tokenized in the harness process: {texts[:2]}")

    monkeypatch.setattr(cost, "token_counts", no_tokenizing_here)   # the child is a fresh interpreter: unpatched
    report = validate_job(job, TASK, dry_run=False)
    assert report.ok, report.to_text()
    assert report.probe["check_seconds"]["parse"] > 0 and report.probe["check_budget"]["cpu_limit_s"] == 31
    assert report.estimated_cost.seconds > 0
    monkeypatch.setattr(contamination, "CHECK_LIMITS", {"RLIMIT_AS": 16 * 2**20})  # a child that cannot finish
    report = validate_job(job, TASK, dry_run=False)
    assert not report.ok and "within the harness's limits" in report.errors[0].message, report.to_text()


def test_the_checks_time_is_bounded_by_the_jobs_size(tmp_path):
    """The checking children get 30 CPU seconds + 10 a MB of the job's own files + 0.5 a 1,000 rows (at most 300),
    and 4x that + 60 s of wall clock (at most 600): a small job's checks cannot take the 300 s a 20 MB one may; a
    child past its CPU seconds ends the check, and the job is flagged."""
    from agent_trainer.inner_loop.isolation.contamination import CheckBudget

    small = _job(tmp_path / "small", [{"prompt": "calc: 1+2=", "answer": "3"}] * 8)
    budget = CheckBudget.of(load_job(small), small)
    assert budget.rows == 8 and budget.cpu_s == 31 and budget.wall_s == 4 * 31 + 60
    assert budget.limits()["RLIMIT_CPU"] == 31 and budget.limits()["RLIMIT_AS"] == 4 * 2**30
    big = _job(tmp_path / "big", [{"prompt": "calc: 1+2=" + "x" * 1990, "answer": "3"}] * 2000)   # ~4 MB
    assert 3.8 < CheckBudget.of(load_job(big), big).mb < 4.0 and CheckBudget.of(load_job(big), big).cpu_s == 70
    assert CheckBudget(mb=20, rows=100_000).cpu_s == 280   # a job at the caps: an honest one took 39 s of it
    assert CheckBudget(mb=20, rows=400_000).cpu_s == 300 and CheckBudget(mb=20, rows=400_000).wall_s == 600
    assert CheckBudget(rows=100_000).cpu_s == 80   # 100,000 library rows: their trained-rows check takes ~6 s
    # A child that spends more CPU seconds than its budget is ended, says so, and the check flags the job.
    late = in_check_child("job", load_job(big), big, None, "calc_chain", 200, limits={"RLIMIT_CPU": 1},
                          deadline_s=300)
    assert late.flagged and "limit of 1 CPU seconds" in late.error, late.error
