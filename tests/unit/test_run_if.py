"""``RunIf`` (tests/helpers/run_if.py): a missing need is a skip reason, ``--no-model-builds`` decides for models."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import run_if
from helpers.run_if import NO_BUILDS, RunIf, missing


def session(no_builds: bool):
    return SimpleNamespace(getoption=lambda name: no_builds if name == NO_BUILDS else None)


def test_missing_models_are_built_by_default_and_skipped_without_builds(monkeypatch):
    monkeypatch.setattr(run_if, "models_built", lambda: False)
    assert missing(session(no_builds=False), {"models": True}) is None
    reason = missing(session(no_builds=True), {"models": True})
    assert "at-models" in reason and NO_BUILDS in reason
    assert missing(session(no_builds=True), {}) is None
    monkeypatch.setattr(run_if, "models_built", lambda: True)
    assert missing(session(no_builds=True), {"models": True}) is None


def test_the_marker_carries_only_the_needs_asked():
    mark = RunIf(models=True, gpu=True).mark
    assert (mark.name, mark.kwargs) == ("run_if", {"models": True, "gpu": True})
