"""A harness interrupted while its threads wait on jobs (at-train's SIGTERM during a local_parallel batch) stops at
once: the running training processes are killed, the queued jobs never start, and the pool's exit does not wait
for the jobs to end (it did: ~70 s on a loaded box). The next batch in the same process runs as usual.

    .venv/bin/pytest tests/unit/test_jobs_stop.py -q      (~2 s)
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent_trainer.inner_loop.run import worker


def _wait_on_a_process(started: list) -> str:
    """What a job thread does: start a training process (here one that would run for a minute), watch it."""
    if worker._STOPPING.is_set():
        raise worker.JobsStopped("not started")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)   # its own group, as a training process
    started.append(proc)
    worker.watch(proc, deadline_s=120)
    return "ended"


def test_an_interrupt_kills_the_running_jobs_and_starts_no_queued_one():
    started: list = []
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with ThreadPoolExecutor(max_workers=2) as pool, worker.stop_jobs_on_error(pool):
            futures = [pool.submit(_wait_on_a_process, started) for _ in range(5)]
            while len(started) < 2:
                time.sleep(0.05)
            raise KeyboardInterrupt   # what at-train's SIGTERM handler raises in the waiting thread
    assert time.monotonic() - t0 < 10, "the pool waited for its jobs"
    assert len(started) == 2 and all(p.poll() is not None for p in started), "a training process outlived the stop"
    assert all(isinstance(f.exception(), worker.JobsStopped) for f in futures[:2])
    assert all(f.cancelled() for f in futures[2:]), "a queued job started after the stop"
    # The stop is over: the next batch runs its jobs.
    assert not worker._STOPPING.is_set()
    proc = subprocess.Popen(["true"], start_new_session=True)
    assert worker.watch(proc, deadline_s=30) is False and proc.returncode == 0
