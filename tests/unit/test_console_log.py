"""A command's log file (``train.log``) holds what it printed and the traceback of an error that ended it."""

from __future__ import annotations

import logging

import pytest
from hydra.core.hydra_config import HydraConfig

from agent_trainer.console_log import console_log


@pytest.fixture
def log_file(tmp_path, monkeypatch):
    """A Hydra job's log handler on the root logger (as Hydra's job logging sets one up)."""
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    path = tmp_path / "train.log"
    handler = logging.FileHandler(path)
    logging.getLogger().addHandler(handler)
    yield path
    logging.getLogger().removeHandler(handler)
    handler.close()


def test_what_a_command_prints_goes_into_its_log(log_file, capsys):
    with console_log():
        print("steps 12")
        print("outer steps: 50%\router steps: 100%", end="")
    assert log_file.read_text() == "steps 12\nouter steps: 100%\n"   # a progress bar's last state only
    assert "steps 12" in capsys.readouterr().out                    # and the console still has it


def test_an_error_that_ends_a_command_leaves_its_traceback_in_the_log(log_file):
    with pytest.raises(RuntimeError):
        with console_log():
            print("step 0 done")
            raise RuntimeError("the disk is full")
    text = log_file.read_text()
    assert text.startswith("step 0 done\n") and "Traceback (most recent call last)" in text
    assert text.rstrip().endswith("RuntimeError: the disk is full")


def test_an_exit_or_an_interrupt_adds_no_traceback(log_file):
    for error in (SystemExit(2), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with console_log():
                raise error
    assert "Traceback" not in log_file.read_text()
