"""How a command ends when it is stopped: SIGTERM (``kill``, a scheduler's cancel) as Ctrl-C, whoever catches it."""

from __future__ import annotations

import pytest

from agent_trainer import cli
from agent_trainer.config import compose_config


def test_a_sigterm_that_lightning_caught_during_a_fit_ends_the_command_as_a_kill(tmp_path, capsys):
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    cfg = compose_config([f"runs_dir={tmp_path}", "tracking=off"], "train")

    def run(_cfg):
        raise SIGTERMException(1)  # what Lightning's signal connector raises when SIGTERM lands in an update

    with pytest.raises(SystemExit) as ended:
        cli.call(run, cfg)
    assert ended.value.code == 143 and "terminated (SIGTERM)" in capsys.readouterr().err


def test_a_sigterm_that_lightning_turned_into_exit_1_ends_the_command_as_a_kill(tmp_path, capsys):
    import os
    import signal
    import sys

    cfg = compose_config([f"runs_dir={tmp_path}", "tracking=off"], "train")

    def run(_cfg):
        try:  # what Lightning's fit does: our handler's interrupt caught, the fit torn down, exit 1
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            sys.exit(1)

    with pytest.raises(SystemExit) as ended:
        cli.call(run, cfg)
    assert ended.value.code == 143 and "terminated (SIGTERM)" in capsys.readouterr().err


def test_other_exits_pass_through(tmp_path):
    cfg = compose_config([f"runs_dir={tmp_path}", "tracking=off"], "train")

    def run(_cfg):
        raise SystemExit(3)

    with pytest.raises(SystemExit) as ended:
        cli.call(run, cfg)
    assert ended.value.code == 3


def test_a_stopped_run_says_how_to_continue_it(tmp_path):
    """A run stopped by SIGTERM is over (run.json: killed), so its run_id is refused before Hydra writes anything;
    the one line says how to continue it, and typing run_id= and resume= for the same folder is named as the
    mistake it is (resume= alone continues that folder)."""
    from agent_trainer import sweeps

    run = tmp_path / "0"
    run.mkdir()
    sweeps.write_run_file(run, status="killed", command="at-train", steps_completed=1)
    again = compose_config([f"runs_dir={tmp_path}", "run_id=0", "experiment=smoke", "tracking=off"], "train")
    with pytest.raises(cli.FolderTaken, match=f"continue it: at-train resume={run}"):
        cli.refuse_taken(again)
    both = compose_config([f"runs_dir={tmp_path}", "run_id=0", f"resume={run}", "tracking=off"], "train")
    with pytest.raises(cli.FolderTaken, match="leave run_id= out"):
        cli.refuse_taken(both)
    cli.refuse_taken(compose_config([f"runs_dir={tmp_path}", f"resume={run}", "tracking=off"], "train"))
    sweeps.write_run_file(run, command="at-eval")
    with pytest.raises(cli.FolderTaken) as taken:
        cli.refuse_taken(compose_config([f"runs_dir={tmp_path}", "run_id=0", "tracking=off"], "eval"))
    assert str(taken.value).endswith("give a new run_id=") and "resume" not in str(taken.value)


def test_a_resume_compares_the_machine_with_the_runs_first_one(tmp_path):
    """What a resume runs on is compared with the run's versions.json: a package upgrade and another CPU vendor
    are reported with both values; the same machine reports nothing; a run saved before the CPU was recorded
    compares its packages only."""
    import json

    from agent_trainer.commands.train import machine_changes
    from agent_trainer.kernels import cpu_kind

    now = {**cli.package_versions(), "cpu": cpu_kind()}
    (tmp_path / "versions.json").write_text(json.dumps(now))
    assert machine_changes(tmp_path) == {}
    (tmp_path / "versions.json").write_text(json.dumps({**now, "torch": "0.1", "cpu": {**now["cpu"],
                                                                                       "vendor": "other"}}))
    assert machine_changes(tmp_path) == {"torch": ("0.1", now["torch"]), "cpu.vendor": ("other", now["cpu"]["vendor"])}
    (tmp_path / "versions.json").write_text(json.dumps({k: v for k, v in now.items() if k != "cpu"}))
    assert machine_changes(tmp_path) == {}
    (tmp_path / "versions.json").write_text(json.dumps({**now, "cpu": {**now["cpu"], "MKL_CBWR": "COMPATIBLE"}}))
    assert machine_changes(tmp_path) == {"cpu.MKL_CBWR": ("COMPATIBLE", None)}, "a kernel setting dropped"
    (tmp_path / "versions.json").unlink()
    assert machine_changes(tmp_path) == {}
