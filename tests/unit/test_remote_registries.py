"""A job run by Ray or SLURM on another node finds the user's data families and base models: the harness passes
its configured registry entries with each request instead of relying on the worker's environment."""

from __future__ import annotations

import os

from agent_trainer.inner_loop.run import job, launchers
from agent_trainer.registry import BASE_MODELS_ENV, INCLUDE_PATH_ENV, REGISTRY_ENV, configured_env


def test_a_remote_worker_runs_the_job_with_the_harness_registries(monkeypatch):
    monkeypatch.setenv(INCLUDE_PATH_ENV, "/data/families")
    monkeypatch.delenv(BASE_MODELS_ENV, raising=False)
    sent = configured_env()
    assert sent == {INCLUDE_PATH_ENV: "/data/families"}

    # the worker's own environment: no include path, and a base model of some other run
    monkeypatch.delenv(INCLUDE_PATH_ENV)
    monkeypatch.setenv(BASE_MODELS_ENV, '{"other-model": {"path": "/elsewhere"}}')
    monkeypatch.setattr(job, "run_request", lambda request: {k: os.environ.get(k) for k in REGISTRY_ENV})
    assert launchers.run_request("a request", sent) == {INCLUDE_PATH_ENV: "/data/families", BASE_MODELS_ENV: None}
