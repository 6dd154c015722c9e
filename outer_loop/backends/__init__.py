"""Agent backends behind one interface, built from a config dict.

    >>> from outer_loop.backends import make_backend
    >>> make_backend({"kind": "local", "model_path": "~/.cache/agent-trainer/models/agent-tiny"})
    >>> make_backend({"kind": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "agent",
    ...               "api_key_env": "AGENT_API_KEY"})
    >>> make_backend({"kind": "vllm", "model_path": "/models/agent"})          # GPU hosts only

``kind`` picks the backend; every other key is a keyword of that backend's constructor
(``LocalBackend.from_path``, ``OpenAIBackend``, ``VLLMBackend``). For ``local``, ``model`` may
name a project model instead of ``model_path`` (resolved by ``inner_loop.models.resolve_model``).
"""

from __future__ import annotations

import inspect
from typing import Any

from outer_loop.backends.base import AgentBackend, BackendError, Generation, parse_tool_calls

KINDS = ("local", "openai", "vllm")


# Keys of the agent config that belong to the episode runner or the ledger, not to a backend.
EPISODE_KEYS = frozenset({"temperature", "max_new_tokens", "max_turns", "usd_per_1m_tokens_in",
                          "usd_per_1m_tokens_out", "seed"})


def make_backend(cfg: dict[str, Any]) -> AgentBackend:
    """Build the backend named by ``cfg["kind"]`` (or ``cfg["backend"]``, the agent config's key).

    Episode keys (temperature, max_new_tokens, max_turns, prices) are ignored here; any other key
    must be a parameter of the backend, or the error lists the ones it takes.
    """
    cfg = {k: v for k, v in dict(cfg).items() if k not in EPISODE_KEYS}
    kind = cfg.pop("kind", None) or cfg.pop("backend", None)
    cfg.pop("backend", None)
    kind = getattr(kind, "value", kind)  # an Enum from a structured config
    if kind == "local":
        from outer_loop.backends.local import LocalBackend

        cfg.pop("base_url", None)
        cfg.pop("api_key_env", None)
        name = cfg.pop("model", None)
        if not cfg.get("model_path"):
            if not name:
                raise BackendError("agent backend 'local' needs model (a project model name) or model_path")
            from inner_loop.models import resolve_model

            cfg["model_path"] = str(resolve_model(name))
        cfg.setdefault("model_name", name)
        target = LocalBackend.from_path
    elif kind == "openai":
        from outer_loop.backends.openai_backend import OpenAIBackend

        cfg.pop("model_path", None)
        target = OpenAIBackend
    elif kind == "vllm":
        from outer_loop.backends.vllm_backend import VLLMBackend

        cfg.pop("base_url", None)
        cfg.pop("api_key_env", None)
        name = cfg.pop("model", None)
        if not cfg.get("model_path"):
            raise BackendError("agent backend 'vllm' needs model_path: a local folder with the weights "
                               "(no model hub is reached)")
        cfg.setdefault("model_name", name)
        target = VLLMBackend
    else:
        raise BackendError(f"unknown agent backend {kind!r}; set backend (or kind) to one of: {', '.join(KINDS)}")
    _check_keys(kind, target, cfg)
    return target(**cfg)


def _check_keys(kind: str, target, cfg: dict[str, Any]) -> None:
    params = inspect.signature(target).parameters
    known = [n for n, p in params.items()
             if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) and n != "self"]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(cfg) - set(known))
        if unknown:
            raise BackendError(f"agent backend {kind!r} does not take {', '.join(unknown)}; "
                               f"it takes: {', '.join(known)}")
    missing = [n for n in known if params[n].default is inspect.Parameter.empty and cfg.get(n) is None]
    if missing:
        raise BackendError(f"agent backend {kind!r} needs {', '.join(missing)} in its config")


__all__ = ["AgentBackend", "BackendError", "EPISODE_KEYS", "Generation", "KINDS", "make_backend",
           "parse_tool_calls"]
