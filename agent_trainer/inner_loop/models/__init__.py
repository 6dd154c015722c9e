"""Base models for inner jobs: the project's tokenizer, tiny Qwen3 models built locally, real Qwen3 from disk.

    >>> from agent_trainer.inner_loop.models import resolve_model, build_all, load_model, load_tokenizer, model_hash
    >>> paths = build_all(seed=0)            # tiny-s and tiny-m into the cache (about 2 minutes once)
    >>> model = load_model(resolve_model("tiny-s"))

Nothing here touches the model hub: every load is ``from_pretrained(<local folder>)``.
"""

from agent_trainer.inner_loop.models.build import BUILD_VERSION, TINY_M, TINY_S, ModelBuildConfig, build_model
from agent_trainer.inner_loop.models.registry import (
    BASE_MODELS,
    BUILDERS,
    ModelError,
    ModelNotFoundError,
    build_all,
    load_model,
    load_tokenizer,
    model_dir,
    model_hash,
    register_builder,
    resolve_model,
)
from agent_trainer.inner_loop.models.tokenizer import (
    CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, build_tokenizer,
)

__all__ = [
    "BASE_MODELS", "BUILDERS", "BUILD_VERSION", "CHAT_TEMPLATE", "EOS_TOKEN", "PAD_TOKEN", "SPECIAL_TOKENS",
    "TINY_M", "TINY_S", "ModelBuildConfig", "ModelError", "ModelNotFoundError", "build_all", "build_model",
    "build_tokenizer", "load_model", "load_tokenizer", "model_dir", "model_hash", "register_builder", "resolve_model",
]
