"""OpenAI-compatible backend: any server speaking ``/v1/chat/completions`` with native tool calls.

    >>> from agent_trainer.outer_loop.agents.openai_backend import OpenAIBackend
    >>> backend = OpenAIBackend(base_url="http://127.0.0.1:8000/v1", model="agent",
    ...                         api_key_env="AGENT_API_KEY", timeout_s=300, max_retries=2)
    >>> gen = backend.generate(messages, tools, temperature=1.0, max_new_tokens=256, seed=0)

Works with OpenAI, ``vllm serve``, SGLang and llama.cpp's server. Every failure is one ``BackendError`` line
(the episode ends as ``backend_error``); long conversations are trimmed to the server's context
(``agent_trainer.outer_loop.agents.context``); the key, read from the variable named by ``api_key_env``, is never logged
or raised. Settings, retries and errors: docs/agents.md, "A served agent".
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from agent_trainer.config import AgentConfig, ToolChoice
from agent_trainer.outer_loop.agents.base import (
    AgentBackend, BackendError, Generation, card_context, error_text, model_cards, quote_body,
    read_api_key, redact_keys,
)
from agent_trainer.outer_loop.agents.toolcalls import parse_openai_tool_calls

from agent_trainer.outer_loop.agents.context import (
    CHARS_PER_TOKEN, PER_MESSAGE_TOKENS, Fit, context_error, estimate_tokens, fit_conversation, message_chars,
    tools_chars,
)

log = logging.getLogger(__name__)
TOOL_CHOICES = tuple(c.value for c in ToolChoice)
CONNECT_TIMEOUT_S = 10.0       # a server that takes longer to accept a connection is not there
MODELS_TIMEOUT_S = 10.0        # GET /v1/models, asked once for the context length
MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 60.0
HEAD_CHARS = 200               # how much of an unexpected body an error message quotes


class OpenAIBackend(AgentBackend):
    """The ``openai`` SDK against ``base_url``; one chat completion per ``generate``."""

    native_tools = True  # tools travel as OpenAI function schemas; the server renders them

    def __init__(self, *, model: str, base_url: str | None = None, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = AgentConfig.timeout_s, max_retries: int = AgentConfig.max_retries,
                 retry_backoff_s: float = AgentConfig.retry_backoff_s, context_tokens: int | None = None,
                 tool_choice: str = AgentConfig.tool_choice.value, parallel_tool_calls: bool | None = None,
                 legacy_max_tokens: bool = False, logprobs: bool = False, extra_body: dict[str, Any] | None = None,
                 tool_format: str = AgentConfig.tool_format):
        import httpx2
        import openai

        key = read_api_key(api_key_env, base_url)
        if tool_choice not in TOOL_CHOICES:
            raise BackendError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, got {tool_choice!r}")
        self._secret = key
        self.timeout_s = float(timeout_s)
        # Retries are ours (max_retries=0 in the SDK): counted, reported as what failed, backoff configurable.
        timeout = httpx2.Timeout(self.timeout_s, connect=min(self.timeout_s, CONNECT_TIMEOUT_S))
        self.client = openai.OpenAI(base_url=base_url, api_key=key or "no-key", max_retries=0, timeout=timeout)
        self.base_url = base_url or "the OpenAI API"
        self.url = str(self.client.base_url).rstrip("/")
        self.model_name = model
        self.max_retries, self.retry_backoff_s = int(max_retries), float(retry_backoff_s)
        self.configured_context = int(context_tokens) if context_tokens else None
        self.tool_choice, self.parallel_tool_calls = tool_choice, parallel_tool_calls
        self.legacy_max_tokens = legacy_max_tokens
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})
        self.event_log: Callable[[dict[str, Any]], None] | None = None  # at-episode: the trajectory's log
        self.events: list[dict[str, Any]] = []
        self.last_error: str | None = None
        self._server_context: int | None = None
        self._asked_server = False
        self._learned_context: int | None = None   # from a "maximum context length is N" answer
        self._chars_per_token = CHARS_PER_TOKEN
        self._warned: set[str] = set()
        self.set_tool_format(tool_format)  # calls a server leaves in the text are read in this format

    def __repr__(self) -> str:
        return f"OpenAIBackend(base_url={self.base_url!r}, model={self.model_name!r})"

    def close(self) -> None:
        self.client.close()

    # --- one turn ------------------------------------------------------------------------------
    def generate(self, messages, tools=None, *, temperature=AgentConfig.temperature,
                 max_new_tokens=AgentConfig.max_new_tokens, seed=None) -> Generation:
        """One chat completion; every failure (transport, HTTP status, a body that is no chat completion)
        is a one-line ``BackendError``, also kept in ``last_error``."""
        try:
            return self._generate(messages, tools, temperature, max_new_tokens, seed)
        except BackendError as e:
            self.last_error = str(e)
            raise

    def _generate(self, messages, tools, temperature, max_new_tokens, seed) -> Generation:
        context = self.context_tokens()
        fit, max_new = self._fit(messages, tools, max_new_tokens, context)
        try:
            resp, body = self._complete(self._request(fit.messages, tools, temperature, max_new, seed))
        except _ContextExceeded as e:
            # The estimate was short (or the context unknown): learn from the answer, trim harder, try once more.
            context = self._learn_overflow(e, fit, tools) or context
            fit, max_new = self._fit(messages, tools, max_new_tokens, context, harder=True, shrink_from=fit.tokens)
            self._event("context_retry", message=f"the server said the context was exceeded ({e.text[:160]}); "
                                                 f"trimmed to ~{fit.tokens} tokens and sent again")
            try:
                resp, body = self._complete(self._request(fit.messages, tools, temperature, max_new, seed))
            except _ContextExceeded as again:
                raise BackendError(f"HTTP 400 from {self.url}/chat/completions: the conversation does not fit the "
                                   f"server's context even trimmed to ~{fit.tokens} tokens: {again.text}") from None
        try:
            gen = self._to_generation(resp)
        except BackendError:
            raise
        except Exception as e:  # a chat completion in a shape nobody expected: the turn ends, the episode does not
            raise BackendError(f"{self.url}/chat/completions answered a chat completion that cannot be read "
                               f"({type(e).__name__}: {self._redact(str(e))[:120]}): {self._head(body)}") from None
        self._after_usage(gen, fit, tools)
        return gen

    def _request(self, messages, tools, temperature, max_new_tokens, seed) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model_name, "messages": [_wire_message(m) for m in messages],
                                  "temperature": temperature}
        kwargs["max_tokens" if self.legacy_max_tokens else "max_completion_tokens"] = max_new_tokens
        if tools:
            kwargs.update(tools=tools, tool_choice=self.tool_choice)
            if self.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = bool(self.parallel_tool_calls)
        if seed is not None:
            kwargs["seed"] = int(seed)
        if self.logprobs:
            kwargs["logprobs"] = True
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def _complete(self, kwargs: dict[str, Any]):
        """POST the request (with retries); the parsed chat completion and the raw body."""
        url = f"{self.url}/chat/completions"
        raw = self._send(lambda: self.client.chat.completions.with_raw_response.create(**kwargs), url)
        body = raw.content
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise BackendError(f"{url} answered HTTP {raw.status_code} with a body that is not JSON: "
                               f"{self._head(body)}") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)
                and isinstance(choices[0].get("message"), dict)):
            raise BackendError(f"{url} answered HTTP {raw.status_code} with JSON that is not a chat completion "
                               f"(no choices[0].message): {self._head(body)}")
        try:
            return raw.parse(), body
        except Exception as e:  # noqa: BLE001 - whatever the SDK makes of it, the turn ends as backend_error
            raise BackendError(f"{url}: the chat completion cannot be read ({type(e).__name__}): "
                               f"{self._head(body)}") from None

    # --- transport: timeouts, connect errors, HTTP statuses, retries -----------------------------
    def _send(self, call: Callable[[], Any], url: str):
        """``call()`` with retries of connect errors, 429 and 5xx (backoff doubling from retry_backoff_s,
        a Retry-After header honoured up to a minute); a read timeout and other 4xx are not retried."""
        import httpx2
        import openai

        tries = self.max_retries + 1
        for attempt in range(1, tries + 1):
            retry_after = None
            try:
                return call()
            except openai.APITimeoutError as e:
                if not isinstance(e.__cause__, httpx2.ConnectTimeout):
                    # Not retried: a turn that outlasted timeout_s would only outlast it again.
                    raise BackendError(f"timed out after {self.timeout_s:g} s waiting for {url} (a long turn on "
                                       f"a slow server needs a larger agent.timeout_s)") from None
                problem, detail = f"cannot connect to {url}", f"no connection within {CONNECT_TIMEOUT_S:g} s"
            except openai.APIConnectionError as e:
                connect = isinstance(e.__cause__, (httpx2.ConnectError, httpx2.ConnectTimeout))
                problem = f"cannot connect to {url}" if connect else f"the connection to {url} failed"
                detail = self._redact(str(e.__cause__ or e.message))
            except openai.APIStatusError as e:
                status, text = e.status_code, self._error_text(e.response)
                if status == 400 and (found := context_error(text)) is not None:
                    raise _ContextExceeded(text, found) from None
                if status != 429 and status < 500:
                    raise BackendError(f"HTTP {status} from {url}: {text}{_status_hint(status)}") from None
                problem, detail = f"HTTP {status} from {url}", text
                retry_after = _retry_after(e.response)
            except openai.OpenAIError as e:
                raise BackendError(f"request to {url} failed: {self._redact(str(e))}") from None
            if attempt < tries:
                wait = min(self.retry_backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
                if retry_after is not None:
                    wait = max(wait, min(retry_after, MAX_RETRY_AFTER_S))
                self._event("backend_retry", message=f"{problem}: {detail}; retry {attempt} of {self.max_retries} "
                                                     f"in {wait:.1f} s")
                time.sleep(wait)
        hint = " (is the server running, and does agent.base_url end in /v1?)" if problem.startswith("cannot") else ""
        raise BackendError(f"{problem} after {tries} {'try' if tries == 1 else 'tries'}: {detail}{hint}")

    def _error_text(self, response) -> str:
        """The error message of an error response (``base.error_text``: its JSON ``error.message``), else its
        first bytes; redacted."""
        try:
            body = response.content
        except Exception:  # noqa: BLE001 - a stream that cannot be read: no text
            return "(no body)"
        return error_text(body, HEAD_CHARS, self._redact)

    def _head(self, body: bytes | str) -> str:
        """The first ~200 bytes of a body, on one line, redacted."""
        return quote_body(body, HEAD_CHARS, self._redact)

    def _redact(self, text: str) -> str:
        return redact_keys(text, self._secret)

    # --- the server's context ------------------------------------------------------------------
    def context_tokens(self) -> int | None:
        """The context to fit: the least of the server's (``GET /v1/models``: vLLM's ``max_model_len``, asked
        once), ``context_tokens`` of the config and one a context error named; None when none is known."""
        if not self._asked_server:
            self._asked_server = True
            self._server_context = self._models_context()
            if self._server_context:
                self._event("context", message=f"{self.url}/models: {self.model_name} has a context of "
                                               f"{self._server_context} tokens")
        known = [c for c in (self._server_context, self.configured_context, self._learned_context) if c]
        return min(known) if known else None

    def _models_context(self) -> int | None:
        try:
            raw = self.client.models.with_raw_response.list(timeout=min(self.timeout_s, MODELS_TIMEOUT_S))
            cards = model_cards(json.loads(raw.content))
        except Exception:  # noqa: BLE001 - optional information: any failure means "not said"
            return None
        mine = [d for d in cards if d.get("id") == self.model_name] or (cards if len(cards) == 1 else [])
        return next((n for n in map(card_context, mine) if n), None)

    def _fit(self, messages, tools, max_new_tokens: int, context: int | None, *, harder: bool = False,
             shrink_from: int | None = None) -> tuple[Fit, int]:
        """The conversation to send and the completion tokens to ask for, within ``context``."""
        if context is None:
            if shrink_from is None:
                return Fit(list(messages), estimate_tokens(messages, tools, self._chars_per_token)), max_new_tokens
            budget = int(shrink_from * 0.6)  # no number to aim at: cut the conversation by 40%
        else:
            margin = max(16, context // 50)
            budget = context - min(max_new_tokens, context // 2) - margin
            if harder:
                budget = int(budget * 0.85)
        fit = fit_conversation(messages, tools, prompt_budget=budget, chars_per_token=self._chars_per_token)
        max_new = max_new_tokens
        if context is not None and fit.tokens + max_new_tokens + max(16, context // 50) > context:
            max_new = max(1, context - fit.tokens - max(16, context // 50))
        if fit.trimmed:
            record = {**fit.trimmed, "context_tokens": context, "max_completion_tokens": max_new}
            self._event("context_trimmed", message=(
                f"conversation trimmed from ~{fit.trimmed['before']} to ~{fit.trimmed['after']} tokens to fit the "
                f"server's context of {context if context else 'unknown size'} ({fit.trimmed['shortened']} tool "
                f"results shortened, {fit.trimmed['dropped']} messages dropped)"), **record)
        return fit, max_new

    def _learn_overflow(self, e: "_ContextExceeded", fit: Fit, tools) -> int | None:
        """Adopt the context and the characters per token a context error reveals; returns the context."""
        limit, prompt = e.found.get("limit"), e.found.get("prompt")
        if limit:
            self._learned_context = int(limit)
        if prompt:
            chars = sum(message_chars(m) for m in fit.messages) + tools_chars(tools)
            self._chars_per_token = max(1.0, min(self._chars_per_token, 0.95 * chars / max(1, prompt)))
        else:
            self._chars_per_token = max(1.0, self._chars_per_token * 0.8)
        return self.context_tokens()

    def _after_usage(self, gen: Generation, fit: Fit, tools) -> None:
        """Learn characters per token from the server's count; warn (once) when the prompt is far smaller
        than the tool schemas sent: the chat template dropped ``tools``."""
        if gen.prompt_tokens <= 0:
            return
        chars = sum(message_chars(m) for m in fit.messages)
        tool_tokens = tools_chars(tools) / CHARS_PER_TOKEN
        if tools and gen.prompt_tokens < 0.5 * tool_tokens:
            self._warn_once("tools_dropped", (
                f"the server counted {gen.prompt_tokens} prompt tokens, but the tool schemas alone are ~"
                f"{tool_tokens:.0f}: its chat template drops `tools` (SmolLM2's does), so the model never sees "
                f"them; serve it with a tool-aware chat template (vllm serve --chat-template ...), or list the "
                f"tools in the system prompt with agent.tool_schemas=names"))
            return
        overhead = PER_MESSAGE_TOKENS * len(fit.messages)
        observed = (chars + tools_chars(tools)) / max(1, gen.prompt_tokens - overhead)
        if observed < self._chars_per_token:
            self._chars_per_token = max(1.0, observed)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)
            self._event("backend_warning", message=message, kind=key)

    def _event(self, event: str, **fields: Any) -> None:
        """A record for the episode's trajectory (``event_log``) and ``events``; trimming and retries go to
        the log too."""
        record = {"event": event, **fields}
        self.events.append(record)
        if event != "backend_warning":
            log.info(fields.get("message", event))
        if self.event_log is not None:
            self.event_log(record)

    def _to_generation(self, resp) -> Generation:
        if not resp.choices:
            raise BackendError("the server returned no choices; check the model name and the request limits")
        choice = resp.choices[0]
        msg = choice.message
        if msg.tool_calls:
            # Same rule as the text formats: a call whose arguments are not a JSON object is no call (it is
            # written into the text, so the agent sees it); arguments as a JSON string, even twice, are decoded.
            text, calls, _ = parse_openai_tool_calls(msg.tool_calls, msg.content)
        else:  # a server without a tool-call parser for this model leaves the calls in the text
            text, calls, _ = self.parse_tool_text(msg.content or "")
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


class _ContextExceeded(BackendError):
    """A 400 that says the prompt and completion exceed the server's context (handled in ``generate``)."""

    def __init__(self, text: str, found: dict[str, int | None]):
        super().__init__(text)
        self.text, self.found = text, found


def _status_hint(status: int) -> str:
    if status in (401, 403):
        return " (check the API key in the variable agent.api_key_env names)"
    if status == 404:
        return " (check agent.model, the served model's name, and that agent.base_url ends in /v1)"
    return ""


def _retry_after(response) -> float | None:
    try:
        value = float(response.headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None
