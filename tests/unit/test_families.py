"""Task families: determinism, hidden/training disjointness, seed checks, scorers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent_trainer.evaluation.families import (
    FAMILIES,
    HIDDEN_SEED_BASE,
    MAX_AGENT_SEED,
    FamilyError,
    get_family,
    in_hidden_pool,
)
from agent_trainer.evaluation.hidden_eval import hidden_set

NAMES = sorted(FAMILIES)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", NAMES)
def test_training_examples_are_deterministic(name):
    fam = get_family(name)
    assert fam.training_examples(seed=7, n=50) == get_family(name).training_examples(seed=7, n=50)
    assert fam.training_examples(seed=7, n=50) != fam.training_examples(seed=8, n=50)


@pytest.mark.parametrize("name", NAMES)
def test_hidden_set_is_fixed_distinct_and_in_the_hidden_pool(name):
    items = hidden_set(name, 200)
    assert items == hidden_set(name, 200)
    assert len({e.prompt for e in items}) == 200
    assert all(get_family(name).in_hidden(e.prompt) for e in items)
    # Every hidden item falls in the prompt hash's buckets: the shipped models' pretraining never saw one.
    assert all(in_hidden_pool(name, e.prompt) for e in items)


@pytest.mark.parametrize("name", NAMES)
def test_no_training_seed_reaches_a_hidden_prompt(name):
    fam = get_family(name)
    hidden = {e.prompt for e in hidden_set(name, 200)}
    # 200 seeds x 500 items, spread over the whole agent seed range.
    for seed in range(0, MAX_AGENT_SEED, MAX_AGENT_SEED // 200):
        prompts = {e.prompt for e in fam.training_examples(seed=seed, n=500)}
        assert not prompts & hidden, f"seed {seed} reached hidden items"
        assert all(fam.in_training(p) and not fam.in_hidden(p) for p in prompts)


@pytest.mark.parametrize("seed", [-1, MAX_AGENT_SEED, HIDDEN_SEED_BASE + 1, 1.5, "3"])
def test_seeds_out_of_range_are_refused_with_the_fix(seed):
    with pytest.raises(FamilyError, match=r"seed must be an integer in \[0, 1000000\)"):
        get_family("calc_chain").training_examples(seed=seed, n=3)


def test_bad_sizes_and_names_are_refused():
    with pytest.raises(FamilyError, match="n must be"):
        get_family("calc_chain").training_examples(seed=0, n=0)
    with pytest.raises(FamilyError, match="known: .*calc_chain"):
        get_family("calc")
    with pytest.raises(FamilyError, match="version 1"):
        get_family("calc_chain", version=2)


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_answer_scores_one_and_a_wrong_one_zero(name):
    fam = get_family(name)
    for ex in fam.training_examples(seed=3, n=30):
        assert fam.score_one(ex.answer, ex.answer) == 1.0
        assert fam.score_one(f" {ex.answer}\nmore text", ex.answer) == 1.0
        assert fam.score_one("", ex.answer) == 0.0
        assert fam.score_one("zzz " + ex.answer, ex.answer) == 0.0


@pytest.mark.parametrize(
    "name, completion, answer, score",
    [
        ("calc_chain", "16", "16", 1.0), ("calc_chain", "-4", "-4", 1.0), ("calc_chain", "4", "-4", 0.0),
        ("calc_chain", "16.0", "16", 1.0), ("calc_chain", "17", "16", 0.0), ("calc_chain", "abc", "16", 0.0),
        ("reverse_text", "tac", "tac", 1.0), ("reverse_text", " TAC ", "tac", 1.0),
        ("reverse_text", "ta c", "tac", 0.0),
        ("sort_numbers", "2 5 9", "2 5 9", 1.0), ("sort_numbers", "2  5 9", "2 5 9", 1.0),
        ("sort_numbers", "2 9 5", "2 5 9", 0.0),
        ("unit_convert", "3000", "3000", 1.0), ("unit_convert", "300", "3000", 0.0),
        ("count_char", "3", "3", 1.0), ("count_char", "3 times", "3", 1.0), ("count_char", "2", "3", 0.0),
        ("triage", "billing", "billing", 1.0), ("triage", "Billing.", "billing", 1.0),
        ("triage", "shipping", "billing", 0.0), ("triage", "billingx", "billing", 0.0),
    ],
)
def test_scorers_on_examples(name, completion, answer, score):
    assert get_family(name).score_one(completion, answer) == score


def test_training_stream_continues_training_examples():
    """The streaming draw (calibrated model builds) yields exactly training_examples' items, in order."""
    import itertools

    from agent_trainer.evaluation.families import get_family

    for name in ("calc_chain", "triage"):
        fam = get_family(name)
        assert list(itertools.islice(fam.training_stream(3), 50)) == fam.training_examples(seed=3, n=50)


def test_a_broken_card_on_the_include_path_is_blamed_not_the_spec_that_loaded_it(tmp_path, monkeypatch):
    """Validating any task spec looks its family up, which loads every card on the include path: a corrupt line
    in a user's JSONL is reported as that line, not as an invalid built-in spec."""
    from agent_trainer.evaluation.families import CardError
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.registry import INCLUDE_PATH_ENV

    shutil.copy(ROOT / "examples/families/word_math.yaml", tmp_path)
    rows = (ROOT / "examples/families/word_math.jsonl").read_text().splitlines()
    (tmp_path / "word_math.jsonl").write_text("\n".join([*rows[:2], '{"prompt": "broken', *rows[3:]]) + "\n")
    monkeypatch.setenv(INCLUDE_PATH_ENV, str(tmp_path))
    with pytest.raises(CardError, match=r"word_math.jsonl line 3: not JSON"):
        load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
    monkeypatch.delenv(INCLUDE_PATH_ENV)
    assert load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json").family == "calc_chain"
