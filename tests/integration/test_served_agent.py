"""A served agent (``agent=openai``) that holds up: what a real OpenAI-compatible server does to an episode.

No model: a scripted stdlib HTTP server answers each request as the test says (a body that is not JSON, a
reply slower than ``agent.timeout_s``, 503s, a 400 "maximum context length" when the prompt is too long,
``max_model_len`` in ``GET /v1/models``, a prompt count that shows the template dropped the tools). Each
case plays a whole ``at-episode`` (``run``/``play`` in-process, or the console script where the exit code
is the point): none raises, each ends with its own status, exit code and summary.json.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

import pytest

from agent_trainer.config import ConfigError, compose_config, validate

ROOT = Path(__file__).resolve().parents[2]
TASK = str(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
BIN = Path(sys.executable).parent


# --- a scripted OpenAI-compatible server ------------------------------------------------------------

@dataclass
class Reply:
    status: int = 200
    body: bytes | dict = b""
    delay: float = 0.0


class ScriptedServer:
    """``POST /v1/chat/completions`` answered by ``handler(body, n)`` (n: the chat request's number, from 1);
    ``GET /v1/models`` lists one model, with ``max_model_len`` when given. Requests are kept in ``chat``."""

    def __init__(self, handler: Callable[[dict, int], Reply], model: str, max_model_len: int | None = None):
        self.handler, self.model, self.max_model_len = handler, model, max_model_len
        self.chat: list[dict] = []
        self.replies: list[int] = []
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


def _handler_class(server: ScriptedServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, reply: Reply) -> None:
            data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            card = {"id": server.model, "object": "model", "owned_by": "vllm"}
            if server.max_model_len:
                card["max_model_len"] = server.max_model_len
            self._send(Reply(body={"object": "list", "data": [card]}))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with server._lock:
                server.chat.append(body)
                reply = server.handler(body, len(server.chat))
                server.replies.append(reply.status)
            time.sleep(reply.delay)
            try:
                self._send(reply)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                pass

    return Handler


@contextmanager
def serve(handler, model: str = "SmolLM2-135M-Instruct", max_model_len: int | None = None) -> Iterator[ScriptedServer]:
    server = ScriptedServer(handler, model, max_model_len)
    thread = threading.Thread(target=server.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def completion(calls=(), content=None, prompt_tokens=50, completion_tokens=10) -> dict:
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": f"call_{i}_{name}", "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(args)}}
                                 for i, (name, args) in enumerate(calls)]
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def agent_script(*calls, prompt_tokens: Callable[[dict], int] = lambda body: 50):
    """A handler answering accepted requests with ``calls`` in turn (one per turn), then ``finish``."""
    turns = list(calls)

    def answer(body: dict, n: int = 0) -> Reply:
        call = turns.pop(0) if turns else ("finish", {"summary": "done"})
        return Reply(body=completion([call], prompt_tokens=prompt_tokens(body)))
    return answer


READ_GUIDE = ("read_file", {"path": "GUIDE.md"})


def prompt_chars(body: dict) -> int:
    chars = sum(len(m.get("content") or "") + (len(json.dumps(m["tool_calls"])) if m.get("tool_calls") else 0)
                for m in body["messages"])
    return chars + (len(json.dumps(body["tools"])) if body.get("tools") else 0)


def server_tokens(body: dict) -> int:
    """The server's count: 2.5 characters per token, fewer than the backend's first guess of 3.5."""
    return math.ceil(prompt_chars(body) / 2.5)


# --- running at-episode ------------------------------------------------------------------------------

def episode_cfg(tmp_path: Path, base_url: str, *overrides: str, run_id: str = "ep"):
    return compose_config([f"runs_dir={tmp_path}", f"run_id={run_id}", f"task.spec_path={TASK}", "agent=openai",
                           "agent.model=SmolLM2-135M-Instruct", f"agent.base_url={base_url}",
                           "agent.api_key_env=null", "tracking=off", "agent.max_new_tokens=512",
                           "agent.retry_backoff_s=0.01", *overrides], "episode")


def play(tmp_path: Path, base_url: str, *overrides: str, run_id: str = "ep"):
    """at-episode in-process; returns (summary, trajectory records, exit code)."""
    from agent_trainer.commands import episode as at_episode

    result = at_episode.play(episode_cfg(tmp_path, base_url, *overrides, run_id=run_id))
    ep = tmp_path / run_id / "episodes" / "0"
    summary = json.loads((ep / "summary.json").read_text())
    assert summary["status"] == result.status
    trajectory = [json.loads(x) for x in (ep / "trajectory.jsonl").read_text().splitlines()]
    return summary, trajectory, at_episode.exit_code(summary)


def events(trajectory: list[dict], name: str) -> list[dict]:
    return [r for r in trajectory if r.get("event") == name]


def at_episode(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | (env_extra or {})
    return subprocess.run([str(BIN / "at-episode"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


# --- the cases -----------------------------------------------------------------------------------------

def test_a_body_that_is_not_json_ends_as_backend_error_with_exit_3(tmp_path):
    """Through the console script: exit 3, the first bytes in the message, summary.json written."""
    html = b"<html><body>502 upstream proxy error " + b"x" * 400 + b"</body></html>"
    with serve(lambda body, n: Reply(body=html)) as srv:
        proc = at_episode(f"runs_dir={tmp_path}", "run_id=ep", f"task={TASK}", "agent=openai",
                          "agent.model=SmolLM2-135M-Instruct", f"agent.base_url={srv.base_url}",
                          "agent.api_key_env=null", "tracking=off")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "not JSON" in proc.stderr and "502 upstream proxy error" in proc.stderr and "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "ep" / "episodes" / "0" / "summary.json").read_text())
    assert summary["status"] == "backend_error"
    [err] = [json.loads(x) for x in (tmp_path / "ep" / "episodes" / "0" / "trajectory.jsonl").read_text().splitlines()
             if '"backend_error"' in x]
    assert "<html><body>502 upstream proxy error" in err["message"] and len(err["message"]) < 400
    assert len(srv.chat) == 1  # a 200 is not retried


def test_json_that_is_no_chat_completion_ends_as_backend_error(tmp_path):
    with serve(lambda body, n: Reply(body={"object": "list", "data": []})) as srv:
        summary, trajectory, code = play(tmp_path, srv.base_url)
    assert (summary["status"], code) == ("backend_error", 3)
    assert "not a chat completion" in events(trajectory, "backend_error")[0]["message"]


def test_a_timeout_is_reported_as_a_timeout_and_not_retried(tmp_path):
    with serve(lambda body, n: Reply(body=completion([READ_GUIDE]), delay=2.5)) as srv:
        t0 = time.time()
        summary, trajectory, code = play(tmp_path, srv.base_url, "agent.timeout_s=1")
        took = time.time() - t0
    assert (summary["status"], code) == ("backend_error", 3)
    message = events(trajectory, "backend_error")[0]["message"]
    assert message.startswith(f"timed out after 1 s waiting for {srv.base_url}/chat/completions"), message
    assert "cannot" not in message and len(srv.chat) == 1 and took < 20


def test_503_then_success_is_retried_with_backoff(tmp_path):
    script = agent_script(READ_GUIDE)

    def handler(body, n):
        return Reply(503, b"upstream overloaded, try again") if n <= 2 else script(body)

    with serve(handler) as srv:
        summary, trajectory, code = play(tmp_path, srv.base_url, "agent.max_retries=2")
    assert (summary["status"], code) == ("finished", 0)
    assert srv.replies[:3] == [503, 503, 200] and len(events(trajectory, "backend_retry")) == 2
    body = srv.chat[0]  # the request as configured
    assert body["max_completion_tokens"] == 512 and "max_tokens" not in body
    assert body["tool_choice"] == "auto" and "parallel_tool_calls" not in body

    with serve(lambda body, n: Reply(503, b"upstream overloaded, try again")) as srv:
        summary, trajectory, code = play(tmp_path, srv.base_url, "agent.max_retries=1", "agent.tool_choice=required",
                                         "agent.parallel_tool_calls=false", "agent.legacy_max_tokens=true",
                                         run_id="down")
    assert (summary["status"], code) == ("backend_error", 3) and len(srv.chat) == 2
    assert events(trajectory, "backend_error")[0]["message"] == (
        f"HTTP 503 from {srv.base_url}/chat/completions after 2 tries: 'upstream overloaded, try again'")
    body = srv.chat[0]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["max_tokens"] == 512 and "max_completion_tokens" not in body


def _context_server(limit: int, script):
    """vLLM's answer when prompt + completion exceed ``limit`` (counted the server's way), else the script."""
    def handler(body, n):
        prompt, completion_tokens = server_tokens(body), body.get("max_completion_tokens") or 0
        if prompt + completion_tokens > limit:
            return Reply(400, {"object": "error", "type": "BadRequestError", "code": 400, "message": (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt + completion_tokens} tokens ({prompt} in the messages, {completion_tokens} in the "
                f"completion). Please reduce the length of the messages or completion.")})
        return script(body)
    return handler


def _check_trimmed_requests(srv, limit: int) -> None:
    accepted = [b for b, status in zip(srv.chat, srv.replies) if status == 200]
    system, task = accepted[0]["messages"][:2]
    assert system["role"] == "system" and task["role"] == "user"
    for body in accepted:  # every accepted request fit, with the system prompt and the task message first
        assert server_tokens(body) + body["max_completion_tokens"] <= limit
        assert body["messages"][0] == system and body["messages"][1]["content"].startswith(task["content"])


def test_a_long_conversation_is_trimmed_to_max_model_len_from_v1_models(tmp_path):
    limit = 3072
    script = agent_script(READ_GUIDE, READ_GUIDE, READ_GUIDE, prompt_tokens=server_tokens)
    with serve(_context_server(limit, script), max_model_len=limit) as srv:
        summary, trajectory, code = play(tmp_path, srv.base_url)
    assert (summary["status"], code) == ("finished", 0)
    assert 400 not in srv.replies  # the context was known: trimmed before sending, never refused
    trimmed = events(trajectory, "context_trimmed")
    assert trimmed and all(t["context_tokens"] == limit for t in trimmed) and "trimmed" in trimmed[0]["message"]
    _check_trimmed_requests(srv, limit)
    # the episode's own trajectory keeps every tool result whole
    guide = (tmp_path / "ep" / "episodes" / "0" / "workspace" / "GUIDE.md").read_text()
    results = [r for r in trajectory if r.get("role") == "tool" and r.get("name") == "read_file"]
    assert len(results) == 3 and all(r["content"].startswith(guide[:200]) and len(r["content"]) >= len(guide) - 50
                                     for r in results)


def test_a_context_error_makes_the_backend_trim_harder_and_retry_once(tmp_path):
    """No max_model_len in /v1/models: the 400 names the limit; the turn is trimmed and sent again."""
    limit = 3072
    script = agent_script(READ_GUIDE, READ_GUIDE, prompt_tokens=lambda body: 0)  # no usage to learn from
    with serve(_context_server(limit, script)) as srv:
        summary, trajectory, code = play(tmp_path, srv.base_url)
    assert (summary["status"], code) == ("finished", 0) and not events(trajectory, "backend_error")
    assert srv.replies.count(400) == 1 and srv.replies[srv.replies.index(400) + 1] == 200
    assert len(events(trajectory, "context_retry")) == 1 and events(trajectory, "context_trimmed")
    _check_trimmed_requests(srv, limit)
    assert summary["n_turns"] == 3  # the refused attempt is no extra turn


def test_an_unknown_local_model_costs_nothing_and_dropped_tools_are_noticed(tmp_path):
    """SmolLM2 on 127.0.0.1 without prices: USD 0 (tokens still counted); its template dropped the tools
    (the server's prompt is 36 tokens): one warning for the episode, not one per turn."""
    with serve(agent_script(READ_GUIDE, READ_GUIDE, prompt_tokens=lambda body: 36)) as srv:
        summary, trajectory, code = play(tmp_path, srv.base_url)
    assert (summary["status"], code) == ("finished", 0) and summary["usd"] == 0.0
    llm = [json.loads(x) for x in (tmp_path / "ep" / "ledger.jsonl").read_text().splitlines()]
    llm = [r for r in llm if r["kind"] == "llm"]
    assert len(llm) == 3 and all(r["tokens_in"] == 36 and r["usd"] == 0.0 for r in llm)
    [warning] = events(trajectory, "backend_warning")
    assert warning["kind"] == "tools_dropped" and "36 prompt tokens" in warning["message"]


def test_prices_come_from_the_table_by_model_and_a_remote_unknown_model_is_refused(tmp_path):
    from agent_trainer.prices import agent_prices

    assert agent_prices("gpt-4.1-nano", None) == (0.10, 0.40, "price table")
    assert agent_prices("gpt-4.1-mini-2025-04-14", None)[:2] == (0.40, 1.60)
    for local in ("http://localhost:8000/v1", "http://10.0.0.7:8000/v1", "http://[::1]:8000/v1", "http://gpu3:8000/v1"):
        assert agent_prices("my-model", local) == (0.0, 0.0, "local server")
    assert agent_prices("my-model", "https://api.example.com/v1", 1.0, 2.0) == (1.0, 2.0, "config")
    with pytest.raises(ConfigError, match="usd_per_1m_tokens_in"):
        validate(compose_config([f"runs_dir={tmp_path}", "agent=openai", "agent.model=my-model",
                                 "agent.base_url=https://api.example.com/v1"], "episode"))


@pytest.mark.parametrize("overrides,text", [
    (["agent.base_url=127.0.0.1:8000/v1"], "agent.base_url must be an http(s) URL"),
    (["agent.base_url=http://"], "agent.base_url must be an http(s) URL"),
    (["agent.timeout_s=0"], "agent.timeout_s"),
])
def test_served_agent_settings_are_checked(tmp_path, overrides, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        validate(compose_config([f"runs_dir={tmp_path}", "agent=openai", *overrides], "episode"))


def test_a_tool_choice_outside_its_choices_fails_when_composed(tmp_path):
    from hydra.errors import HydraException

    with pytest.raises(HydraException, match=re.escape("agent.tool_choice=always")):
        compose_config([f"runs_dir={tmp_path}", "agent=openai", "agent.tool_choice=always"], "episode")


def test_at_train_refuses_a_served_agent_in_validation(tmp_path):
    with pytest.raises(ConfigError, match="agent=openai is served elsewhere"):
        validate(compose_config([f"runs_dir={tmp_path}", "agent=openai"], "train"))


def test_an_unset_key_variable_is_one_line_before_any_folder(tmp_path):
    runs = tmp_path / "runs"
    proc = at_episode(f"runs_dir={runs}", f"task={TASK}", "agent=openai", "agent.model=SmolLM2-135M-Instruct",
                      "agent.base_url=http://127.0.0.1:9/v1", "agent.api_key_env=AT_SURELY_UNSET_KEY")
    assert proc.returncode == 2 and not runs.exists(), proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("at-episode: error: environment variable AT_SURELY_UNSET_KEY is empty or unset")
    # the advice is one the config takes
    assert "agent.api_key_env=null" in line
    validate(compose_config([f"runs_dir={runs}", "agent=openai", "agent.base_url=http://127.0.0.1:9/v1",
                             "agent.api_key_env=null"], "episode"))


def test_budget_and_turns_end_with_their_own_codes(tmp_path):
    with serve(lambda body, n: Reply(body=completion(content="I think I should write a job."))) as srv:
        summary, _, code = play(tmp_path, srv.base_url, "agent.max_turns=2", run_id="turns")
        assert (summary["status"], code) == ("max_turns", 5) and not summary["jobs"]
        summary, trajectory, code = play(tmp_path, srv.base_url, "budget.max_tokens_per_episode=100", run_id="budget")
        assert (summary["status"], code) == ("budget_exhausted", 4) and events(trajectory, "budget_exhausted")


def test_trimming_drops_whole_old_turns_and_reads_every_servers_context_error():
    from agent_trainer.outer_loop.agents.context import DROPPED_NOTE, context_error, estimate_tokens, fit_conversation

    convo = [{"role": "system", "content": "sys"}, {"role": "user", "content": "the task"}]
    for k in range(6):
        convo += [{"role": "assistant", "content": "x" * 600,
                   "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": f"c{k}", "content": f"result {k} " + "y" * 200}]
    fit = fit_conversation(convo, None, prompt_budget=600, chars_per_token=3.5)
    assert fit.trimmed["dropped"] > 0 and fit.tokens <= 600 and estimate_tokens(convo, None) > 600
    assert fit.messages[0] == convo[0] and fit.messages[1]["content"] == "the task" + DROPPED_NOTE
    assert fit.messages[-2:] == convo[-2:]  # the latest turn whole
    calls = {c["id"] for m in fit.messages for c in m.get("tool_calls") or []}
    assert all(m["tool_call_id"] in calls for m in fit.messages if m["role"] == "tool")  # no orphaned result
    assert len(convo) == 14 and convo[1]["content"] == "the task"  # the episode's own conversation is untouched

    assert context_error("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                         "(4488 in the messages, 512 in the completion).") == {"limit": 4096, "prompt": 4488}
    assert context_error("'max_tokens' or 'max_completion_tokens' is too large: 1024. This model's maximum context "
                         "length is 4096 tokens and your request has 3700 input tokens (1024 > 4096 - 3700).") == {
        "limit": 4096, "prompt": 3700}
    assert context_error("the request exceeds the available context size, try increasing it") == {
        "limit": None, "prompt": None}
    assert context_error("model 'x' not found") is None
