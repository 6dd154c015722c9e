"""Hydra multirun sweeps as users run them: the real ``at-train``/``at-eval`` commands with the basic and
the joblib launcher, read back with ``mlflow.search_runs``; a failing job; ``rerun=``; resume of a sweep job."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from omegaconf import OmegaConf

from agent_trainer import sweeps
from agent_trainer.config import compose_config, validate

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def at(command: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "AGENT_TRAINER_QWEN3_DIR")}
    return subprocess.run([str(BIN / command), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def sweep_runs(runs_dir: Path, folder: Path):
    mlflow.set_tracking_uri(f"sqlite:///{runs_dir}/mlflow.db")
    return mlflow.search_runs(experiment_names=["agent-trainer"], filter_string=f"tags.sweep = '{folder.name}'",
                              order_by=["tags.`sweep.job` ASC"])


def head_commit() -> str | None:
    try:
        import git

        return git.Repo(ROOT).head.commit.hexsha
    except Exception:
        return None


def only_sweep(runs_dir: Path) -> Path:
    (folder,) = [p for p in runs_dir.iterdir() if p.is_dir() and (p / "multirun.yaml").is_file()]
    return folder


def check_named_runs(df, key: str, values: list[str]) -> None:
    names = list(df["tags.mlflow.runName"])
    assert len(set(names)) == len(names) == len(values)
    for name, value in zip(names, values):
        assert name.startswith(f"{key}={value} · "), name   # the swept value first: the UI cuts long names
    assert df["tags.sweep"].nunique() == 1
    commit = head_commit()
    if commit:
        assert set(df["tags.mlflow.source.git.commit"]) == {commit}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_train_sweep_names_runs_by_the_swept_value(tmp_path, built_agent, launcher):
    # The training family is a data family from a card on task.include_path (examples/families/word_math.yaml),
    # with no task spec of its own under the smoke pattern: at-train makes its spec from the card.
    out = at("at-train", "-m", f"hydra/launcher={launcher}", "experiment=smoke", "outer.steps=1", "outer.lora_r=4,8",
             "task.train_families=[word_math]", f"task.include_path=[{ROOT / 'examples' / 'families'}]",
             f"runs_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    folder = only_sweep(tmp_path)
    assert "2 ok, 0 failed" in out.stdout and (folder / "sweep.md").is_file()
    df = sweep_runs(tmp_path, folder)
    check_named_runs(df, "lora_r", ["4", "8"])
    assert set(df["status"]) == {"FINISHED"}
    assert list(df["tags.sweep.keys"]) == ["outer.lora_r"] * 2
    # the value Optuna and the table rank by is a metric of the run; the table counts crashed inner jobs
    values = [json.loads((folder / str(n) / "run.json").read_text())["value"] for n in (0, 1)]
    assert list(df["metrics.reward/reward_last3"]) == pytest.approx(values)
    assert "| job | status | value (reward_last3) | crashed inner jobs |" in out.stdout
    assert all(json.loads((folder / str(n) / "run.json").read_text())["jobs_crashed"] == 0 for n in (0, 1))
    assert all((folder / str(n) / "train.log").stat().st_size > 0 for n in (0, 1)), "train.log holds at-train's log"
    for n in (0, 1):   # Hydra's pickles load (under joblib the schema classes are re-imported in the workers)
        assert pickle.loads((folder / str(n) / ".hydra" / "config.pickle").read_bytes()).outer.lora_r == 4 + 4 * n
        assert pickle.loads((folder / str(n) / ".hydra" / "job_return.pickle").read_bytes()).status.name == "COMPLETED"
    assert "reward/reward_mean" in df.columns.str.removeprefix("metrics.").tolist()  # grouped metric names
    for n, lora_r in ((0, 4), (1, 8)):
        rec = json.loads((folder / str(n) / "run.json").read_text())
        assert rec["status"] == "ok" and rec["swept"] == {"outer.lora_r": str(lora_r)}
        assert json.loads((folder / str(n) / "outer_run.json").read_text())["run_id"] == f"{folder.name}/{n}"
        spec = json.loads((folder / str(n) / "task_specs" / "word_math.json").read_text())
        assert spec["name"] == "word_math_v1_tiny" and spec["family"] == "word_math"
        assert {p.parent.name.split("-")[2] for p in (folder / str(n) / "episodes").glob("*/summary.json")} == \
            {"word_math_v1_tiny"}
    if launcher == "basic":
        # rerun= replays job 0 from its run.json: the same per-step numbers (time, the job cost priced by the
        # clock and the job-cache counters, seconds_* usd* cache_*, aside: the rerun's jobs are cache hits), in a
        # new folder; the old one is unchanged.
        before = folder_bytes(folder / "0")
        again = at("at-train", f"rerun={folder / '0'}", cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert folder_bytes(folder / "0") == before
        new = [p for p in tmp_path.iterdir() if p.name.endswith("_train") and p != folder]
        (new,) = [p for p in new if (p / "metrics.jsonl").is_file()]
        def rows(p):
            return [{k: v for k, v in json.loads(ln).items() if not k.startswith(("seconds_", "usd", "cache_"))}
                    for ln in (p / "metrics.jsonl").read_text().splitlines()]
        assert rows(new) == rows(folder / "0") and rows(new)
        rec = json.loads((new / "run.json").read_text())
        assert "outer.lora_r=4" in rec["overrides"]
        run = mlflow.search_runs(experiment_names=["agent-trainer"], filter_string=f"tags.rerun_of = '{folder / '0'}'")
        assert len(run) == 1


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_eval_sweep_goes_on_past_a_failing_job(tmp_path, built_models, launcher):
    # qwen3-1.7b is a configured model whose weights are not on this machine: job 1 fails when it runs.
    out = at("at-eval", "-m", f"hydra/launcher={launcher}", "model=tiny-s,qwen3-1.7b,tiny-m", "inner.eval_size=4",
             f"runs_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "1 of 3 sweep jobs failed" in out.stderr and "Traceback" not in out.stderr
    assert "2 ok, 1 failed" in out.stdout and "| 1 | failed |" in out.stdout
    folder = only_sweep(tmp_path)
    df = sweep_runs(tmp_path, folder)
    check_named_runs(df, "model", ["tiny-s", "qwen3-1.7b", "tiny-m"])
    assert list(df["status"]) == ["FINISHED", "FAILED", "FINISHED"]
    assert "qwen3-1.7b" in df["tags.error"][1] and list(df["tags.sweep.keys"]) == ["model"] * 3
    rows = json.loads((folder / sweeps.SWEEP_FILE).read_text())
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert rows[0]["value"] is not None and rows[1]["value"] is None
    assert (folder / "2" / "eval.json").is_file()
    # the value the sweep returns is the metric its run names in the `returned` tag, and the table says which
    assert "| job | status | value (hidden_score) |" in out.stdout
    assert "hidden_score" in (folder / "0" / "eval.log").read_text()   # the command's log holds what it printed
    assert list(df["tags.returned"])[::2] == ["eval/hidden_score"] * 2
    assert [df["metrics.eval/hidden_score"][i] for i in (0, 2)] == pytest.approx([rows[0]["value"], rows[2]["value"]])
    if launcher == "basic":
        # Hydra's --experimental-rerun runs a finished job again into a new folder (as rerun=): the old folder and
        # its MLflow run stay byte for byte; replaying the failed job fails again with exit 2 and one line.
        before, run_before = folder_bytes(folder / "0"), mlflow_record(tmp_path, df["run_id"][0])
        again = at("at-eval", "--experimental-rerun", str(folder / "0" / ".hydra" / "config.pickle"), cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert folder_bytes(folder / "0") == before and mlflow_record(tmp_path, df["run_id"][0]) == run_before
        (new,) = [p for p in tmp_path.iterdir() if p.name.endswith("_eval") and p != folder]
        assert json.loads((new / "run.json").read_text())["status"] == "ok"
        failed = at("at-eval", "--experimental-rerun", str(folder / "1" / ".hydra" / "config.pickle"), cwd=tmp_path)
        assert failed.returncode == 2 and "qwen3-1.7b" in failed.stderr and "Traceback" not in failed.stderr
        # Reusing a finished run's run_id (one job of the sweep, or the whole sweep) is refused in one line before
        # Hydra writes anything: the job's folder, its .hydra/ files and its MLflow run stay as they were.
        sweep_bytes = folder_bytes(folder)
        for argv in (["model=tiny-s", f"run_id={folder.name}/0"], ["-m", "model=tiny-s,tiny-m", f"run_id={folder.name}"]):
            taken = at("at-eval", *argv, "inner.eval_size=4", f"runs_dir={tmp_path}", cwd=tmp_path)
            assert taken.returncode == 2 and "holds earlier run" in taken.stderr.replace("an earlier", "earlier"), \
                taken.stderr[-2000:]
            assert "Traceback" not in taken.stderr
            assert folder_bytes(folder) == sweep_bytes and mlflow_record(tmp_path, df["run_id"][0]) == run_before


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file of a folder (relative path -> content)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def mlflow_record(runs_dir: Path, run_id: str) -> tuple:
    """An MLflow run's status, times, params, tags and every metric point."""
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir}/mlflow.db")
    run = client.get_run(run_id)
    history = {k: [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, k)]
               for k in run.data.metrics}
    return run.info.status, run.info.end_time, run.data.params, run.data.tags, history


def test_resume_finds_sweep_runs_and_refuses_another_adapter_shape(tmp_path):
    from agent_trainer.cli import UserError
    from agent_trainer.commands.train import RUN_MARKER, resume_changes, resume_folder

    job = tmp_path / "2026-01-01_00-00-00_train" / "1"
    (job / "checkpoints" / "step_0000").mkdir(parents=True)
    (job / "checkpoints" / "step_0000" / "state.json").write_text('{"step": 1}')
    (job / RUN_MARKER).write_text("{}")
    cfg = compose_config([f"runs_dir={tmp_path}", "experiment=smoke", "resume=true"], "train")
    (job / "config.resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    assert resume_folder(validate(cfg), tmp_path / "new") == job
    with pytest.raises(UserError, match="not an at-train run folder.*resume=.*/1"):
        resume_folder(validate(compose_config([f"runs_dir={tmp_path}", f"resume={job.parent}"], "train")), tmp_path / "new")
    more_steps = compose_config([f"runs_dir={tmp_path}", "experiment=smoke", "outer.steps=5"], "train")
    assert resume_changes(more_steps, job)["outer.steps"] == ("2", "5")
    other_rank = compose_config([f"runs_dir={tmp_path}", "experiment=smoke", "outer.lora_r=4"], "train")
    with pytest.raises(UserError, match=r"outer.lora_r 16 -> 4"):
        resume_changes(other_rank, job)


def test_a_typo_in_any_value_of_a_sweep_is_one_line_before_any_job(tmp_path):
    out = at("at-eval", "-m", "model=tiny-s,tiny-z", f"runs_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "tiny-z" in out.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_inner_jobs_under_the_joblib_launcher_train_as_under_basic(tmp_path, built_models):
    """Under Hydra's joblib launcher each sweep job runs in a loky worker process, whose multiprocessing default
    is loky's own context; the job processes the harness forks must still start (they died at start-up with
    "cannot find context for 'loky'") and train what the basic launcher trains, to the same score."""
    import shutil

    import yaml

    job = tmp_path / "job"
    shutil.copytree(ROOT / "examples" / "jobs" / "sft_full", job)
    spec = yaml.safe_load((job / "job.yaml").read_text())
    spec["hyperparameters"]["max_steps"] = 20
    (job / "job.yaml").write_text(yaml.safe_dump(spec))
    common = [str(job), "task=calc_chain_v1_tiny", "inner.cache=false", "inner.eval_size=32", "tracking=off"]
    basic = at("at-job", *common, "run_id=basic", f"runs_dir={tmp_path}", cwd=tmp_path)
    assert basic.returncode == 0, basic.stderr[-3000:]
    value = json.loads((tmp_path / "basic" / "run.json").read_text())["value"]
    out = at("at-job", "-m", "hydra/launcher=joblib", *common, "seed=0,1", f"runs_dir={tmp_path / 'joblib'}",
             cwd=tmp_path)
    assert out.returncode == 0 and "2 ok, 0 failed" in out.stdout, out.stderr[-3000:]
    assert "cannot find context" not in out.stderr
    folder = only_sweep(tmp_path / "joblib")
    results = [json.loads(next((folder / str(n)).rglob("result.json")).read_text()) for n in (0, 1)]
    assert [r["status"] for r in results] == ["ok", "ok"], [r.get("detail") for r in results]
    values = [json.loads((folder / str(n) / "run.json").read_text())["value"] for n in (0, 1)]
    assert value is not None and values == [value, value]
