"""OpenAI-compatible backend: any server speaking ``/v1/chat/completions`` with native tool calls.

    >>> from outer_loop.backends.openai_backend import OpenAIBackend
    >>> backend = OpenAIBackend(base_url="http://127.0.0.1:8000/v1", model="agent",
    ...                         api_key_env="AGENT_API_KEY")
    >>> gen = backend.generate(messages, tools, temperature=1.0, max_new_tokens=256, seed=0)

Works with OpenAI itself, vLLM's ``vllm serve``, SGLang, llama.cpp's server, and the test server in
``tests/fixtures/openai_server.py``. Tools go as ``tools=`` with ``tool_choice="auto"``; token counts
come from ``response.usage``; log-probs of the sampled tokens when the server returns them
(``logprobs: true`` in config asks for them; not every server accepts it, hence off by default).

The API key is read from the environment variable *named* by ``api_key_env``. The key itself is
never logged, stored on the backend's public attributes, or put into an exception message: server
error texts are redacted before they are raised (some servers echo part of a bad key).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from outer_loop.backends.base import AgentBackend, BackendError, Generation, _call_id, utf8_clean

# Keys some providers echo back in 401 messages, partly masked ("sk-abc***xyz").
_KEYLIKE = re.compile(r"\b(sk|key|api)[-_][A-Za-z0-9*_\-]{4,}", re.IGNORECASE)


class OpenAIBackend(AgentBackend):
    """The ``openai`` SDK against ``base_url``; one chat completion per ``generate``."""

    native_tools = True  # tools travel as OpenAI function schemas; the server renders them

    def __init__(self, *, model: str, base_url: str | None = None, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = 120.0, max_retries: int = 2, logprobs: bool = False,
                 extra_body: dict[str, Any] | None = None):
        import openai

        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not key:
            raise BackendError(f"environment variable {api_key_env} is empty or unset; export the API key "
                               f"there (or set api_key_env: null for a server that needs no key)")
        # Local servers accept any key, but the SDK insists on one.
        self._secret = key
        self.client = openai.OpenAI(base_url=base_url, api_key=key or "no-key", timeout=timeout_s,
                                    max_retries=max_retries)
        self.base_url = base_url or "the OpenAI API"
        self.model_name = model
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})

    def __repr__(self) -> str:
        return f"OpenAIBackend(base_url={self.base_url!r}, model={self.model_name!r})"

    def generate(self, messages, tools=None, *, temperature=1.0, max_new_tokens=512, seed=None) -> Generation:
        import openai

        kwargs: dict[str, Any] = {
            "model": self.model_name, "messages": [_wire_message(m) for m in messages],
            "temperature": temperature, "max_tokens": max_new_tokens,
        }
        if tools:
            kwargs.update(tools=tools, tool_choice="auto")
        if seed is not None:
            kwargs["seed"] = int(seed)
        if self.logprobs:
            kwargs["logprobs"] = True
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except openai.APIStatusError as e:
            raise BackendError(f"{self.base_url} answered HTTP {e.status_code} for model {self.model_name!r}: "
                               f"{self._redact(str(e.message))}") from None
        except openai.APIConnectionError:
            raise BackendError(f"cannot reach {self.base_url}; is the server running and base_url right "
                               f"(it usually ends in /v1)?") from None
        except openai.OpenAIError as e:
            raise BackendError(f"request to {self.base_url} failed: {self._redact(str(e))}") from None
        return self._to_generation(resp)

    def _redact(self, text: str) -> str:
        if self._secret:
            text = text.replace(self._secret, "***")
        return _KEYLIKE.sub("***", text)

    @staticmethod
    def _to_generation(resp) -> Generation:
        if not resp.choices:
            raise BackendError("the server returned no choices; check the model name and the request limits")
        choice = resp.choices[0]
        msg = choice.message
        calls: list[dict[str, Any]] = []
        bad: list[str] = []
        for i, tc in enumerate(msg.tool_calls or []):
            fn = getattr(tc, "function", None)
            if fn is None:
                continue
            try:
                args = json.loads(fn.arguments) if fn.arguments else {}
            except (ValueError, RecursionError):  # not JSON, a huge number, nesting too deep
                args = None
            if not isinstance(args, dict) or not utf8_clean(fn.name, args):
                # Same rule as the local parser: a call whose arguments are not a JSON object is no call.
                bad.append(f'<tool_call>{{"name": {json.dumps(fn.name)}, "arguments": {fn.arguments}}}</tool_call>')
                continue
            calls.append({"id": tc.id or _call_id(fn.name, i), "name": fn.name, "arguments": args})
        text = "\n".join([msg.content or "", *bad]).strip()
        usage = resp.usage
        lp = getattr(choice, "logprobs", None)
        logprobs = [t.logprob for t in lp.content] if lp is not None and lp.content else None
        extra = getattr(choice, "model_extra", None) or {}
        token_ids = extra.get("token_ids")  # vLLM with extra_body={"return_token_ids": True}
        return Generation(
            text=text, tool_calls=calls,
            prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
            token_ids=list(token_ids) if token_ids else None, logprobs=logprobs,
            finish_reason=choice.finish_reason or "stop", raw=resp.model_dump(),
        )


def _wire_message(m: dict[str, Any]) -> dict[str, Any]:
    """OpenAI servers want tool-call arguments as JSON strings and content present on every turn."""
    out = dict(m)
    if out.get("content") is None:
        out["content"] = ""
    if out.get("tool_calls"):
        calls = []
        for c in out["tool_calls"]:
            fn = dict(c.get("function") or {"name": c.get("name"), "arguments": c.get("arguments", {})})
            if not isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.dumps(fn.get("arguments") or {})
            calls.append({"id": c.get("id", ""), "type": "function", "function": fn})
        out["tool_calls"] = calls
    return out
