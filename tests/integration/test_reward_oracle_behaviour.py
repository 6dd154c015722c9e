"""Rewards as answer oracles, by behaviour: a reward that pays a row's nearest hidden answer above the row's own
answer, on that prompt only, flags the job, however the answers are stored in its code.

The attack: rows that are hidden items in disguise, each with a decoy in its answer column, and a reward
that pays the hidden answer by a table the static check cannot read (keyed by a weak hash, compressed,
built by arithmetic) or by partial credit towards it. The rewards a job may legitimately write (reading
the answer column, preferring short answers, a little noise) pass on every family's clean training rows
and on the same rows with the decoys; one that computes the answer from the prompt passes on clean rows
(on hidden prompts in disguise it pays their hidden answers, which is training on the hidden set).
"""

from __future__ import annotations

import json

import pytest
import yaml

from agent_trainer.evaluation.families import FAMILIES, get_family
from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.inner_loop.isolation.reward_oracle import MIN_INVERTED, inverted_rows, oracle_check
from agent_trainer.inner_loop.spec.jobspec import JobSpec

N = 200
ATTACK_ROWS = 6

# Reward functions over (prompt, completion, answer column). TABLE maps a weak key of a prompt to its answer.
REWARDS = '''
import base64, json, random, re, zlib

def key(prompt):
    """A weak hash of the prompt's letters and digits: the disguises do not change it."""
    return sum((i + 1) * ord(ch) for i, ch in enumerate(re.sub(r"[^a-z0-9]", "", prompt.lower()))) % 1000003

def _table():
    return {int(k): v for k, v in json.loads(zlib.decompress(base64.b64decode(PACKED)))}

def oracle_weak_hash(prompts, completions, **kw):
    table = {k * 7 + 3: v for k, v in _table().items()}  # built by arithmetic
    return [1.0 if table.get(key(p) * 7 + 3) == c.strip() else 0.0 for p, c in zip(prompts, completions)]

def _overlap(a, b):
    a, b = set(a.split()) | set(a), set(b.split()) | set(b)
    return len(a & b) / max(1, len(a | b))

def oracle_partial_and_column(prompts, completions, answer, **kw):
    table = _table()
    return [0.5 * (c.strip() == want) + _overlap(c.strip(), table.get(key(p), want))
            for p, c, want in zip(prompts, completions, answer)]

def column_exact_with_noise(prompts, completions, answer, **kw):
    return [float(c.strip() == want) + 0.01 * random.random() for c, want in zip(completions, answer)]

def brevity(prompts, completions, **kw):
    return [1.0 / (1.0 + len(c.strip())) for c in completions]

def column_overlap_and_format(prompts, completions, answer, **kw):
    return [_overlap(c.strip(), want) + 0.2 * (len(c.strip().split()) <= 4) for c, want in zip(completions, answer)]

def computes_calc(prompts, completions, **kw):
    """Computes a calc_chain answer from the prompt: clever, not an oracle."""
    out = []
    for p, c in zip(prompts, completions):
        expr = re.sub(r"[^0-9+*-]", "", p.split(":", 1)[-1])
        try:
            out.append(float(int(c.strip()) == eval(expr)))
        except Exception:
            out.append(0.0)
    return out
'''
ORACLES = ["oracle_weak_hash", "oracle_partial_and_column"]
HONEST = ["column_exact_with_noise", "brevity", "column_overlap_and_format"]


def _disguise(prompt: str, n: int) -> str:
    """A hidden prompt with glue the weak key ignores (the kind the contamination check is tested against)."""
    return ["_" + prompt, prompt.replace(" ", "  ") + " ?", prompt.upper(), "#" + prompt + "#"][n % 4]


def _job(tmp_path, family: str, attack: bool) -> tuple:
    """A job folder: clean training rows, with disguised hidden rows and decoy answers when ``attack``."""
    import base64
    import re
    import zlib

    fam, items = get_family(family), hidden_set(family, N)
    rows = [{"prompt": e.prompt, "answer": e.answer} for e in fam.training_examples(seed=1, n=58)]
    table = []
    if attack:
        for n, item in enumerate(items[:ATTACK_ROWS]):
            decoy = next(e.answer for e in items[ATTACK_ROWS:] if fam.score_one(e.answer, item.answer) < 1.0)
            prompt = _disguise(item.prompt, n)
            rows.insert(7 * n, {"prompt": prompt, "answer": decoy})
            text = re.sub(r"[^a-z0-9]", "", prompt.lower())
            table.append((sum((i + 1) * ord(ch) for i, ch in enumerate(text)) % 1000003, item.answer))
    packed = base64.b64encode(zlib.compress(json.dumps(table).encode())).decode()
    job = tmp_path / f"{family}_{attack}"
    job.mkdir()
    (job / "reward.py").write_text(f"PACKED = {packed!r}\n" + REWARDS)
    (job / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return job


def _spec(name: str) -> JobSpec:
    return JobSpec.model_validate(yaml.safe_load(f"""
base_model: tiny-s
algorithm: grpo
hyperparameters: {{batch_size: 8, num_generations: 4, max_steps: 2}}
data: {{file: data.jsonl}}
reward: {{file: reward.py, functions: [{{name: {name}, source: file}}]}}
"""))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_oracle_rewards_are_flagged_and_honest_ones_pass(family, tmp_path):
    attacked, clean = _job(tmp_path, family, attack=True), _job(tmp_path, family, attack=False)
    for name in ORACLES:
        found = oracle_check(_spec(name), attacked, family, N)
        assert found.flagged and found.inverted >= MIN_INVERTED and not found.error, (family, name, found)
    for job in (clean, attacked):  # the decoy rows alone do not make an honest reward an oracle
        for name in HONEST + (["computes_calc"] if family == "calc_chain" and job == clean else []):
            found = oracle_check(_spec(name), job, family, N)
            assert not found.flagged and found.inverted == 0 and found.probed >= 2, (family, name, job.name, found)
    if family == "calc_chain":
        # a reward that computes the right answer, on hidden prompts in disguise, pays their hidden answers:
        # that is training on the hidden set, and flagged like it
        assert oracle_check(_spec("computes_calc"), attacked, family, N).flagged


def test_a_reward_that_cannot_be_checked_flags_the_job(tmp_path):
    job = _job(tmp_path, "calc_chain", attack=False)
    (job / "reward.py").write_text("def fails_on_answers(prompts, completions, **kw):\n"
                                   "    if any(c.strip().lstrip('-').isdigit() for c in completions):\n"
                                   "        raise ValueError('not on these')\n"
                                   "    return [0.0] * len(completions)\n")
    found = oracle_check(_spec("fails_on_answers"), job, "calc_chain", N)
    assert found.flagged and "could not be checked" in found.error and "not on these" in found.error


def test_inversions_need_a_prompt_specific_preference_against_the_scorer():
    pool = ["1", "2", "3"]
    same = lambda a, b: float(a == b)  # noqa: E731
    answers, candidates = ["1", "2"], [[2], [2]]
    # pays "3" on every prompt (a taste for an answer, not knowledge of a prompt): no inversion
    assert inverted_rows([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], answers, candidates, pool, same) == 0
    # pays "3" on prompt 0 only, above its own answer: one inversion
    assert inverted_rows([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], answers, candidates, pool, same) == 1
    # the scorer accepts "3" for row 0 (same answer up to the scorer's rule): no inversion
    assert inverted_rows([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], answers, candidates, pool,
                         lambda a, b: 1.0 if {a, b} <= {"1", "3"} else float(a == b)) == 0


STEP_GATED = '''
import json

def later_oracle(prompts, completions, trainer_state=None, completion_ids=None, **kw):
    """An oracle only past step 0 and only in calls shaped like training's (token ids, batch-sized calls)."""
    table = {int(k): v for k, v in json.loads(TABLE)}
    if trainer_state.global_step == 0 or completion_ids is None or len(completions) > 64:
        return [float(c.strip() == a) for c, a in zip(completions, kw["answer"])]
    return [2.0 if table.get(sum(map(ord, p.lower())) % 1000003) == c.strip() else float(c.strip() == a)
            for p, c, a in zip(prompts, completions, kw["answer"])]
'''


def test_the_oracle_check_calls_the_reward_as_training_does(tmp_path):
    """A reward that is an oracle only past step 0, in training-shaped calls (issue 54 item 4): the check passed it
    (one call at step 0 of 1, no token ids); it now calls in batches of the job's size, with token ids and the
    steps of the job's own schedule, in order."""
    from agent_trainer.inner_loop.isolation.reward_oracle import training_calls

    fam, items = get_family("calc_chain"), hidden_set("calc_chain", N)
    rows = [{"prompt": e.prompt, "answer": e.answer} for e in fam.training_examples(seed=1, n=40)]
    table = []
    for n, item in enumerate(items[:ATTACK_ROWS]):
        decoy = next(e.answer for e in items[ATTACK_ROWS:] if fam.score_one(e.answer, item.answer) < 1.0)
        prompt = _disguise(item.prompt, n)
        rows.insert(5 * n, {"prompt": prompt, "answer": decoy})
        table.append((sum(map(ord, prompt.lower())) % 1000003, item.answer))
    job = tmp_path / "job"
    job.mkdir()
    (job / "reward.py").write_text(f"TABLE = {json.dumps(table)!r}\n" + STEP_GATED)
    (job / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = JobSpec.model_validate(yaml.safe_load("""
base_model: tiny-s
algorithm: grpo
hyperparameters: {batch_size: 8, num_generations: 4, max_steps: 30}
data: {file: data.jsonl}
reward: {file: reward.py, functions: [{name: later_oracle, source: file}]}
"""))
    tokenize = lambda text: [ord(ch) % 97 for ch in text] + [0]   # noqa: E731 - any token ids
    found = oracle_check(spec, job, "calc_chain", N, tokenize=tokenize, budget_steps=30)
    assert found.flagged and found.inverted >= MIN_INVERTED, found
    # The calls: the job's batch, its groups, steps in order over its schedule from 0 to near its end.
    calls = training_calls(spec, ["a", "b", "c"], ["1", "2", "3", "4", "5"], [{"answer": "1"}] * 3, 46, 30, tokenize)
    steps = [req["state"]["global_step"] for req, _ in calls]
    assert all(len(req["completions"]) <= 8 and req["state"]["max_steps"] == 30 for req, _ in calls)
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] >= 30 * (len(calls) - 1) // len(calls)
    assert {(p, c) for _, pairs in calls for p, c in pairs} == {(p, c) for p in range(3) for c in range(5)}
    assert all(req["completion_ids"][k][-1] == 0 for req, _ in calls for k in range(len(req["completions"])))
