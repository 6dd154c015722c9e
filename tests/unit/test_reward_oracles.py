"""Reward code as an answer oracle: tables of answers keyed by digests of prompts are refused by the validation.

The contamination check searches reward source for hidden text; a table keyed by ``sha256(prompt)``
holds none. ``agent_trainer.inner_loop.spec.reward_checks`` refuses digest-like tables in any encoding
(hex or base64 strings, big integers, bytes, one packed string) and lets computed rewards through.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import random

import pytest
import yaml

from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.inner_loop.spec.reward_checks import answer_table_problem
from agent_trainer.inner_loop.spec.validate import validate_job

ITEMS = hidden_set("calc_chain", 200)
BODY = ("\n\ndef oracle(prompts, completions, **kw):\n"
        "    import hashlib\n"
        "    keys = [hashlib.sha256(p.encode()).hexdigest()[:16] for p in prompts]\n"
        "    return [1.0 if TABLE.get(k) == c.strip() else 0.0 for k, c in zip(keys, completions)]\n")


def _digest(prompt: str) -> bytes:
    return hashlib.sha256(prompt.encode()).digest()


TABLES = {
    "hex_keys": {_digest(e.prompt).hex()[:16]: e.answer for e in ITEMS},
    "base64_keys": {base64.b64encode(_digest(e.prompt)[:9]).decode(): e.answer for e in ITEMS},
    "int_keys": {int.from_bytes(_digest(e.prompt)[:8], "big"): e.answer for e in ITEMS},
    "bytes_keys": {_digest(e.prompt)[:8]: e.answer for e in ITEMS},
    "packed": "".join(_digest(e.prompt).hex()[:16] + e.answer.rjust(4, "0") for e in ITEMS),
    "random_hex_keys": {f"{random.Random(i).getrandbits(64):016x}": "1" for i in range(40)},  # not even hidden
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_answer_tables_keyed_by_prompt_digests_are_refused(name, tmp_path):
    source = f"TABLE = {TABLES[name]!r}\n" + BODY
    assert answer_table_problem(ast.parse(source)), name
    if name != "hex_keys":
        return  # the validation's path is the same for every table
    job = tmp_path / "job"
    job.mkdir()
    (job / "reward.py").write_text(source)
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "grpo", "seed": 0,
        "hyperparameters": {"batch_size": 8, "num_generations": 4, "max_steps": 2},
        "data": {"sources": [{"family": "calc_chain", "size": 64}]},
        "reward": {"file": "reward.py", "functions": [{"name": "oracle", "source": "file"}]}}))
    report = validate_job(job, "examples/tasks/calc_chain_v1_fast.json", dry_run=False)
    assert not report.ok and any("look answers up" in f.message for f in report.errors), report.to_text()


def test_computed_rewards_pass():
    for path in ("examples/jobs/custom_reward/reward.py",):
        assert answer_table_problem(ast.parse(open(path).read())) is None, path
    few = ("SALT = 'a1b2c3d4e5f6'\nCOLORS = ['ff0000aa', '00ff00bb']\nBIG = 2**64\n"
           "def r(prompts, completions, **kw):\n    return [float(len(c) < 8) for c in completions]\n")
    assert answer_table_problem(ast.parse(few)) is None
