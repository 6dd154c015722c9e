"""A job is read once, from a snapshot: a writer that changes the job folder after it was opened changes nothing.

``Job.open`` copies the folder (size-capped, links copied as links, never followed) into a read-only
folder of the harness; validation, the contamination check, training and the trained-rows check read
that copy, and the trained rows of every stage are scanned against the hidden set.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.evaluation.families import get_family
from agent_trainer.inner_loop.isolation.contamination import check_job, check_trained
from agent_trainer.inner_loop.run.job import Job
from agent_trainer.inner_loop.run.request import JobRequest
from agent_trainer.inner_loop.spec import jobfiles
from agent_trainer.inner_loop.spec.jobfiles import SnapshotError, snapshot_job
from agent_trainer.inner_loop.train.data import TRAINED_ROWS, build_rows, trained_record

TASK = "examples/tasks/calc_chain_v1_fast.json"
N = 200


def _rows(examples):
    return "".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in examples)


def _job(folder):
    folder.mkdir(parents=True)
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "sft", "seed": 0,
        "hyperparameters": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 2},
        "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 16}], "file": "data.jsonl"}}))
    (folder / "data.jsonl").write_text(_rows(get_family("calc_chain").training_examples(seed=5, n=20)))
    return folder


def test_a_swap_after_the_job_is_opened_reaches_neither_the_checks_nor_the_trainer(tmp_path):
    source = _job(tmp_path / "job")
    clean = (source / "data.jsonl").read_text()
    job = Job.open(JobRequest.of(source, TASK, tmp_path / "out"))
    try:
        snap = job.request.job_dir
        assert snap != source and job.source_dir == source and job.request.out == tmp_path / "out"
        (source / "data.jsonl").write_text(_rows(hidden_set("calc_chain", N)[:20]))  # the writer's swap
        assert (snap / "data.jsonl").read_text() == clean
        assert not check_job(job.spec, snap, "calc_chain", N).flagged
        assert stat.S_IMODE((snap / "data.jsonl").stat().st_mode) == 0o444
        assert stat.S_IMODE(snap.stat().st_mode) == 0o555
        # The trainer reads the snapshot; a record built from the swapped folder is not the declared rows.
        out = tmp_path / "out"
        out.mkdir()
        (out / TRAINED_ROWS).write_text("".join(
            json.dumps(r) + "\n" for r in trained_record(build_rows(job.spec, source, default_family="calc_chain"))))
        after = check_trained(job.spec, snap, out, "calc_chain", N)
        assert after.flagged and after.kinds["undeclared"] == 1 and after.hits == 20, after.summary()
    finally:
        job.close()
    assert not snap.exists() and not snap.parent.exists()


def test_the_snapshot_copies_links_as_links_and_has_caps(tmp_path, monkeypatch):
    source = _job(tmp_path / "job")
    (source / "leak.jsonl").symlink_to("/etc/passwd")
    os.mkfifo(source / "pipe.jsonl")  # never opened for a blocking read
    (source / "output").mkdir()
    (source / "output" / "big.bin").write_bytes(b"x" * 4096)
    snap = snapshot_job(source, skip=[source / "output"])
    try:
        assert os.readlink(snap / "leak.jsonl") == "/etc/passwd"
        assert not (snap / "output").exists() and not (snap / "pipe.jsonl").exists()
    finally:
        jobfiles.remove_snapshot(snap)
    monkeypatch.setattr(jobfiles, "MAX_SNAPSHOT_BYTES", 1000)
    with pytest.raises(SnapshotError, match="more than"):
        snapshot_job(source, skip=[source / "output"])
    job = Job.open(JobRequest.of(source, TASK, tmp_path / "out2"))
    assert job.spec is None and "more than" in job.report.findings[0].message
