"""Shared fixtures. ``built_models`` builds tiny-s and tiny-m into the shared cache once per session.

The cache is ``$AGENT_TRAINER_CACHE`` (default ``~/.cache/agent-trainer``); a warm cache makes the
fixture free, a cold one costs the ~2-minute build once for the whole test session.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built_models() -> dict:
    """name -> folder of every registered built model (tiny-s, tiny-m, and later builders)."""
    from inner_loop.models import build_all

    return build_all(seed=0, progress=False)


@pytest.fixture(scope="session")
def built_agent(built_models) -> "Path":
    """Folder of the tiny agent (built once into the shared cache, after the inner models)."""
    from inner_loop.models import resolve_model
    from outer_loop.agent_model import register

    register()
    return resolve_model("tiny-agent", progress=False)
