"""Splits that keep an item's twins together (issue 54, item 3): a data card whose prompts collide after folding, and
the generated families' reorderings with the same answer.

Round 4's card held every row twice (as written and with its first letter capitalised): the split hashed the raw
prompt, 91 of 100 hidden items had a folded twin in the training pool, and the honest library-only job was flagged
(84 of 100 contained) for the card's fault. Now the card loads with its twins merged and each group keyed on its
first prompt, so an item without twins keeps its split and the honest job passes both judges. For calc_chain,
sort_numbers and count_char, 152, 168 and 197 of the 200 hidden items had a reordering in the training pool; now none
has (``GroupedFamily``).
"""

from __future__ import annotations

import json
import random
import re

import pytest

from agent_trainer.evaluation.contamination import find_overlap
from agent_trainer.evaluation.families import MAX_AGENT_SEED, get_family, in_hidden_pool
from agent_trainer.evaluation.families.data_family import canonical_prompt, load_card
from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.inner_loop.models.tokenizer import build_tokenizer
from agent_trainer.registry import INCLUDE_PATH_ENV

ROWS = 800


def _write(tmp_path, rows) -> None:
    (tmp_path / "twins.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows))
    (tmp_path / "twins.yaml").write_text("name: twins\nscorer: exact\n")


def _base_rows() -> list[tuple[str, str]]:
    return [(f"what is {i} plus {i % 7}?", str(i + i % 7)) for i in range(ROWS)]


def test_a_card_with_every_row_twice_loads_merged_and_keeps_the_split_of_items_without_twins(tmp_path):
    base = _base_rows()
    _write(tmp_path, [r for p, a in base for r in ((p, a), (p[0].upper() + p[1:], a))] + [("What  IS 1 plus 1?", "2")])
    cls = load_card(tmp_path / "twins.yaml")
    assert len(cls.rows) == ROWS and cls.merged_twins == ROWS + 1
    fam = cls()
    assert [r.prompt for r in cls.rows] == [p for p, _ in base], "each group keeps its first row"
    hidden = {canonical_prompt(r.prompt) for r in cls.rows if fam.in_hidden(r.prompt)}
    training = {canonical_prompt(r.prompt) for r in cls.rows if not fam.in_hidden(r.prompt)}
    assert hidden and not hidden & training
    # A group keys on its lexicographically first member: here the capitalised twin ("W" < "w").
    assert all(fam.in_hidden(p) == in_hidden_pool("twins", p[0].upper() + p[1:]) for p, _ in base)

    _write(tmp_path, base)  # the same card without twins: the split of every item is its raw prompt's, as before
    plain = load_card(tmp_path / "twins.yaml")()
    assert plain.merged_twins == 0
    assert all(plain.in_hidden(p) == in_hidden_pool("twins", p) for p, _ in base)


def test_an_honest_library_only_job_is_not_flagged_for_the_cards_twins(tmp_path, monkeypatch):
    base = _base_rows()
    _write(tmp_path, [r for p, a in base for r in ((p, a), (p[0].upper() + p[1:], a))])
    monkeypatch.setenv(INCLUDE_PATH_ENV, str(tmp_path))
    fam = get_family("twins")
    n = len(hidden_set("twins", 100))
    rows = [(f"row {i}", e.prompt + e.answer) for i, e in enumerate(fam.training_examples(seed=0, n=2000))]
    r = find_overlap("twins", n, rows, tokenizer=build_tokenizer())
    assert not r.flagged, r.summary()
    # ... while the hidden items themselves, in either spelling, are.
    caps = [(f"h{i}", e.prompt[0].upper() + e.prompt[1:]) for i, e in enumerate(hidden_set("twins", n))]
    assert find_overlap("twins", n, caps, tokenizer=build_tokenizer()).hits == n


def test_the_word_math_sft_examples_library_rows_are_not_flagged(monkeypatch):
    """examples/families/word_math_sft (seed 1, 4,000 library rows): the seed-0 sample of public text missed ~13% of
    the card's training rows, and their phrases ("cal has 2 coins and gives away") counted as distinctive pieces of
    hidden items (2 items flagged); the public text of a data family is now its whole training pool."""
    from pathlib import Path

    from agent_trainer.evaluation.prompts import for_family

    monkeypatch.setenv(INCLUDE_PATH_ENV, str(Path(__file__).parents[2] / "examples" / "families"))
    rows = [(f"row {i}", e.prompt + e.answer) for i, e in enumerate(get_family("word_math").training_examples(1, 4000))]
    assert not find_overlap("word_math", 100, rows).flagged
    chat = for_family("word_math", "chat")
    assert not find_overlap("word_math", 100, rows, tokenizer=build_tokenizer(), fmt=chat).flagged


def _reordering(name: str, prompt: str, rng: random.Random) -> str:
    """``prompt`` with its operands in another order, the same answer (a twin the generator can draw)."""
    if name == "calc_chain":
        first, rest = re.fullmatch(r"calc: (\d+)(.*)=", prompt).groups()
        terms = [int(first)] + [int(op + t) for op, t in re.findall(r"([+-])(\d+)", rest)]
        while True:
            rng.shuffle(terms)
            if terms[0] >= 0:
                return f"calc: {terms[0]}" + "".join(f"{t:+d}" for t in terms[1:]) + "="
    if name == "sort_numbers":
        nums = prompt[len("sort: "):-len(" =")].split()
        return "sort: " + " ".join(rng.sample(nums, len(nums))) + " ="
    letter, text = re.fullmatch(r"count: (\w) in (\w+) =", prompt).groups()
    return f"count: {letter} in {''.join(rng.sample(text, len(text)))} ="


@pytest.mark.parametrize("name", ["calc_chain", "sort_numbers", "count_char"])
def test_no_reordering_of_a_hidden_item_is_a_training_item(name):
    fam, rng = get_family(name), random.Random(0)
    hidden = hidden_set(name, 200)
    assert len({e.prompt for e in hidden}) == 200
    twins = {_reordering(name, e.prompt, rng) for e in hidden for _ in range(20)}
    assert len(twins) > 400 and not any(fam.in_training(t) for t in twins)
    keys = {fam.split_key(e.prompt) for e in hidden}
    assert all(fam.split_key(t) in keys for t in twins)
    seeds = range(0, MAX_AGENT_SEED, MAX_AGENT_SEED // 5)
    drawn = {e.prompt for seed in seeds for e in fam.training_examples(seed, 4000)}
    assert not keys & {fam.split_key(p) for p in drawn}
    # The stream the shipped tokenizer and models were built from never holds a hidden item.
    stream = fam.pretraining_stream(0)
    assert not {e.prompt for e in hidden} & {next(stream).prompt for _ in range(20_000)}
