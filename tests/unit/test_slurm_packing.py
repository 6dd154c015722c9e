"""A SLURM batch is max_parallel array tasks that each run their share of the jobs one after another (a task's
imports paid once, not once per job): the shares keep request order, the time limit covers the fullest task,
and ``jobs_per_task=1`` gives the one-task-per-job array back.

    .venv/bin/pytest tests/unit/test_slurm_packing.py -q      (~1 s)
"""

from __future__ import annotations

import pytest

pytest.importorskip("submitit")

from agent_trainer.inner_loop.run.launchers import SubmititExecutor, packed  # noqa: E402


def test_jobs_are_shared_evenly_in_request_order():
    assert packed(list(range(8)), 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert packed(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert packed(list(range(2)), 8) == [[0], [1]]   # never an empty task


def test_the_array_has_a_task_per_slot_and_a_limit_for_its_fullest_task(tmp_path):
    ex = SubmititExecutor("slurm", max_parallel=2, folder=tmp_path, time_limit_min=10)
    batch = list(range(5))   # the grouping and a set time limit need nothing of a request
    assert [len(g) for g in ex.groups(batch)] == [3, 2]
    assert ex.timeout_min(batch) == 30   # three jobs one after another, 10 minutes each
    sbatch = ex.sbatch(batch)
    assert "#SBATCH --array=0-1%2" in sbatch and "#SBATCH --time=30" in sbatch
    one_each = SubmititExecutor("slurm", max_parallel=2, folder=tmp_path, time_limit_min=10, jobs_per_task=1)
    assert [len(g) for g in one_each.groups(batch)] == [1] * 5 and one_each.timeout_min(batch) == 10
    assert "#SBATCH --array=0-4%2" in one_each.sbatch(batch)
