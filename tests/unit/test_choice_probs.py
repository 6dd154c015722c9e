"""scripts/choice_probs.py: the policy's probability of SFT where each episode named its algorithm, per step.

    .venv/bin/pytest tests/unit/test_choice_probs.py -q        (~2 s)
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("choice_probs", ROOT / "scripts" / "choice_probs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _episode(folder: Path, tok, algorithm: str, logprob: float, reward: float = 0.0) -> None:
    """One training episode whose first turn writes ``algorithm`` with ``logprob`` at its first token (and a later
    turn ``dpo``); it scored ``reward``, a tenth of it the validation stage."""
    before = tok.encode("write job.yaml: base_model: tiny-s\nalgorithm:", add_special_tokens=False)
    value = tok.encode(f" {algorithm}\n", add_special_tokens=False)
    ids = before + value
    lps = [-0.01] * len(before) + [logprob] + [-0.02] * (len(value) - 1)
    folder.mkdir(parents=True)
    turns = [{"role": "system", "content": "..."},
             {"role": "assistant", "content": "", "token_ids": ids, "logprobs": lps},
             {"role": "assistant", "content": "", "token_ids": before + tok.encode(" dpo", add_special_tokens=False),
              "logprobs": [-0.5] * (len(before) + 1)}]
    (folder / "trajectory.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    (folder / "summary.json").write_text(json.dumps({"task": "calc_chain_v1", "reward": {
        "total": reward, "validation": reward / 10, "quality": 0.0}}))


def test_p_sft_per_step_from_the_stored_logprobs(tmp_path):
    """p(sft) is exp(logprob) where SFT was sampled and 1 - exp(logprob) where GRPO was, one choice a turn; a
    turn that names DPO counts as a choice and not in p(sft); steps come from the episode folders' names."""
    from transformers import AutoTokenizer

    from agent_trainer.inner_loop.models.registry import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-s"))
    cp = _script()
    run = tmp_path / "run"
    _episode(run / "episodes" / "s0000-train-calc_chain-0", tok, "grpo", math.log(0.9))
    _episode(run / "episodes" / "s0000-train-calc_chain-1", tok, "grpo", math.log(0.7))
    _episode(run / "episodes" / "s0001-train-calc_chain-0", tok, "sft", math.log(0.6))
    (run / "episodes" / "s0001-heldout-triage-0").mkdir()
    rows = cp.step_rows(run, tok)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["choices"] == 2 + 2 and rows[0]["sft"] == 0
    assert rows[0]["p_sft"] == pytest.approx((0.1 + 0.3) / 2, abs=1e-3)
    assert rows[1]["sft"] == 1 and rows[1]["p_sft"] == pytest.approx(0.6, abs=1e-3)


def test_what_the_reward_paid_each_choice(tmp_path):
    """An episode's advantage is its reward minus its group's mean (a step's episodes of one task), filed under the
    last algorithm its turns named; the stages are averaged as they are."""
    from transformers import AutoTokenizer

    from agent_trainer.inner_loop.models.registry import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-s"))
    cp = _script()
    run = tmp_path / "run"
    _episode(run / "episodes" / "s0000-train-calc_chain-0", tok, "sft", -0.1, reward=0.6)
    _episode(run / "episodes" / "s0000-train-calc_chain-1", tok, "grpo", -0.1, reward=0.2)
    _episode(run / "episodes" / "s0001-train-calc_chain-0", tok, "grpo", -0.1, reward=0.5)
    for ep in (run / "episodes").iterdir():   # the last algorithm named: the second turn's is dpo, rewrite it
        path = ep / "trajectory.jsonl"
        algorithm = "sft" if ep.name.endswith("calc_chain-0") and ep.name.startswith("s0000") else "grpo"
        path.write_text(path.read_text() + json.dumps({"role": "tool", "content": f"algorithm: {algorithm}"}) + "\n")
    got = cp.by_choice(run)
    assert got["sft"] == (1, pytest.approx(0.2), pytest.approx(0.06), 0.0)
    assert got["grpo"] == (2, pytest.approx((-0.2 + 0.0) / 2), pytest.approx((0.02 + 0.05) / 2), 0.0)
