"""The one interface every agent backend implements, and the Qwen3 tool-call parser they share.

    >>> from outer_loop.backends import make_backend
    >>> backend = make_backend({"kind": "local", "model_path": "/path/to/agent-model"})
    >>> gen = backend.generate(messages, tools, temperature=1.0, max_new_tokens=256, seed=0)
    >>> gen.tool_calls          # [{"id": "call_...", "name": "read_file", "arguments": {"path": "GUIDE.md"}}]
    >>> messages.append(gen.as_message())

Messages use the OpenAI chat format, the lingua franca of every backend here: ``{"role": "system"
| "user" | "assistant" | "tool", "content": str}``; an assistant turn may carry ``tool_calls``
(``[{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}]``) and a tool
turn carries the ``tool_call_id`` it answers. Tools are OpenAI function schemas
(``{"type": "function", "function": {"name", "description", "parameters"}}``).
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


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


# --- Qwen3-style tool calls ---------------------------------------------------------------

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _call_id(text: str, index: int) -> str:
    # Deterministic ids keep trajectories of the same seed identical; uniqueness within a turn is enough.
    return "call_" + hashlib.sha1(f"{index}\x00{text}".encode()).hexdigest()[:16]


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split Qwen3 assistant text into (content, tool calls).

    A block ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the closing tag may be
    missing at the very end, when generation stopped on it) becomes a call and is removed from the
    content. A block that is not a JSON object with a string ``name`` and an object ``arguments``
    (a JSON string holding an object is accepted too) is no call: it stays in the content, so the
    agent sees what it wrote and the tool layer can say nothing was called.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _TOOL_CALL.finditer(text):
        call = _parse_one(m.group(1))
        if call is None:
            continue
        kept.append(text[pos:m.start()])
        pos = m.end()
        call["id"] = _call_id(text, len(calls))
        calls.append(call)
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text.strip()
    return content, calls


def _parse_one(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError):  # not JSON, a huge number, nesting too deep: no call
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict) or not utf8_clean(obj["name"], args):
        return None
    return {"name": obj["name"], "arguments": args}


def utf8_clean(*values: Any) -> bool:
    """False when a value holds a lone surrogate (JSON ``"\\ud800"``): it cannot be re-encoded as UTF-8,
    so it would break the chat template of the next turn; such a call is treated as no call."""
    try:
        json.dumps(values, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, RecursionError):
        return False
    return True


def tool_name(tool: dict[str, Any]) -> str:
    """The function name of an OpenAI tool schema (either the wrapped or the bare form)."""
    return (tool.get("function") or tool).get("name", "")
