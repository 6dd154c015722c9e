"""The one interface every agent backend implements, and how a backend reads tool calls from text.

    >>> from agent_trainer.outer_loop.agents import make_backend
    >>> backend = make_backend({"kind": "local", "model_path": "/path/to/agent-model"})
    >>> gen = backend.generate(messages, tools, temperature=1.0, max_new_tokens=256, seed=0)
    >>> gen.tool_calls          # [{"id": "call_...", "name": "read_file", "arguments": {"path": "GUIDE.md"}}]
    >>> messages.append(gen.as_message())

Messages and tools use the OpenAI chat format (roles system, user, assistant, tool; assistant ``tool_calls``;
function schemas). Text-sampling backends read calls with a format of ``agent_trainer.outer_loop.agents.toolcalls``.
"""

from __future__ import annotations

import json
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from agent_trainer.config import AgentConfig
from agent_trainer.outer_loop.agents.toolcalls import AUTO, TOOL_CALL_FORMATS, ParsedCalls, resolve_format


class BackendError(RuntimeError):
    """A backend that cannot be built or cannot answer; the message says what to change."""


@dataclass
class Generation:
    """One sampled assistant turn.

    ``token_ids`` and ``logprobs`` are those of the sampled completion tokens, the log-probs under
    the sampling distribution actually used (logits / temperature); ``None`` where a backend cannot
    give them (e.g. an HTTP server that does not return log-probs).
    """

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # Token ids of the rendered prompt (context) the completion was sampled from; local and vllm backends
    # (what the RL update needs).
    prompt_ids: list[int] | None = None
    finish_reason: str = "stop"
    raw: Any = None
    # Why each malformed call in the turn was no call (``toolcalls.ParsedCalls.errors``); the episode does not
    # show them to the agent (its text keeps what it wrote).
    tool_call_errors: list[str] = field(default_factory=list)

    def as_message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation (OpenAI format, arguments as JSON)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
                }
                for c in self.tool_calls
            ]
        return msg


@dataclass
class SampleRequest:
    """One turn to sample: ``AgentBackend.generate``'s arguments (``generate_batch`` takes a list of them)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    temperature: float = AgentConfig.temperature
    max_new_tokens: int = AgentConfig.max_new_tokens
    seed: int | None = None


class AgentBackend(ABC):
    """Something that turns a conversation and tool schemas into one sampled assistant turn."""

    #: Name written to the cost ledger (the price table is keyed by it).
    model_name: str = "unknown"
    #: How tool calls are written in sampled text: a ``TOOL_CALL_FORMATS`` name, or ``auto`` (from the
    #: tokenizer's chat template, if the backend has a ``tokenizer``; else ``hermes``).
    tool_format: str = AUTO
    #: Turns ``generate_batch`` asks for at once (1: one after the other).
    concurrent_requests: int = 1

    @abstractmethod
    def generate(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        temperature: float = AgentConfig.temperature,
        max_new_tokens: int = AgentConfig.max_new_tokens,
        seed: int | None = None,
    ) -> Generation:
        """Sample one assistant turn; ``temperature`` 0 means greedy."""

    def generate_batch(self, requests: list[SampleRequest]) -> list[Generation | BackendError]:
        """One turn for each request, in order; a request the backend cannot answer gets its ``BackendError``
        in its place. The default calls ``generate`` for each, ``concurrent_requests`` at a time (a server
        batches concurrent requests: the served sampler sends a step's turns together); the local backend
        samples them in one padded batch."""
        def one(r: SampleRequest) -> Generation | BackendError:
            try:
                return self.generate(r.messages, r.tools, temperature=r.temperature,
                                     max_new_tokens=r.max_new_tokens, seed=r.seed)
            except BackendError as e:
                return e

        if self.concurrent_requests <= 1 or len(requests) <= 1:
            return [one(r) for r in requests]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(self.concurrent_requests, len(requests)),
                                thread_name_prefix="agent-turns") as pool:
            return list(pool.map(one, requests))

    def close(self) -> None:
        """Release resources (engines, HTTP clients); the default has none."""

    def set_tool_format(self, name: str | None = AUTO) -> None:
        """Read tool calls as format ``name`` from now on; ``auto`` picks it from the chat template now."""
        tokenizer = getattr(self, "tokenizer", None)
        self.tool_format = resolve_format(name, getattr(tokenizer, "chat_template", None)).name

    def parse_tool_text(self, text: str) -> ParsedCalls:
        """The calls in sampled ``text``, read in this backend's ``tool_format``."""
        tokenizer = getattr(self, "tokenizer", None)
        return resolve_format(self.tool_format, getattr(tokenizer, "chat_template", None)).parse(text)


# --- what a server answers: keys, error bodies, /v1/models -----------------------------------

# Where servers put a model's context length in GET /v1/models (vLLM: max_model_len).
CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")
# Keys some providers echo back in 401 messages, partly masked ("sk-abc***xyz").
_KEYLIKE = re.compile(r"\b(sk|key|api)[-_][A-Za-z0-9*_\-]{4,}", re.IGNORECASE)


def key_unset_message(api_key_env: str, base_url: str | None) -> str:
    """What to do when the key variable is unset; the advice is one the config accepts."""
    no_key = (f", or agent.api_key_env=null if {base_url} needs no key" if base_url else
              " (the OpenAI API needs one)")
    return f"environment variable {api_key_env} is empty or unset; export the API key in it{no_key}"


def read_api_key(api_key_env: str | None, base_url: str | None, error: type[Exception] = BackendError) -> str:
    """The key in the variable ``api_key_env`` names (``""`` when none is named); ``error`` with
    ``key_unset_message`` when it names one that is empty or unset."""
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    if api_key_env and not key:
        raise error(key_unset_message(api_key_env, base_url))
    return key


def redact_keys(text: str, secret: str = "") -> str:
    """``text`` with the key ``secret`` and anything key-like (``sk-...``, ``key_...``, masked or not) as ``***``:
    what a server's answer may echo of the key, before it is quoted in an error or a log."""
    if secret:
        text = text.replace(secret, "***")
    return _KEYLIKE.sub("***", text)


def quote_body(body: bytes | str, chars: int, redact=None) -> str:
    """The first ``chars`` characters of a server's body on one line, for an error message (``redact``: a
    function applied to them); ``(empty body)`` when it holds only whitespace."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    head = " ".join(text[:chars].split())
    if redact is not None:
        head = redact(head)
    return repr(head + ("..." if len(text) > chars else "")) if text.strip() else "(empty body)"


def error_text(body: bytes | str, chars: int, redact=None) -> str:
    """The message of a server's error body on one line (``redact`` applied): its JSON ``error.message`` or
    ``detail`` (or a JSON string) up to ``2 * chars`` characters, else ``quote_body(body, chars, redact)``."""
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        message = (err.get("message") or err.get("detail")) if isinstance(err, dict) else err
        if isinstance(message, str) and message.strip():
            return " ".join((redact(message) if redact is not None else message).split())[:chars * 2]
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        pass
    return quote_body(body, chars, redact)


def model_cards(data: Any) -> list[dict[str, Any]]:
    """The model entries of a ``GET /v1/models`` answer (``{"data": [{"id": ..., ...}, ...]}``, parsed): those
    that are JSON objects; none when the answer has another shape."""
    models = data.get("data") if isinstance(data, dict) else None
    return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []


def card_context(card: dict[str, Any]) -> int | None:
    """The context length a ``/v1/models`` entry gives (the first of ``CONTEXT_KEYS`` that is a positive int)."""
    for key in CONTEXT_KEYS:
        if isinstance(card.get(key), int) and card[key] > 0:
            return int(card[key])
    return None


# --- tool calls in text -------------------------------------------------------------------

def parse_tool_calls(text: str, tool_format: str = "hermes") -> tuple[str, list[dict[str, Any]]]:
    """Split assistant text into (content, tool calls), read as ``tool_format`` (``hermes`` by default).

    With ``hermes``, a block ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (or a list of such
    calls; the closing tag may be missing at the very end, when generation stopped on it) becomes calls and
    is removed from the content. A block that is not a JSON object with a string ``name`` and an object
    ``arguments`` (a JSON string holding an object is accepted too) is no call: it stays in the content, so
    the agent sees what it wrote and the tool layer can say nothing was called. The other formats and
    their rules: ``agent_trainer.outer_loop.agents.toolcalls``.
    """
    content, calls, _ = TOOL_CALL_FORMATS[tool_format].parse(text)
    return content, calls
