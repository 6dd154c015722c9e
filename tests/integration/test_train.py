"""at-train end to end on the smoke experiment: the LoRA learns from episodes, MLflow holds the
step metrics, and a run killed mid-step resumes with every step counted exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agent_trainer.config import compose_config
from agent_trainer.tracking import bare_key, metric_key, read_metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _ledger(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines() if x.strip()]


def test_smoke_training_updates_the_adapter_and_logs_every_step(tmp_path, built_agent):
    from agent_trainer.commands import train as at_train

    # inner.cache=false: every job trains for real here, whatever earlier runs left in the job cache
    cfg = compose_config([f"runs_dir={tmp_path}", "run_id=smoke", "experiment=smoke", "inner.cache=false"], "train")
    at_train.run(cfg)
    run = tmp_path / "smoke"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    # every job an episode submitted really ran (a result with a status, a ledger record), and the
    # reward saw it: the run is not just the validation stage
    summaries = [json.loads(p.read_text()) for p in sorted(run.glob("episodes/*/summary.json"))]
    submitted = [j for s in summaries for j in s["jobs"]]
    assert submitted and all(j["status"] for j in submitted)
    assert len([r for r in _ledger(run) if r["kind"] == "job"]) == len(submitted)
    assert all(s["reward"]["job_success"] == (1.0 if s["jobs"] and s["jobs"][-1]["status"] == "ok" else 0.0)
               for s in summaries)
    # the adapter after step 1 differs from the one after step 0 (B matrices start at zero)
    a0 = load_file(run / "checkpoints/step_0000/adapter/adapter_model.safetensors")
    a1 = load_file(run / "checkpoints/step_0001/adapter/adapter_model.safetensors")
    assert a0.keys() == a1.keys() and any(not torch.equal(a0[k], a1[k]) for k in a0)
    assert any(k for k in a1 if "lora_B" in k) and not any("base_layer" in k for k in a1), "adapter only"
    # the base agent on disk is untouched by training
    manifest = json.loads((built_agent / "manifest.json").read_text())
    from agent_trainer.inner_loop.models.build import file_sha256

    assert file_sha256(built_agent / "model.safetensors") == manifest["files"]["model.safetensors"]
    marker = json.loads((run / "outer_run.json").read_text())
    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    keys = [metric_key(k) for k in ("reward_mean", "validation_mean", "usd_cumulative")]
    hist = read_metrics(uri, marker["mlflow_run_id"], keys)
    assert keys == ["reward/reward_mean", "stage/validation_mean", "cost/usd_cumulative"]  # grouped in the UI
    assert [s for s, _ in hist["reward/reward_mean"]] == [0, 1]
    assert [v for _, v in hist["reward/reward_mean"]] == pytest.approx([r["reward_mean"] for r in rows])
    assert all((run / "plots" / f).is_file() for f in ("reward.png", "choices.png", "heldout.png"))
    episodes = sorted(p.name for p in (run / "episodes").iterdir())
    assert len(episodes) == 4 and all((run / "episodes" / e / "trajectory.jsonl").is_file() for e in episodes)
    assert _child_runs(uri, marker["mlflow_run_id"]) == episodes, "one nested MLflow run per episode"


def _child_runs(uri: str, parent: str) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    return sorted(r.info.run_name for r in runs)


def test_killed_mid_step_resumes_with_every_step_and_record_once(tmp_path, built_agent):
    args = [sys.executable, "-m", "agent_trainer.commands.train", f"runs_dir={tmp_path}", "experiment=smoke",
            "outer.steps=2", "tracking.enabled=true"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(args + ["run_id=r"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    run = tmp_path / "r"
    deadline = time.time() + 600
    try:
        # wait until step 0 is checkpointed and step 1 has spent something, then kill without warning
        while time.time() < deadline and proc.poll() is None:
            ledger = run / "ledger.jsonl"
            if (run / "checkpoints/step_0000").is_dir() and ledger.exists() and '"s0001-' in ledger.read_text():
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before it could be killed mid-step"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (run / "checkpoints/step_0001").exists()
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path.resolve()}/mlflow.db")
    killed_run = json.loads((run / "outer_run.json").read_text())["mlflow_run_id"]
    client.set_tag(killed_run, "error", "interrupted")   # what a Ctrl-C leaves (a SIGKILL leaves nothing)
    # The killed process recorded its kind of CPU when it began; made another vendor's here, as if the resume ran
    # on another machine.
    versions = json.loads((run / "versions.json").read_text())
    here = versions["cpu"]["vendor"]
    versions["cpu"]["vendor"] = "elsewhere"
    (run / "versions.json").write_text(json.dumps(versions))

    resuming = subprocess.Popen(args + ["run_id=again", f"resume={run}"], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while time.time() < deadline and resuming.poll() is None and "resuming" not in (run / "train.log").read_text():
        time.sleep(0.1)
    # from the moment it continues the run, the resuming command has no folder of its own (a kill leaves none)
    assert not (tmp_path / "again").exists()
    out, err = resuming.communicate(timeout=900)
    assert resuming.returncode == 0, err[-2000:]
    # the resumed folder holds the outcome and the log; the resuming command leaves no folder of its own
    rec = json.loads((run / "run.json").read_text())
    assert rec["status"] == "ok" and rec["value"] is not None and rec["steps_completed"] == 2
    assert not (tmp_path / "again").exists() and "resuming" in (run / "train.log").read_text()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    marker = json.loads((run / "outer_run.json").read_text())
    hist = read_metrics(f"sqlite:///{tmp_path.resolve()}/mlflow.db", marker["mlflow_run_id"], ["reward/reward_mean"])
    assert [s for s, _ in hist["reward/reward_mean"]] == [0, 1]
    resumed = client.get_run(marker["mlflow_run_id"])
    assert resumed.info.status == "FINISHED" and "error" not in resumed.data.tags, "the kill's error is not the outcome"
    # each resume is a line of resumes.jsonl: after how many steps, with which overrides and changes
    (first,) = [json.loads(x) for x in (run / "resumes.jsonl").read_text().splitlines()]
    assert first["steps_done"] == 1 and f"resume={run}" in first["overrides"] and first["changes"] == {}
    # the move is recorded and said, the run's versions.json keeps the first process's record
    assert first["machine"] == {"cpu.vendor": {"saved": "elsewhere", "now": here}}
    assert "resumed on another machine or software" in err and "cpu.vendor elsewhere -> " + here in err, err[-2000:]
    assert json.loads((run / "versions.json").read_text())["cpu"]["vendor"] == "elsewhere"
    assert resumed.data.tags["resumed.cpu.vendor"] == here
    done = subprocess.run(args + [f"resume={run}"], cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)
    assert done.returncode == 0 and "has all its 2 steps: nothing to train" in done.stdout, done.stderr[-2000:]
    record, resumes = (run / "run.json").read_bytes(), (run / "resumes.jsonl").read_bytes()
    assert json.loads(resumes.splitlines()[-1])["steps_done"] == 2
    lower = subprocess.run([*args[:-2], "tracking.enabled=true", "outer.steps=1", f"resume={run}"], cwd=ROOT, env=env,
                           text=True, capture_output=True, timeout=600)
    assert lower.returncode == 2 and "below the 2 steps the run completed" in lower.stderr, lower.stderr[-2000:]
    assert (run / "run.json").read_bytes() == record, "a refused resume leaves the run as it was"
    assert (run / "resumes.jsonl").read_bytes() == resumes
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    # every step metric in MLflow: at most once per step, and the value of that step's metrics.jsonl row
    every = read_metrics(f"sqlite:///{tmp_path.resolve()}/mlflow.db", marker["mlflow_run_id"])
    for key, points in every.items():
        assert len({s for s, _ in points}) == len(points), f"{key} logged twice for a step: {points}"
        if key == rec["value_name"]:
            continue   # the run's returned value (what a sweep ranks by), logged once at the end, not a step's
        assert all(v == pytest.approx(rows[s][bare_key(key)], nan_ok=True) for s, v in points), key
    # run folder: one complete checkpoint per step (none half-written), episodes of complete steps only
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000", "step_0001"]
    kept = sorted(p.name for p in (run / "episodes").iterdir())
    assert sorted({int(name[1:5]) for name in kept}) == [0, 1] and len(kept) == 2 * int(rows[0]["episodes"])
    assert all(p.name.startswith("s0001-")
               for p in (run / "rolled_back").iterdir()), "only the killed step is set aside"
    assert _child_runs(f"sqlite:///{tmp_path.resolve()}/mlflow.db", marker["mlflow_run_id"]) == sorted(
        p.name for p in (run / "episodes").iterdir()), "each kept episode's nested run exactly once"
    # ledger: every record parses; each episode's LLM calls appear exactly once (= its turns)
    records = _ledger(run)
    assert [r["seq"] for r in records] == list(range(len(records)))
    for ep in (run / "episodes").iterdir():
        summary = json.loads((ep / "summary.json").read_text())
        calls = [r for r in records if r["episode"] == ep.name and r["kind"] == "llm"]
        assert len(calls) == summary["n_turns"], ep.name
    assert {r["episode"] for r in records} <= {p.name for p in (run / "episodes").iterdir()}
    assert (run / "ledger.rolled_back.jsonl").exists() and (run / "rolled_back").is_dir()


def test_a_terminated_run_is_recorded_as_killed(tmp_path, built_agent):
    """``kill`` (SIGTERM, what schedulers send) ends at-train as Ctrl-C does: run.json says killed, not running."""
    args = [sys.executable, "-m", "agent_trainer.commands.train", f"runs_dir={tmp_path}", "experiment=smoke",
            "outer.steps=3", "tracking=off", "run_id=t"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    run, deadline = tmp_path / "t", time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None and not (run / "checkpoints/step_0000").is_dir():
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before it could be terminated"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    rec = json.loads((run / "run.json").read_text())
    assert proc.returncode == 143 and "terminated (SIGTERM)" in err
    assert rec["status"] == "killed" and rec["error"] == "terminated (SIGTERM)" and rec["steps_completed"] >= 1


def test_overlapped_jobs_give_the_same_episodes_as_jobs_after_sampling(tmp_path, built_agent):
    """``outer.overlap_jobs`` starts each episode's job while the next episodes are sampled; it must
    change when jobs run, not what they are or score: same choices, jobs, hidden scores and reward
    stages (all but speed, which is measured training time and differs run to run)."""
    from agent_trainer.commands import train as at_train

    def episodes(overlap: bool) -> dict:
        rid = f"overlap_{overlap}".lower()
        at_train.run(compose_config([f"runs_dir={tmp_path}", f"run_id={rid}", "experiment=smoke", "outer.steps=1",
                                     "inner.cache=false", "tracking=off", f"outer.overlap_jobs={overlap}"], "train"))
        out = {}
        for p in sorted((tmp_path / rid / "episodes").glob("*/summary.json")):
            s = json.loads(p.read_text())
            r = s["reward"]
            out[s["episode_id"]] = (round(r["total"] - r["w_speed"] * r["speed"], 9), r["validation"],
                                    r["job_success"], r["quality"], s["status"], s.get("choices"),
                                    [(j["status"], j.get("hidden_score"), j.get("job_hash")) for j in s["jobs"]])
        return out

    together, after = episodes(True), episodes(False)
    assert together and together == after
    assert any(jobs for *_, jobs in together.values()), "at least one episode submitted a job"
    # Runs made with tracking=off compare from their folders alone (no MLflow run to read).
    import csv

    from agent_trainer.commands import compare as at_compare

    at_compare.run(compose_config([f"runs_dir={tmp_path}", "run_id=cmp", "runs=[overlap_true,overlap_false]"],
                                  "compare"))
    with open(tmp_path / "cmp" / "compare.csv") as fh:
        table = list(csv.DictReader(fh))
    metrics = [json.loads(line) for line in (tmp_path / "overlap_true" / "metrics.jsonl").read_text().splitlines()]
    assert [r["outer.overlap_jobs"] for r in table] == ["True", "False"]
    assert float(table[0]["reward"]) == pytest.approx(metrics[-1]["reward_mean"])
    named = json.loads((tmp_path / "overlap_true" / "run.json").read_text())["run_name"]
    assert table[0]["run"] == named and table[0]["reward"] == table[1]["reward"]
