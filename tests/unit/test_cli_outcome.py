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
