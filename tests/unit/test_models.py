"""Tokenizer, chat template, tiny model build determinism and the model registry."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from agent_trainer.evaluation.families import FAMILIES, get_family
from agent_trainer.inner_loop.models import (
    BASE_MODELS,
    TINY_S,
    ModelNotFoundError,
    build_model,
    build_tokenizer,
    load_model,
    load_tokenizer,
    model_hash,
    resolve_model,
)
from agent_trainer.inner_loop.models.registry import BUILDERS, VERSIONS, is_built, model_dir, register_builder


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_tokenizer_is_deterministic_and_in_size(tok):
    assert build_tokenizer().backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert 1000 <= len(tok) <= 2000
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_prompt_is_a_token_prefix_and_text_round_trips(tok, name):
    for ex in get_family(name).training_examples(seed=11, n=100):
        prompt_ids = tok(ex.prompt, add_special_tokens=False)["input_ids"]
        full_ids = tok(ex.prompt + ex.answer, add_special_tokens=False)["input_ids"]
        assert full_ids[: len(prompt_ids)] == prompt_ids, ex
        assert tok.decode(full_ids) == ex.prompt + ex.answer


def test_save_load_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = load_tokenizer_files(tmp_path)
    text = 'calc: 12+7-3=16<|im_end|> {"name": "write_file"}'
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.chat_template == tok.chat_template


def load_tokenizer_files(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def test_chat_template_renders_tools_and_tool_calls(tok):
    tools = [{"type": "function", "function": {"name": "write_file", "description": "Write a file.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "You write training jobs."},
        {"role": "user", "content": "Train calc_chain."},
        {"role": "assistant", "content": "Writing the job.", "tool_calls": [
            {"type": "function", "function": {"name": "write_file",
                                              "arguments": {"path": "job.yaml", "content": "seed: 0"}}}]},
        {"role": "tool", "content": "wrote job.yaml"},
        {"role": "tool", "content": "second result"},
        {"role": "assistant", "content": "Done."},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou write training jobs.\n\n# Tools")
    assert json.dumps(tools[0]) in text
    assert ('Writing the job.\n<tool_call>\n{"name": "write_file", "arguments": '
            '{"path": "job.yaml", "content": "seed: 0"}}\n</tool_call><|im_end|>') in text
    # Consecutive tool results share one user turn.
    assert "<|im_start|>user\n<tool_response>\nwrote job.yaml\n</tool_response>\n<tool_response>\nsecond result" in text
    assert text.endswith("<|im_start|>assistant\nDone.<|im_end|>\n<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for special in ("<tool_call>", "</tool_call>", "<tool_response>", "<|im_start|>", "<|im_end|>"):
        assert tok.convert_tokens_to_ids(special) in ids
    plain = tok.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert plain == "<|im_start|>user\nTrain calc_chain.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


SMALL = dataclasses.replace(TINY_S, name="tiny-test", hidden_size=32, num_layers=1, intermediate_size=64, steps=8,
                            batch_size=16, warmup_steps=2)


def test_build_is_byte_identical_for_a_seed_and_differs_across_seeds(tok, tmp_path):
    a = build_model(SMALL, tmp_path / "a", seed=3, tokenizer=tok)
    b = build_model(SMALL, tmp_path / "b", seed=3, tokenizer=tok)
    c = build_model(SMALL, tmp_path / "c", seed=4, tokenizer=tok)
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()
    assert a["files"] == b["files"]
    assert c["files"]["model.safetensors"] != a["files"]["model.safetensors"]
    assert a["seed"] == 3 and a["config"]["hidden_size"] == 32 and "torch" in a["libraries"]
    model = load_model(tmp_path / "a")
    assert model.config.tie_word_embeddings and model.config.vocab_size == len(tok)
    assert model_hash(tmp_path / "a") == a["files"]["model.safetensors"]
    assert load_tokenizer(tmp_path / "a").eos_token_id == tok.eos_token_id


def test_pretraining_lowers_the_loss(tok):
    from transformers import Qwen3ForCausalLM

    from agent_trainer.inner_loop.models.build import _encode, pretrain, pretraining_rows, qwen3_config

    cfg = dataclasses.replace(SMALL, steps=30)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(cfg, tok))
    ids, labels = _encode(pretraining_rows(cfg, 0)[:64], tok)
    with torch.no_grad():
        before = model(input_ids=ids, labels=labels).loss.item()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as build_model does: a tiny model trains fastest on one thread
    try:
        pretrain(model, tok, cfg, seed=0)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        after = model(input_ids=ids, labels=labels).loss.item()
    assert after < before - 1.0


def test_registry_builds_once_atomically_and_reuses(tmp_path, tok):
    calls = []

    def builder(out_dir, seed, on_step=None):
        calls.append(seed)
        return build_model(SMALL, out_dir, seed=seed, tokenizer=tok, on_step=on_step)

    register_builder("tiny-test", builder, total_steps=SMALL.steps)
    try:
        path = resolve_model("tiny-test", cache_dir=tmp_path, progress=False)
        assert path == model_dir("tiny-test", 0, tmp_path) and is_built(path)
        assert resolve_model("tiny-test", cache_dir=tmp_path) == path and calls == [0]
        assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]
        with pytest.raises(ModelNotFoundError, match="not built yet"):
            resolve_model("tiny-test", cache_dir=tmp_path, seed=5, build_missing=False)
        # a builder with its own version builds into a folder of its own: an old build is never reused
        register_builder("tiny-test", builder, total_steps=SMALL.steps, version=99)
        assert model_dir("tiny-test", 0, tmp_path).name == "tiny-test-seed0-v99"
        assert resolve_model("tiny-test", cache_dir=tmp_path, progress=False) != path and calls == [0, 0]
    finally:
        BUILDERS.pop("tiny-test")
        VERSIONS.pop("tiny-test", None)
    assert "tiny-test" not in BASE_MODELS


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def broken(out_dir, seed, on_step=None):
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    register_builder("tiny-broken", broken)
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            resolve_model("tiny-broken", cache_dir=tmp_path, progress=False)
        assert not any(p.name.startswith((".tmp-", "tiny-broken")) for p in (tmp_path / "models").iterdir())
    finally:
        BUILDERS.pop("tiny-broken")


def test_unknown_and_missing_models_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ModelNotFoundError, match="known models: tiny-s, tiny-m, smollm2-135m, qwen3-0.6b"):
        resolve_model("gpt-5")
    monkeypatch.setenv("AGENT_TRAINER_QWEN3_DIR", str(tmp_path / "weights"))
    with pytest.raises(ModelNotFoundError, match="Qwen3-0.6B.*never downloaded|never downloaded.*Qwen3-0.6B"):
        resolve_model("qwen3-0.6b", cache_dir=tmp_path)
    real = tmp_path / "weights" / "Qwen3-1.7B"
    real.mkdir(parents=True)
    (real / "config.json").write_text("{}")
    assert resolve_model("qwen3-1.7b", cache_dir=tmp_path) == real
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(tmp_path)


def test_calibrated_build_stops_at_the_first_passing_check_and_records_it(tok, tmp_path):
    """A calibrated build scores the hidden sets at each candidate step and stops at the first pass;
    one that never passes trains to its last step and keeps the checkpoint with the most slack."""
    from agent_trainer.inner_loop.models.build import Calibration

    easy = dataclasses.replace(SMALL, steps=12, calibration=Calibration(min_steps=4, every=4, n=8, low=0.0, high=1.0))
    m = build_model(easy, tmp_path / "easy", seed=0, tokenizer=tok)
    cal = m["calibration"]
    assert cal["passed"] and cal["step"] == 4 and [c["step"] for c in cal["checks"]] == [4]
    assert set(cal["scores"]) == set(FAMILIES)
    # the checks' batched generation must not leak into the saved tokenizer (the lineage check compares it)
    assert json.loads((tmp_path / "easy/tokenizer.json").read_text())["padding"] is None
    # Unreachable band (every score must be >= 2): all three checks run, the mix is steered up for
    # every family, and the chosen checkpoint is one of the checked steps.
    hard = dataclasses.replace(easy, calibration=Calibration(min_steps=4, every=4, n=8, low=2.0, high=3.0))
    m = build_model(hard, tmp_path / "hard", seed=0, tokenizer=tok)
    cal = m["calibration"]
    assert not cal["passed"] and [c["step"] for c in cal["checks"]] == [4, 8, 12] and cal["step"] in (4, 8, 12)
    first, last = cal["checks"][0]["mix"], cal["checks"][-1]["mix"]
    assert all(last[f] > first[f] for f in first)
    # a model that must beat another needs that model's scores
    above = dataclasses.replace(easy, calibration=Calibration(min_steps=4, every=4, n=8, above="tiny-s"))
    with pytest.raises(ValueError, match="reference"):
        build_model(above, tmp_path / "above", seed=0, tokenizer=tok)


def scripted_calibrator(cal, script, reference=None):
    """A Calibrator whose hidden-set scores come from a script ({step: {family: score}}), so the
    control logic (when it checks, in which order, when it steers and stops) can be asserted exactly;
    ``.scored`` lists the (step, family) pairs it scored."""
    from agent_trainer.inner_loop.models.build import Calibrator, PretrainingStream

    class Scripted(Calibrator):
        def __call__(self, step):
            self.step = step
            return super().__call__(step)

        def _score(self, family):
            self.scored.append((self.step, family))
            return script[self.step][family]

    c = Scripted(torch.nn.Linear(1, 1), None, cal, reference, PretrainingStream(SMALL, seed=0))
    c.scored = []
    return c


def test_gated_checks_score_the_last_failures_first_stop_at_a_miss_and_never_steer():
    """Between full checks (every 4 steps here) a gated check every 2 steps scores the families that
    failed the last full check first and gives up at the first one still out of band; the build
    stops at a gated check where all are in band. Only full checks steer the mix."""
    from agent_trainer.inner_loop.models.build import Calibration

    cal = Calibration(min_steps=4, every=4, gate_every=2, n=8, low=0.1, high=0.5, up=2.0, down=0.5)
    ok = {f: 0.3 for f in FAMILIES}
    script = {4: {**ok, "calc_chain": 0.0, "triage": 0.9},           # full: two out of band
              6: {**ok, "triage": 0.9},                              # gate: triage (worst) first, still out
              8: {**ok, "calc_chain": 0.05},                         # full: calc_chain still low
              10: dict(ok)}                                          # gate: all in band -> stop
    c = scripted_calibrator(cal, script)
    mix0 = dict(c.stream.weights)
    assert [c(s) for s in range(1, 11)] == [False] * 9 + [True]
    # step 4 steered: calc_chain up, triage down, the others unchanged
    assert [h["step"] for h in c.history] == [4, 8, 10] and c.history[2]["gate"]
    assert c.history[1]["mix"]["calc_chain"] == 2 * mix0["calc_chain"]
    assert c.history[1]["mix"]["triage"] == 0.5 * mix0["triage"]
    # the gate at 6 scored triage (0.4 out: the worst) first and stopped there; the one at 10 scored
    # calc_chain (the only failure at 8) first, then every other family
    assert [f for s, f in c.scored if s == 6] == ["triage"]
    at10 = [f for s, f in c.scored if s == 10]
    assert at10[0] == "calc_chain" and sorted(at10) == sorted(FAMILIES)
    assert c.history[2]["mix"] == c.history[1]["mix"] | {"calc_chain": 2 * c.history[1]["mix"]["calc_chain"]}
    rec = c.finish()
    assert rec["passed"] and rec["step"] == 10 and rec["gated_checks"] == 2


def test_gated_checks_start_after_gate_after():
    """With gate_after, the first steps after min_steps have full checks only (a build that passes
    there keeps the bytes of a build without gates); gated checks follow."""
    from agent_trainer.inner_loop.models.build import Calibration

    cal = Calibration(min_steps=4, every=4, gate_every=2, gate_after=4, n=8, low=0.1, high=0.5)
    ok, low = {f: 0.3 for f in FAMILIES}, {f: 0.0 for f in FAMILIES}
    c = scripted_calibrator(cal, {4: low, 6: ok, 8: low, 10: ok})
    assert [c(s) for s in range(1, 11)] == [False] * 9 + [True]
    assert {s for s, _ in c.scored} == {4, 8, 10}


def test_a_score_exactly_on_a_band_edge_is_in_the_band():
    """0.035 + 0.02 is 0.05500000000000001 in floats: a score of 0.055 must still pass a band that
    starts 0.02 above a reference of 0.035."""
    from agent_trainer.inner_loop.models.build import Calibration

    cal = Calibration(min_steps=1, every=1, n=200, low=0.03, high=0.48, above="tiny-s", margin=0.02)
    reference = {f: 0.035 for f in FAMILIES}
    c = scripted_calibrator(cal, {1: {f: 0.055 for f in FAMILIES}}, reference=reference)
    assert c(1) and c.finish()["slack"] == 0
