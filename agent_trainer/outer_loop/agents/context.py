"""Fitting a conversation into a served model's context: an approximate token count and the trimming.

    >>> from agent_trainer.outer_loop.agents.context import fit_conversation
    >>> fit = fit_conversation(messages, tools, prompt_budget=3000, chars_per_token=3.5)
    >>> fit.messages        # what goes on the wire (``messages`` itself is never changed)
    >>> fit.trimmed         # {"before": ~tokens, "after": ~tokens, "shortened": 2, "dropped": 1} or None

Tokens are estimated as characters / ``chars_per_token``. Trimming shortens the oldest tool results first, then
drops the oldest whole turns; the system prompt and the task message are always kept.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 3.5
PER_MESSAGE_TOKENS = 6          # role markers and separators of a chat template
KEEP_CHARS = 240                # what a shortened tool result keeps of its start
DROPPED_NOTE = "\n\n[Earlier turns of this conversation were removed to fit the server's context.]"


def message_chars(m: dict[str, Any]) -> int:
    """Characters of one message as a chat template renders it (content and tool calls)."""
    n = len(m.get("content") or "")
    if m.get("tool_calls"):
        n += len(json.dumps(m["tool_calls"], ensure_ascii=False))
    return n


def tools_chars(tools: list[dict[str, Any]] | None) -> int:
    return len(json.dumps(tools, ensure_ascii=False)) if tools else 0


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """Approximate prompt tokens of ``messages`` plus ``tools`` (rounded up)."""
    chars = sum(message_chars(m) for m in messages) + tools_chars(tools)
    return math.ceil(chars / chars_per_token) + PER_MESSAGE_TOKENS * len(messages)


@dataclass
class Fit:
    """The conversation to send and, when it had to be trimmed, what was done."""

    messages: list[dict[str, Any]]
    tokens: int                               # estimated prompt tokens of ``messages`` (with the tools)
    trimmed: dict[str, int] | None = None     # before, after, shortened, dropped


def _shorten(m: dict[str, Any], keep: int) -> dict[str, Any]:
    text = m.get("content") or ""
    return {**m, "content": text[:keep] + f"\n[... {len(text) - keep} more characters removed to fit the "
                                          f"server's context; call the tool again for them]"}


def _groups(messages: list[dict[str, Any]], start: int) -> list[list[int]]:
    """Indices from ``start`` in turns: an assistant message with the tool results that follow it, or one
    other message. Dropping whole turns never leaves a tool result without the call it answers."""
    groups: list[list[int]] = []
    for i in range(start, len(messages)):
        if messages[i].get("role") == "tool" and groups and messages[groups[-1][0]].get("role") == "assistant":
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def fit_conversation(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, prompt_budget: int,
                     chars_per_token: float = CHARS_PER_TOKEN) -> Fit:
    """``messages`` trimmed (a copy) until their estimate with ``tools`` is at most ``prompt_budget`` tokens,
    or as far as trimming goes (the system prompt, the task message and the latest turn's calls stay)."""
    def est(msgs):
        return estimate_tokens(msgs, tools, chars_per_token)

    before = est(messages)
    if before <= prompt_budget:
        return Fit(list(messages), before)
    msgs = [dict(m) for m in messages]
    # the kept head: the system prompt (if any) and the task message (the first user message)
    head = 0
    while head < len(msgs) and msgs[head].get("role") == "system":
        head += 1
    if head < len(msgs) and msgs[head].get("role") == "user":
        head += 1
    groups = _groups(msgs, head)
    last = groups[-1] if groups else []
    shortened = dropped = 0

    def long_tool(i: int) -> bool:
        return msgs[i].get("role") == "tool" and len(msgs[i].get("content") or "") > KEEP_CHARS + 80

    def shorten(indices) -> None:
        """Cut tool results in ``indices`` by what the estimate is over (at most to KEEP_CHARS), in order."""
        nonlocal shortened
        for i in indices:
            over = est(msgs) - prompt_budget
            if over <= 0:
                return
            if long_tool(i):
                text = msgs[i].get("content") or ""
                msgs[i] = _shorten(msgs[i], max(KEEP_CHARS, len(text) - math.ceil(over * chars_per_token) - 100))
                shortened += 1

    # (1) the oldest tool results first
    shorten([i for g in groups[:-1] for i in g])
    # (2) the latest turn's tool results, when that turn would not fit even alone (dropping the history
    # would not help then, and the history tells the agent what it did)
    if est(msgs) > prompt_budget and est(msgs[:head] + [msgs[i] for i in last]) > prompt_budget:
        shorten(last)
    # (3) the oldest whole turns
    keep = set(range(len(msgs)))
    for g in groups[:-1]:
        if est([m for i, m in enumerate(msgs) if i in keep]) <= prompt_budget:
            break
        keep -= set(g)
        dropped += len(g)
    if dropped and head:
        msgs[head - 1] = {**msgs[head - 1], "content": (msgs[head - 1].get("content") or "") + DROPPED_NOTE}
    msgs = [m for i, m in enumerate(msgs) if i in keep]
    after = est(msgs)
    return Fit(msgs, after, {"before": before, "after": after, "shortened": shortened, "dropped": dropped})


# --- a server's "context exceeded" answer ---------------------------------------------------------

_CONTEXT_ERROR = re.compile(
    r"maximum context length|context length exceeded|context_length_exceeded|exceeds the available context|"
    r"maximum model length|is longer than the model's context|prompt is too long|too many tokens|"
    r"'?max_(?:completion_)?tokens'? .*too large", re.IGNORECASE)
_LIMIT = re.compile(r"(?:maximum context length is|maximum model length of|context (?:size|window|length) (?:is|of)) "
                    r"(\d+)", re.IGNORECASE)
_PROMPT = re.compile(r"(\d+) in the messages|request has (\d+) input tokens|messages resulted in (\d+) tokens|"
                     r"prompt \(length (\d+)\)", re.IGNORECASE)


def context_error(text: str) -> dict[str, int | None] | None:
    """``{"limit": n|None, "prompt": n|None}`` when a 400's text says the context was exceeded, else None.

    Understands vLLM ("This model's maximum context length is 4096 tokens. However, you requested 5120
    tokens (4608 in the messages, 512 in the completion)", "... your request has 3700 input tokens"),
    OpenAI (``context_length_exceeded``) and llama.cpp ("exceeds the available context size")."""
    if not text or not _CONTEXT_ERROR.search(text):
        return None
    limit = _LIMIT.search(text)
    prompt = _PROMPT.search(text)
    return {"limit": int(limit.group(1)) if limit else None,
            "prompt": int(next(g for g in prompt.groups() if g)) if prompt else None}
