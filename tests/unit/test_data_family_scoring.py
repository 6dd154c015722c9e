"""A data family's scoring: ``contains`` reads whole words and a hedge over a closed set scores 0; a card whose own
answers cannot score, or whose values are of the wrong kind, is refused when it loads.

An agent is paid for its trained model's hidden score, so a scorer that a model can satisfy without knowing the
answer is a reward: a model trained to write every label on one line ("yes no", "yesno") would have scored 1.0 on
every item of a classification family scored by ``contains``, and one writing "0123456789" every one-digit answer.
"""

from __future__ import annotations

import json

import pytest

from agent_trainer.evaluation.families.base import CardError, in_hidden_pool
from agent_trainer.evaluation.families.data_family import CLOSED_SET_MAX, contains_match, load_card


def card(tmp_path, rows, scorer="contains", **keys):
    (tmp_path / "fam.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows))
    lines = ["name: fam", f"scorer: {scorer}", *(f"{k}: {json.dumps(v)}" for k, v in keys.items())]
    (tmp_path / "fam.yaml").write_text("\n".join(lines) + "\n")
    return load_card(tmp_path / "fam.yaml")()


@pytest.mark.parametrize("completion, answer, score", [
    ("Paris", "paris", 1.0), ("It is Paris, of course.", "paris", 1.0), ("  New   York \nLondon", "new york", 1.0),
    ("x = 5.", "5", 1.0), ("15", "5", 0.0), ("I know", "no", 0.0), ("yesno", "no", 0.0), ("Parisian", "paris", 0.0),
    ("", "paris", 0.0), ("Paris? No: Lyon\nParis", "lyon", 1.0),
])
def test_the_answer_counts_as_whole_words_of_the_first_line(completion, answer, score):
    assert contains_match(completion, answer) == score


def test_a_line_naming_several_labels_is_a_hedge_and_scores_zero(tmp_path):
    rows = [(f"ticket {i}", ["refund", "bug", "other"][i % 3]) for i in range(60)]
    fam = card(tmp_path, rows, labels=["refund", "bug", "other"])
    assert fam.closed_answers() == ("bug", "other", "refund")
    for ex in fam.training_examples(seed=0, n=20):
        assert fam.score_one(f"{ex.answer}.", ex.answer) == 1.0
        assert fam.score_one(f"The label is {ex.answer.upper()}", ex.answer) == 1.0
        for hedge in ("refund bug other", "refund/bug/other", "bug or refund or other", "other, refund, bug"):
            assert fam.score_one(hedge, ex.answer) == 0.0, hedge


def test_distinct_answers_up_to_the_cap_are_a_closed_set_and_an_answer_may_hold_another(tmp_path):
    answers = ["york", "new york", "paris"]
    fam = card(tmp_path, [(f"q {i}", answers[i % 3]) for i in range(30)])
    assert fam.closed_answers() == ("new york", "paris", "york")
    assert fam.score_one("New York", "new york") == 1.0        # "york" lies inside the answer
    assert fam.score_one("New York", "york") == 0.0            # the model named another answer
    assert fam.score_one("paris or york", "york") == 0.0


def test_an_open_set_of_answers_keeps_verbose_answers(tmp_path):
    rows = [(f"capital {i}?", f"city{i}") for i in range(CLOSED_SET_MAX + 1)]
    fam = card(tmp_path, rows)
    assert fam.closed_answers() == ()
    assert fam.score_one("city3 is the capital, not city4", "city3") == 1.0


def test_the_closed_set_comes_from_every_row_hidden_pool_included(tmp_path):
    """The set is the family's, not the training pool's: an answer found only in hidden rows is still a rival."""
    prompts = [f"item {i}" for i in range(400)]
    hidden = [p for p in prompts if in_hidden_pool("fam", p)]
    rows = [(p, "c" if p in hidden else "ab"[i % 2]) for i, p in enumerate(prompts)]
    fam = card(tmp_path, rows)
    assert {ex.answer for ex in fam.training_examples(seed=0, n=200)} == {"a", "b"}
    assert fam.closed_answers() == ("a", "b", "c")
    assert fam.score_one("a c", "a") == 0.0


@pytest.mark.parametrize("scorer, answer, labels, says", [
    ("numeric", "1,000", None, r"line 3: the answer '1,000' is not a number .*or use scorer: exact"),
    ("numeric", "$5", None, "is not a number"),
    ("label", "tech support", None, "is not one word"),
    ("label", "shipping", ["refund", "bug"], r"is not one of the labels \['refund', 'bug'\]"),
    ("exact", "two\nlines", None, "spans lines"),
    ("contains", "  ", None, "is empty"),
    ("regex", "", None, "is empty"),
])
def test_a_card_whose_own_answers_cannot_score_is_refused_with_the_line(tmp_path, scorer, answer, labels, says):
    """A row no model could score (its reference answer scores 0 as its own completion) is a data error, found
    when the card loads: a numeric family with "1,000" had a baseline of 0 on that row whatever the model said."""
    rows = [("p1", "1"), ("p2", "1"), ("p3", answer), ("p4", "2")]
    keys = {"labels": labels} if labels else {}
    if scorer == "regex":
        keys["answer_regex"] = r"(\d+)"
    with pytest.raises(CardError, match=says):
        card(tmp_path, rows, **keys, scorer=scorer)


@pytest.mark.parametrize("key, value, says", [
    ("held_out", "false", "held_out must be true or false"), ("version", "2", "version must be a whole number"),
    ("max_new_tokens", 0, "max_new_tokens must be a whole number"), ("labels", "yes", "labels must be a list"),
])
def test_card_values_of_the_wrong_kind_are_refused_not_read_as_something_else(tmp_path, key, value, says):
    """``held_out: "false"`` had been read as true (a held-out family never trained), ``labels: yes`` as the labels
    y, e, s; a version "2" raised a traceback."""
    with pytest.raises(CardError, match=says):
        card(tmp_path, [("p1", "1"), ("p2", "2")], **{key: value})


def test_a_family_whose_answers_cannot_fit_its_max_new_tokens_stops_before_anything_scores(tmp_path, monkeypatch):
    """A card's ``max_new_tokens`` too small for its own answers in a model's tokens made every score 0 (seen: a
    sentiment card with 4 tokens, 'negative' is 6 of tiny-s's): the hidden evaluation refuses it, naming the fix."""
    from transformers import AutoTokenizer

    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import EvalError, answer_room_problem, hidden_set, score_examples
    from agent_trainer.inner_loop.models import resolve_model
    from agent_trainer.registry import INCLUDE_PATH_ENV

    rows = [(f"The day {i} was {'good' if i % 2 else 'bad'}.", "negative" if i % 2 == 0 else "positive")
            for i in range(400)]
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("tiny-s", build_missing=False)))
    for tokens, fits in ((4, False), (8, True)):
        folder = tmp_path / str(tokens)
        folder.mkdir()
        card(folder, rows, scorer="label", max_new_tokens=tokens)
        monkeypatch.setenv(INCLUDE_PATH_ENV, str(folder))   # the registry loads the cards of a new include path
        problem = answer_room_problem(tokenizer, get_family("fam"), hidden_set("fam", 20))
        if fits:
            assert problem is None
        else:
            assert "'negative' takes 6 tokens" in problem and "set max_new_tokens: 6 or more" in problem
            with pytest.raises(EvalError, match="set max_new_tokens: 6"):   # before any model generates
                score_examples(None, tokenizer, get_family("fam"), hidden_set("fam", 20))


def test_every_built_in_family_leaves_room_for_its_answers():
    from transformers import AutoTokenizer

    from agent_trainer.evaluation.families import BUILT_IN, get_family
    from agent_trainer.evaluation.hidden_eval import answer_room_problem, hidden_set
    from agent_trainer.inner_loop.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("tiny-s", build_missing=False)))
    for name in sorted(BUILT_IN):
        assert answer_room_problem(tokenizer, get_family(name), hidden_set(name, 200)) is None, name
