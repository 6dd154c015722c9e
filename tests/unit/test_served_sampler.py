"""The served sampler (agent.sampler=served) against a fake vLLM server: LoRA pushes, the model name requests
use, token ids and log-probs, and one-line errors when the server refuses LoRAs (tests/fixtures/vllm_lora_server.py)."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from agent_trainer.config import ConfigError, compose_config, validate
from agent_trainer.outer_loop.agents.served_sampler import (
    ADAPTERS_DIR, ServedSampler, ServedSamplerError, served_sampler,
)
from agent_trainer.outer_loop.episode.tools import SCHEMAS

_spec = importlib.util.spec_from_file_location(
    "vllm_lora_server", Path(__file__).parents[1] / "fixtures" / "vllm_lora_server.py")
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)

MESSAGES = [{"role": "system", "content": "You train models."}, {"role": "user", "content": "Read GUIDE.md."}]
TOOLS = [s for s in SCHEMAS if s["function"]["name"] in ("read_file", "finish")]
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "GUIDE.md"}}\n</tool_call>'


class FakeModel:
    """What push_adapter needs of a PEFT model: ``save_pretrained`` writing an adapter folder."""

    def save_pretrained(self, folder: str) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "adapter_config.json").write_text("{}")


def in_process_prompt(tokenizer, messages, tools) -> list[int]:
    """The prompt ids of the local backend (the policy's own sampler) for the same conversation."""
    import torch

    from agent_trainer.outer_loop.agents.local import LocalBackend

    model = torch.nn.Linear(1, 1)
    model.config = SimpleNamespace(max_position_embeddings=8192)
    return LocalBackend(model, tokenizer, device="cpu", model_name="m").render(messages, tools)


def policy(version: int = 0):
    return SimpleNamespace(model=FakeModel(), version=version)


def sampler(server, folder, **kw) -> ServedSampler:
    return ServedSampler(base_url=server.base_url, model_path=folder, model_name="smollm2", max_retries=0, **kw)


def test_push_loads_the_new_lora_unloads_the_old_and_requests_name_it(smollm2, tmp_path):
    with fake.serve(root=str(smollm2)) as server:
        s = sampler(server, smollm2)
        assert (s.base_model, s.max_model_len) == ("smollm2", 2048)
        with pytest.raises(ServedSamplerError, match="no LoRA pushed"):
            s.generate(MESSAGES, TOOLS)
        run = tmp_path / "run-a"
        assert s.push_adapter(policy(0), run) == "run-a-v0000"
        assert server.posts("/v1/load_lora_adapter") == [
            {"lora_name": "run-a-v0000", "lora_path": str((run / ADAPTERS_DIR / "v0000").resolve())}]
        s.generate(MESSAGES, TOOLS)
        assert server.posts("/v1/completions")[-1]["model"] == "run-a-v0000"

        assert s.push_adapter(policy(1), run) == "run-a-v0001"
        assert [p for p, _ in server.calls[-2:]] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
        assert server.posts("/v1/unload_lora_adapter") == [{"lora_name": "run-a-v0000"}]
        assert sorted(p.name for p in (run / ADAPTERS_DIR).iterdir()) == ["v0001"]   # the old folder is gone
        s.generate(MESSAGES, TOOLS)
        assert server.posts("/v1/completions")[-1]["model"] == "run-a-v0001"
        assert list(server.adapters) == ["run-a-v0001"]
        s.close()
        assert server.adapters == {}


def test_a_resumed_run_replaces_the_adapter_the_server_still_holds(smollm2, tmp_path):
    with fake.serve(root=str(smollm2)) as server:
        sampler(server, smollm2).push_adapter(policy(3), tmp_path / "r")     # the run that was killed
        s = sampler(server, smollm2)
        assert s.push_adapter(policy(3), tmp_path / "r") == "r-v0003"
        assert [p.rsplit("/", 1)[-1] for p, _ in server.calls] == [
            "load_lora_adapter", "load_lora_adapter", "unload_lora_adapter", "load_lora_adapter"]
        assert list(server.adapters) == ["r-v0003"]


def test_generation_carries_the_prompt_and_sampled_ids_with_their_logprobs(smollm2, tmp_path):
    with fake.serve(root=str(smollm2)) as server:
        s = sampler(server, smollm2)
        s.push_adapter(policy(), tmp_path / "run")
        server.reply = {"text": CALL + "<|im_end|>", "token_ids": [11, 12, 13, 2],
                        "logprobs": [-0.1, -2.0, -0.3, -0.01]}
        gen = s.generate(MESSAGES, TOOLS, temperature=0.7, max_new_tokens=64, seed=5)
        body = server.posts("/v1/completions")[-1]
        # the prompt goes as token ids, those the in-process samplers render (local, vllm: chat_prompt)
        assert body["prompt"] == in_process_prompt(s.tokenizer, MESSAGES, TOOLS)
        assert gen.prompt_ids == body["prompt"] and gen.prompt_tokens == len(body["prompt"])
        later = MESSAGES + [gen.as_message(), {"role": "tool", "tool_call_id": gen.tool_calls[0]["id"],
                                               "name": "read_file", "content": "# GUIDE"}]
        s.generate(later, TOOLS)
        assert server.posts("/v1/completions")[-1]["prompt"] == in_process_prompt(s.tokenizer, later, TOOLS)
        assert "read_file" in s.tokenizer.decode(body["prompt"])       # SmolLM2 drops tools: the tool prompt
        assert {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "logprobs", "seed",
                                     "return_token_ids", "skip_special_tokens")} == {
            "max_tokens": 64, "temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "logprobs": 0, "seed": 5,
            "return_token_ids": True, "skip_special_tokens": False}
        assert gen.token_ids == [11, 12, 13, 2] and gen.logprobs == [-0.1, -2.0, -0.3, -0.01]
        assert [c["name"] for c in gen.tool_calls] == ["read_file"] and gen.tool_calls[0]["arguments"] == {
            "path": "GUIDE.md"}
        assert gen.raw == CALL and gen.finish_reason == "tool_calls" and gen.completion_tokens == 4

        server.token_ids = False      # ids only as logprobs.tokens "token_id:N" (return_tokens_as_token_ids)
        server.reply = {"text": "hm", "token_ids": [5, 6], "logprobs": [-1.0, -1.5], "finish_reason": "length"}
        gen = s.generate(MESSAGES, TOOLS, max_new_tokens=2)
        assert gen.token_ids == [5, 6] and gen.logprobs == [-1.0, -1.5] and gen.finish_reason == "length"

        server.reply = {"text": "hm", "token_ids": [5], "logprobs": None}
        with pytest.raises(ServedSamplerError, match="no token ids with log-probs") as e:
            s.generate(MESSAGES, TOOLS)
        assert "\n" not in str(e.value)


def test_the_completion_limit_fits_the_servers_context(smollm2, tmp_path):
    with fake.serve(root=str(smollm2), max_model_len=400) as server:
        s = sampler(server, smollm2)
        s.push_adapter(policy(), tmp_path / "run")
        s.generate(MESSAGES, TOOLS, max_new_tokens=512)
        body = server.posts("/v1/completions")[-1]
        assert body["max_tokens"] == 400 - len(body["prompt"])


@pytest.mark.parametrize("lora, says", [
    ("disabled", "refused the LoRA run-v0000 .* HTTP 500: Call to add_lora method failed: .*LoRA is not enabled. "
                 "Use --enable-lora"),
    ("no_route", r"has no /v1/load_lora_adapter \(HTTP 404: Not Found\)"),
])
def test_a_server_that_refuses_loras_is_one_line_with_the_fix(smollm2, tmp_path, lora, says):
    with fake.serve(root=str(smollm2), lora=lora) as server:
        s = ServedSampler(base_url=server.base_url, model_path=smollm2, max_retries=3, retry_backoff_s=5.0)
        with pytest.raises(ServedSamplerError, match=says) as e:
            s.push_adapter(policy(), tmp_path / "run")
        msg = str(e.value)
        assert "\n" not in msg and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in msg and "agent=vllm" in msg
        assert len(server.posts("/v1/load_lora_adapter")) == 1      # a refusal is not retried
        assert s.adapter is None


def test_at_train_reports_served_sampler_errors_in_one_line():
    from agent_trainer.commands._errors import user_errors

    assert ServedSamplerError in user_errors()


def test_unreachable_server_and_unset_key_are_one_line(smollm2, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]          # closed once the block ends: nothing listens there
    with pytest.raises(ServedSamplerError, match=f"cannot connect to http://127.0.0.1:{port}/v1/models") as e:
        ServedSampler(base_url=f"http://127.0.0.1:{port}/v1", model_path=smollm2, max_retries=0)
    assert "\n" not in str(e.value)
    monkeypatch.delenv("AT_NO_SUCH_KEY", raising=False)
    # The wording of every agent backend (agent_trainer.outer_loop.agents.base.key_unset_message): the variable, the
    # fix, and the config value for a server without a key.
    with pytest.raises(ServedSamplerError, match=r"AT_NO_SUCH_KEY is empty or unset; export the API key in it, or "
                                                 r"agent.api_key_env=null if http://127.0.0.1:1/v1 needs no key"):
        ServedSampler(base_url="http://127.0.0.1:1/v1", model_path=smollm2, api_key_env="AT_NO_SUCH_KEY")


def test_keys_a_server_echoes_are_redacted_in_errors(smollm2, tmp_path, monkeypatch):
    """As the OpenAI backend does (agent_trainer.outer_loop.agents.base.redact_keys): the key itself and key-like
    strings a body quotes become ***, in an error's message and in a body quoted whole."""
    monkeypatch.setenv("AT_SERVED_KEY", "hunter2-correct-horse")
    with fake.serve(root=str(smollm2)) as server:
        s = sampler(server, smollm2, api_key_env="AT_SERVED_KEY")
        s.push_adapter(policy(), tmp_path / "run")
        server.complete = lambda body: (401, fake._error(
            "Incorrect API key provided: hunter2-correct-horse (sk-abc***2345)", "AuthenticationError", 401))
        with pytest.raises(ServedSamplerError, match=r"HTTP 401 .*: Incorrect API key provided: \*\*\* \(\*\*\*\)$"):
            s.generate(MESSAGES, TOOLS)
        server.complete = lambda body: (401, "no JSON: hunter2-correct-horse, sk-live-abcdef")
        with pytest.raises(ServedSamplerError) as e:
            s.generate(MESSAGES, TOOLS)
        assert "hunter2" not in str(e.value) and "'no JSON: ***, ***'" in str(e.value)


def agent_cfg(**kw):
    base = {"sampler": "served", "backend": "local", "base_url": None, "model": "smollm2-135m", "api_key_env": None,
            "timeout_s": 30.0, "max_retries": 0, "retry_backoff_s": 0.0, "tool_format": "auto"}
    return OmegaConf.create({**base, **kw})


def test_the_config_picks_the_served_sampler_and_says_what_is_missing(smollm2):
    # The rules are the agent group's (agent_trainer.config): one line before any run folder is written.
    for overrides, message in ((["agent.base_url=null"], "needs agent.base_url"),
                               (["agent.backend=vllm"], "agent.backend=vllm has its own sampler")):
        with pytest.raises(ConfigError, match=message):
            validate(compose_config(["experiment=smoke", "agent=smollm2_served", *overrides], "train"))
    with pytest.raises(HydraException, match="agent.sampler=engine"):   # a choice: checked when composed
        compose_config(["experiment=smoke", "agent=smollm2_served", "agent.sampler=engine"], "train")
    validate(compose_config(["experiment=smoke", "agent=smollm2_served"], "train"))
    with fake.serve(root=str(smollm2)) as server:
        s = served_sampler(agent_cfg(base_url=server.base_url), smollm2)
        assert isinstance(s, ServedSampler) and s.url == server.base_url and s.model_name == "smollm2-135m"


def test_the_trainer_pushes_the_lora_to_a_served_sampler(smollm2, tmp_path):
    """``Trainer.sync_sampler`` (at the start and after each update) gives a served sampler the adapter itself."""
    from agent_trainer.outer_loop.rl.train import Trainer

    with fake.serve(root=str(smollm2)) as server:
        trainer = SimpleNamespace(backend=sampler(server, smollm2), policy=policy(2), run_dir=tmp_path / "run")
        Trainer.sync_sampler(trainer)
        assert trainer.backend.adapter == "run-v0002" and list(server.adapters) == ["run-v0002"]


def test_a_real_peft_adapter_is_what_gets_loaded(base_dir, tmp_path):
    """save_pretrained of a PEFT LoRA writes the folder the server is told to load (adapter config and weights)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with fake.serve(root=str(base_dir)) as server:
        s = sampler(server, base_dir)
        s.push_adapter(SimpleNamespace(model=model, version=1), tmp_path / "run")
        folder = Path(server.adapters["run-v0001"])
        assert (folder / "adapter_model.safetensors").is_file()
        assert json.loads((folder / "adapter_config.json").read_text())["r"] == 4


def test_agent_smollm2_served_makes_at_trains_sampler(smollm2):
    """``at-train agent=smollm2_served agent.base_url=...``: make_sampler builds the served sampler from the
    composed config; ``agent.sampler=auto`` keeps the policy's own sampler (None)."""
    from agent_trainer.config import compose_config
    from agent_trainer.outer_loop.rl.run_config import make_sampler

    with fake.serve(root=str(smollm2)) as server:
        cfg = compose_config(["agent=smollm2_served", f"agent.base_url={server.base_url}", "agent.max_retries=0"],
                             "train")
        s = make_sampler(cfg, smollm2)
        assert isinstance(s, ServedSampler) and s.url == server.base_url and s.tool_format == "hermes"
    assert make_sampler(compose_config(["agent=smollm2"], "train"), smollm2) is None


def test_a_steps_turns_go_to_the_server_together(smollm2, tmp_path):
    """``generate_batch`` sends the turns concurrently (the server batches them) and answers in request order."""
    from agent_trainer.outer_loop.agents.base import SampleRequest

    with fake.serve(root=str(smollm2)) as server:
        s = sampler(server, smollm2)
        s.push_adapter(policy(), tmp_path / "run")
        server.delay_s = 0.3
        convs = [MESSAGES + [{"role": "user", "content": f"turn {i}"}] for i in range(6)]
        out = s.generate_batch([SampleRequest(c, TOOLS, 0.7, 32, seed=i) for i, c in enumerate(convs)])
        assert server.max_in_flight == 6
        assert [g.prompt_ids for g in out] == [in_process_prompt(s.tokenizer, c, TOOLS) for c in convs]
        assert sorted(b["seed"] for b in server.posts("/v1/completions")) == list(range(6))
