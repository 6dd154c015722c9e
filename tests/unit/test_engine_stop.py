"""submitit's stop before a SLURM time limit reaches the top of the task whatever the job was doing: its handler's
error comes as ``EngineStop`` (a ``BaseException``), which no ``except Exception`` of a job's stage takes for the
job's own error (validation did, and blamed the job for the cluster's limit: an ``invalid`` result).

    .venv/bin/pytest tests/unit/test_engine_stop.py -q      (~1 s)
"""

from __future__ import annotations

import os
import signal
import time

import pytest

submitit = pytest.importorskip("submitit")

from submitit.core import job_environment, utils  # noqa: E402

from agent_trainer.inner_loop.run import launchers  # noqa: E402


class _Rank0:
    global_rank = 0   # the task that checkpoints or stops (submitit asks its JobEnvironment)


@pytest.fixture
def submitit_handler():
    """submitit's own handler of its time-limit signal, installed as in a task (``process_job``)."""
    sig = job_environment.JobEnvironment._usr_sig()
    before, term = signal.getsignal(sig), signal.getsignal(signal.SIGTERM)
    delayed = utils.DelayedSubmission(print)   # a function without a checkpoint method, as our tasks are
    delayed._timeout_min, delayed._timeout_countdown = 1, 3   # submitit's defaults for a SLURM task
    handler = job_environment.SignalHandler(_Rank0(), None, delayed)
    signal.signal(sig, handler.checkpoint_and_try_requeue)
    yield sig
    signal.signal(sig, before)
    signal.signal(signal.SIGTERM, term)


def _a_stage_that_catches_everything(sig) -> str:
    try:
        os.kill(os.getpid(), sig)
        time.sleep(5)
    except Exception as e:  # noqa: BLE001 - what validation does with a harness error
        return f"taken for the job's error: {e}"
    return "the signal never came"


def test_the_time_limit_signal_passes_a_stages_except_exception(submitit_handler):
    # submitit's handler alone: the stage takes its error for its own (the bug).
    assert _a_stage_that_catches_everything(submitit_handler).startswith("taken for the job's error")
    launchers._engine_stops_as_base_exception()
    with pytest.raises(launchers.EngineStop) as stop:
        _a_stage_that_catches_everything(submitit_handler)
    # what run_request hands back to submitit (written to the task's result, read by the harness)
    assert isinstance(stop.value.__cause__, utils.UncompletedJobError)
    assert launchers.TIMED_OUT in str(stop.value.__cause__)


def test_slurms_sigterm_ends_the_task_as_an_engine_stop(submitit_handler):
    """The task cancelled: its job's training process dies of the same SIGTERM; the task must not go on to
    report that as the job's own crash (the harness gives the job SLURM's state)."""
    launchers._engine_stops_as_base_exception()
    with pytest.raises(launchers.EngineStop, match="SIGTERM from SLURM"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)


def test_outside_a_submitit_task_nothing_is_wrapped():
    sig = job_environment.JobEnvironment._usr_sig()
    before = signal.getsignal(sig)
    launchers._engine_stops_as_base_exception()
    assert signal.getsignal(sig) is before
