"""The one interface every agent backend implements, and how a backend reads tool calls from text.

    >>> from outer_loop.backends import make_backend
    >>> backend = make_backend({"kind": "local", "model_path": "/path/to/agent-model"})
    >>> gen = backend.generate(messages, tools, temperature=1.0, max_new_tokens=256, seed=0)
    >>> gen.tool_calls          # [{"id": "call_...", "name": "read_file", "arguments": {"path": "GUIDE.md"}}]
    >>> messages.append(gen.as_message())

Messages and tools use the OpenAI chat format (roles system, user, assistant, tool; assistant ``tool_calls``;
function schemas). Text-sampling backends read calls with a format of ``outer_loop.backends.toolcalls``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from outer_loop.backends.toolcalls import AUTO, TOOL_CALL_FORMATS, ParsedCalls, resolve_format


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


class AgentBackend(ABC):
    """Something that turns a conversation and tool schemas into one sampled assistant turn."""

    #: Name written to the cost ledger (the price table is keyed by it).
    model_name: str = "unknown"
    #: How tool calls are written in sampled text: a ``TOOL_CALL_FORMATS`` name, or ``auto`` (from the
    #: tokenizer's chat template, if the backend has a ``tokenizer``; else ``hermes``).
    tool_format: str = AUTO

    @abstractmethod
    def generate(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 512,
        seed: int | None = None,
    ) -> Generation:
        """Sample one assistant turn; ``temperature`` 0 means greedy."""

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


# --- tool calls in text -------------------------------------------------------------------

def quote_body(body: bytes | str, chars: int, redact=None) -> str:
    """The first ``chars`` characters of a server's body on one line, for an error message (``redact``: a
    function applied to them); ``(empty body)`` when it holds only whitespace."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    head = " ".join(text[:chars].split())
    if redact is not None:
        head = redact(head)
    return repr(head + ("..." if len(text) > chars else "")) if text.strip() else "(empty body)"


def parse_tool_calls(text: str, tool_format: str = "hermes") -> tuple[str, list[dict[str, Any]]]:
    """Split assistant text into (content, tool calls), read as ``tool_format`` (``hermes`` by default).

    With ``hermes``, a block ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (or a list of such
    calls; the closing tag may be missing at the very end, when generation stopped on it) becomes calls and
    is removed from the content. A block that is not a JSON object with a string ``name`` and an object
    ``arguments`` (a JSON string holding an object is accepted too) is no call: it stays in the content, so
    the agent sees what it wrote and the tool layer can say nothing was called. The other formats and
    their rules: ``outer_loop.backends.toolcalls``.
    """
    content, calls, _ = TOOL_CALL_FORMATS[tool_format].parse(text)
    return content, calls


def tool_name(tool: dict[str, Any]) -> str:
    """The function name of an OpenAI tool schema (either the wrapped or the bare form)."""
    return (tool.get("function") or tool).get("name", "")
