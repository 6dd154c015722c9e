"""Training rows: mixing by weight, determinism, data files, and no hidden items."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agent_trainer.evaluation.families import FAMILIES
from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.inner_loop.train.data import DataFileError, build_rows, library_rows, read_data_file
from agent_trainer.inner_loop.spec.jobspec import JobSpec


def spec(sources, file=None, seed=0) -> JobSpec:
    return JobSpec.model_validate({"base_model": "tiny-s", "algorithm": "sft", "seed": seed,
                                   "data": {"sources": sources, "file": file}})


def test_single_source_gives_its_items():
    rows = build_rows(spec([{"family": "calc_chain", "seed": 3, "size": 50}]), ".")
    assert len(rows) == 50
    assert all(set(r) == {"prompt", "answer", "family"} and r["family"] == "calc_chain" for r in rows)
    assert all(r["prompt"].startswith("calc: ") for r in rows)


def test_mix_follows_weights_and_total_size():
    s = spec([{"family": "calc_chain", "seed": 1, "size": 100, "weight": 3},
              {"family": "reverse_text", "seed": 1, "size": 100, "weight": 1}])
    counts = Counter(r["family"] for r in build_rows(s, "."))
    assert counts == {"calc_chain": 150, "reverse_text": 50}


def test_small_pool_with_large_weight_is_repeated():
    s = spec([{"family": "count_char", "seed": 1, "size": 10, "weight": 1},
              {"family": "sort_numbers", "seed": 1, "size": 90, "weight": 1}])
    rows = library_rows(s)
    count_rows = [r["prompt"] for r in rows if r["family"] == "count_char"]
    assert len(count_rows) == 50
    pool = [e.prompt for e in FAMILIES["count_char"]().training_examples(seed=1, n=10)]
    assert set(count_rows) == set(pool)


def test_rows_are_deterministic_given_the_job_seed_and_differ_across_seeds():
    sources = [{"family": "calc_chain", "seed": 1, "size": 40, "weight": 1},
               {"family": "unit_convert", "seed": 2, "size": 40, "weight": 2}]
    a, b = build_rows(spec(sources, seed=5), "."), build_rows(spec(sources, seed=5), ".")
    c = build_rows(spec(sources, seed=6), ".")
    assert a == b
    assert a != c
    assert Counter(r["family"] for r in a) == Counter(r["family"] for r in c)


def test_library_rows_never_contain_hidden_items():
    for name in FAMILIES:
        rows = build_rows(spec([{"family": name, "seed": 0, "size": 2000}]), ".")
        assert not any(FAMILIES[name]().in_hidden(r["prompt"]) for r in rows), name
        hidden = {e.prompt for e in hidden_set(name, 200)}
        assert hidden.isdisjoint(r["prompt"] for r in rows), name


def test_file_rows_are_added_with_default_family_and_extra_columns(tmp_path):
    (tmp_path / "data.jsonl").write_text(
        json.dumps({"prompt": "calc: 1+1=", "answer": "2", "difficulty": 1}) + "\n\n"
        + json.dumps({"prompt": "reverse: ab =", "answer": "ba", "family": "reverse_text"}) + "\n")
    rows = build_rows(spec([{"family": "calc_chain", "seed": 1, "size": 3}], file="data.jsonl"), tmp_path,
                      default_family="calc_chain")
    assert len(rows) == 5
    assert all(set(r) == {"prompt", "answer", "family", "difficulty"} for r in rows)
    by_prompt = {r["prompt"]: r for r in rows}
    assert by_prompt["calc: 1+1="]["family"] == "calc_chain" and by_prompt["calc: 1+1="]["difficulty"] == 1
    assert by_prompt["reverse: ab ="]["family"] == "reverse_text"


@pytest.mark.parametrize("text, fragment", [
    ('{"prompt": "a", "answer": "b"}\n{"prompt": "a", \n', "line 2: not valid JSON"),
    ('{"prompt": "a"}\n', "line 1: missing key 'answer'"),
    ('{"prompt": "a", "answer": 5}\n', "line 1: 'answer' must be a string"),
    ('["a", "b"]\n', "line 1: expected a JSON object"),
    ('{"prompt": " ", "answer": "b"}\n', "line 1: 'prompt' is empty"),
    ('{"prompt": "a", "answer": "b", "family": "chess"}\n', "unknown family 'chess'"),
    ('{"prompt": "a", "answer": "b", "meta": {"x": 1}}\n', "column 'meta' must be"),
    ("\n\n", "no rows"),
])
def test_read_data_file_errors_name_the_line(tmp_path, text, fragment):
    path = tmp_path / "data.jsonl"
    path.write_text(text)
    with pytest.raises(DataFileError, match=fragment) as info:
        read_data_file(path)
    assert info.value.problems


def test_read_data_file_lists_several_bad_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(["oops"] * 8))
    with pytest.raises(DataFileError) as info:
        read_data_file(path)
    assert [n for n, _ in info.value.problems] == list(range(1, 9))
    assert "and 3 more" in str(info.value)


def test_missing_data_file(tmp_path):
    with pytest.raises(DataFileError, match="not found"):
        read_data_file(tmp_path / "nope.jsonl")
