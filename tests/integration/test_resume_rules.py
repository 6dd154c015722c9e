"""What ``at-train resume=`` may continue and with which changes, and a checkpoint written over a leftover one:
the plain functions of ``agent_trainer.commands.train`` on run folders laid out as at-train leaves them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agent_trainer.cli import UserError
from agent_trainer.commands.train import (RUN_MARKER, hold_run, in_training, resume_changes, resume_folder,
                                          steps_completed)
from agent_trainer.config import compose_config, validate


def outer_run(folder: Path, steps: int, cfg=None) -> Path:
    """A run folder as at-train leaves it after ``steps`` complete steps (0: it failed before its first)."""
    folder.mkdir(parents=True)
    (folder / RUN_MARKER).write_text("{}")
    for s in range(steps):
        (folder / "checkpoints" / f"step_{s:04d}").mkdir(parents=True)
        (folder / "checkpoints" / f"step_{s:04d}" / "state.json").write_text(json.dumps({"step": s + 1}))
    if cfg is not None:
        (folder / "config.resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return folder


def test_resume_true_takes_the_newest_run_that_completed_a_step(tmp_path):
    cfg = compose_config([f"runs_dir={tmp_path}", "experiment=smoke", "resume=true"], "train")
    done = outer_run(tmp_path / "a", 2)
    failed = outer_run(tmp_path / "b", 0)   # newer, but it failed before its first step
    os.utime(done / RUN_MARKER, (time.time() - 60,) * 2)
    assert steps_completed(done) == 2 and steps_completed(failed) == 0
    assert resume_folder(validate(cfg), tmp_path / "new") == done
    with pytest.raises(UserError, match="never completed a step"):
        resume_folder(validate(compose_config([f"runs_dir={tmp_path}", f"resume={failed}"], "train")), tmp_path / "new")
    (done / RUN_MARKER).unlink()
    with pytest.raises(UserError, match=r"no at-train run .* completed a step \(1 ended before"):
        resume_folder(validate(cfg), tmp_path / "new")


def test_resume_true_in_a_sweep_continues_each_jobs_own_run(tmp_path):
    """``at-train -m seed=0,1 resume=true``: each job takes the newest run it may continue (its own seed's), not
    the newest run, which a seed of its own would refuse; a job no run matches is told the newest's differences."""
    def cfg(seed, *more):
        return compose_config([f"runs_dir={tmp_path}", "experiment=smoke", f"seed={seed}", "resume=true", *more],
                              "train")

    seed0 = outer_run(tmp_path / "sweep" / "0", 2, cfg(0))
    seed1 = outer_run(tmp_path / "sweep" / "1", 1, cfg(1))
    os.utime(seed0 / RUN_MARKER, (time.time() - 60,) * 2)
    assert resume_folder(validate(cfg(0)), tmp_path / "new", cfg(0)) == seed0
    assert resume_folder(validate(cfg(1)), tmp_path / "new", cfg(1)) == seed1
    assert resume_folder(validate(cfg(0, "outer.steps=6")), tmp_path / "new", cfg(0, "outer.steps=6")) == seed0
    with pytest.raises(UserError, match=r"none of the 2 runs .* the newest: resume=.*/sweep/1: settings differ "
                                        r"from the saved run \(seed 1 -> 2\)"):
        resume_folder(validate(cfg(2)), tmp_path / "new", cfg(2))


def test_a_run_another_process_trains_is_neither_resumed_nor_taken(tmp_path):
    """One at-train process trains a run at a time: while one holds a run (its lock, a real flock), resume=true
    passes it by and a second hold is refused in one line naming the holder; closed, the run is free again."""
    cfg = compose_config([f"runs_dir={tmp_path}", "experiment=smoke", "resume=true"], "train")
    older = outer_run(tmp_path / "older", 1, cfg)
    busy = outer_run(tmp_path / "busy", 2, cfg)
    os.utime(older / RUN_MARKER, (time.time() - 60,) * 2)
    lock = hold_run(busy)
    try:
        assert in_training(busy) and not in_training(older)
        assert resume_folder(validate(cfg), tmp_path / "new", cfg) == older
        held = rf"busy is being trained by another at-train process \(pid {os.getpid()}\)"
        with pytest.raises(UserError, match=held):
            hold_run(busy)
    finally:
        lock.close()
    assert not in_training(busy) and resume_folder(validate(cfg), tmp_path / "new", cfg) == busy
    only = compose_config([f"runs_dir={tmp_path / 'busy'}", "experiment=smoke", "resume=true"], "train")
    with hold_run(busy), pytest.raises(UserError, match=r"\(1 being trained by another process\)"):
        resume_folder(validate(only), tmp_path / "new", only)


def test_a_sweep_job_that_continued_a_run_reports_that_runs_outcome(tmp_path):
    """``at-train -m ... resume=true``: each job's own folder names the run it continued; the sweep's table takes
    status, value and inner jobs from there (not the job folder's "running"), and at-compare reads that run."""
    import json as _json

    from agent_trainer import sweeps
    from agent_trainer.outer_loop.report.compare_runs import resolve

    run = tmp_path / "sw" / "0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(_json.dumps({"step": 0, "reward_mean": 0.25}) + "\n")
    sweeps.write_run_file(run, status="ok", value=0.25, value_name="reward/reward_last3", jobs=6, jobs_crashed=0)
    job = tmp_path / "new" / "0"
    job.mkdir(parents=True)
    sweeps.write_run_file(job, status="running", swept={"seed": "0"}, continued=str(run))
    [row] = sweeps.sweep_rows(tmp_path / "new")
    assert (row["status"], row["value"], row["jobs"]) == ("ok", 0.25, 6)
    assert row["folder"] == f"{job} (continued {run})"
    assert [r.folder for r in resolve([str(tmp_path / "new")], "sqlite:///none.db")] == [run]


def test_a_changed_setting_is_refused_unless_allowed(tmp_path):
    saved = compose_config([f"runs_dir={tmp_path}", "experiment=smoke"], "train")
    job = outer_run(tmp_path / "r", 1, saved)
    other = ["experiment=smoke", f"runs_dir={tmp_path}", "task.train_families=[calc_chain]"]
    with pytest.raises(UserError, match=r"task.train_families .* 'resume_allow_changes=\[task.train_families\]'"):
        resume_changes(compose_config(other, "train"), job)
    allowed = compose_config([*other, "resume_allow_changes=[task.train_families]"], "train")
    assert list(resume_changes(allowed, job)) == ["task.train_families"]
    more = compose_config([f"runs_dir={tmp_path}", "experiment=smoke", "outer.steps=4"], "train")
    assert resume_changes(more, job) == {"outer.steps": ("2", "4")}   # more steps: always allowed


def test_a_run_saved_by_an_older_version_resumes_with_its_newer_settings_reported(tmp_path):
    saved = OmegaConf.create(OmegaConf.to_container(compose_config([f"runs_dir={tmp_path}", "experiment=smoke"],
                                                                   "train"), resolve=True))
    del saved.task["hidden_salt"]            # a setting the saved run predates
    saved.outer["retired_setting"] = 3       # one this version no longer has
    job = outer_run(tmp_path / "r", 1, saved)
    now = compose_config([f"runs_dir={tmp_path}", "experiment=smoke"], "train")
    assert resume_changes(now, job) == {"task.hidden_salt": ("(not saved)", "public"),
                                        "outer.retired_setting": ("3", "(no such setting)")}
    with pytest.raises(UserError, match="task.train_families"):  # a setting the run did save still counts
        resume_changes(compose_config([f"runs_dir={tmp_path}", "experiment=smoke",
                                       "task.train_families=[calc_chain]"], "train"), job)


def test_a_checkpoint_survives_a_leftover_tmp_and_an_earlier_copy_of_its_step(tmp_path, built_agent):
    from helpers.updates import plain_update

    from agent_trainer.outer_loop.rl.policy import AgentPolicy
    from agent_trainer.outer_loop.rl.checkpoints import CKPT_DIR, StepState, last_complete_step, save_step

    policy = AgentPolicy.from_pretrained(built_agent, plain_update(), seed=0)
    (tmp_path / "run.json").write_text("{}")
    leftover = tmp_path / CKPT_DIR / "step_0000.tmp"
    (leftover / "adapter").mkdir(parents=True)
    (leftover / "adapter" / "junk").write_text("half-written")
    (tmp_path / CKPT_DIR / "step_0000" / "old").mkdir(parents=True)   # a step written before (non-empty folder)
    save_step(tmp_path, 0, policy, [], {"reward_mean": 0.5}, StepState())
    ckpt = last_complete_step(tmp_path)
    assert ckpt.name == "step_0000" and not (ckpt / "old").exists() and (ckpt / "adapter").is_dir()
    assert sorted(p.name for p in (tmp_path / CKPT_DIR).iterdir()) == ["step_0000"]
    assert json.loads((ckpt / "state.json").read_text())["step"] == 1
    assert json.loads((tmp_path / "run.json").read_text())["steps_completed"] == 1


@pytest.mark.parametrize("given, read", [("true", "true"), ("yes", "true"), ("1", "true"), ("false", "false"),
                                         ("no", "false"), ("0", "false"), ("runs/x", "runs/x")])
def test_resume_is_read_once_when_the_config_is_composed(tmp_path, given, read):
    assert validate(compose_config([f"runs_dir={tmp_path}", f"resume={given}"], "train")).resume == read


def _made(folder: Path, run_id: str, overrides: list[str]) -> Path:
    """A run folder whose run.json holds the overrides it was made with (as at-train writes it)."""
    from agent_trainer import sweeps

    cfg = compose_config([*overrides, f"run_id={run_id}"], "train")
    outer_run(folder, 1, cfg)
    sweeps.write_run_file(folder, status="killed", command="at-train", overrides=[*overrides, f"run_id={run_id}"])
    return folder


def test_resume_of_a_folder_brings_the_overrides_it_was_made_with(tmp_path, monkeypatch):
    """``at-train resume=<folder>`` continues the run as it was made, from any working folder: its overrides come
    first (the command line's win), its runs_dir as the absolute folder it lies in (a relative runs=, as typed,
    named another folder from elsewhere); resume=true, sweeps and a folder without a record are left as given."""
    from agent_trainer.cli_args import expand_resume

    monkeypatch.chdir(tmp_path)
    run = _made(tmp_path / "runs" / "a", "a", ["experiment=smoke", "outer.lora_r=4", "tracking=off"])
    monkeypatch.chdir(tmp_path / "runs")   # elsewhere: "runs" would now be runs/runs
    got = expand_resume([f"resume={run}", "outer.steps=5"])
    assert got == ["experiment=smoke", "outer.lora_r=4", "tracking=off", f"runs_dir={tmp_path / 'runs'}",
                   f"resume={run}", "outer.steps=5"]
    cfg = validate(compose_config(got, "train"))
    assert resume_folder(cfg, tmp_path / "new") == run
    assert resume_changes(compose_config(got, "train"), run) == {"outer.steps": ("2", "5")}
    job = _made(tmp_path / "sw" / "0", "sw/0", ["experiment=smoke", "seed=0", "tracking=off"])   # a sweep's job
    assert f"runs_dir={tmp_path}" in expand_resume([f"resume={job}"])
    for argv in (["resume=true"], ["-m", f"resume={run}"], [f"resume={tmp_path}"]):
        assert expand_resume(argv) == argv
    with pytest.raises(UserError, match="give one of them"):
        expand_resume([f"resume={run}", f"rerun={run}"])


def test_a_run_saved_under_a_renamed_recipe_resumes_under_its_new_name(tmp_path, monkeypatch, capsys):
    """A run made with ``experiment=smollm2_cpu_v8`` (the recipe's name until 2026-12-07) resumes as
    ``experiment=smollm2_cpu``, the same config; typed, the old name is one line naming the new one."""
    from agent_trainer import sweeps
    from agent_trainer.cli_args import RENAMED_EXPERIMENTS, expand_resume, rewrite_args

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "runs" / "old"
    outer_run(folder, 1, compose_config(["experiment=smollm2_cpu", "seed=1", "run_id=old"], "train"))
    sweeps.write_run_file(folder, status="killed", command="at-train",
                          overrides=["experiment=smollm2_cpu_v8", "seed=1", "run_id=old"])
    got = expand_resume([f"resume={folder}"])
    assert got[:2] == ["experiment=smollm2_cpu", "seed=1"] and "now experiment=smollm2_cpu" in capsys.readouterr().err
    cfg = compose_config(got, "train")
    assert resume_folder(validate(cfg), tmp_path / "new", cfg) == folder
    assert resume_changes(cfg, folder) == {}
    for old, new in RENAMED_EXPERIMENTS.items():
        with pytest.raises(UserError, match=f"experiment={old} is now experiment={new}"):
            rewrite_args([f"experiment={old}", "seed=0"])
    with pytest.raises(UserError, match="smollm2_cpu_v5 was removed.*git checkout"):
        rewrite_args(["-m", "experiment=smoke,smollm2_cpu_v5"])
