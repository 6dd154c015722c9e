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
from agent_trainer.commands.train import RUN_MARKER, resume_changes, resume_folder, steps_completed
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
    from agent_trainer.outer_loop.rl.policy import AgentPolicy, PolicyConfig
    from agent_trainer.outer_loop.rl.checkpoints import CKPT_DIR, StepState, last_complete_step, save_step

    policy = AgentPolicy.from_pretrained(built_agent, PolicyConfig(), seed=0)
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
